"""The autoregressive draft head on the target's features (``sampler.drafters.eagle``) on tiny
random Llamas: MPFR with it emits exactly BASIC-UWM's tokens (MPFR paper Prop. 4.4, stopping-time
drafter invariance) for untrained and random heads, several B and L, warm processing, on
transformers and on the static target; batched equals solo; a level's laws are the head's
chain along each node's own path; files round-trip and refuse another target or a backend
without hidden states."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from keyed import KeyedSource, Secret
from sampler.batch import generate_many
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import default_drafter, fresh_drafter, make_drafter
from sampler.drafters.eagle import (
    SHIPPED_EAGLE,
    EagleDrafter,
    EagleHead,
    new_eagle,
    prime_eagle,
)
from sampler.drafters.heads import target_fingerprint, trained_dir
from sampler.processing import Processing
from sampler.targets.base import Target
from sampler.targets.static import ATTENTION_BLOCK, StaticLlama
from sampler.targets.transformers import as_target
from sampler.training.eagle_distill import narrowed
from sampler.training.rollouts import split_of
from sampler.tree import DraftTree
from tests.sampler.conftest import VOCAB, tiny_llama


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret((300 + i).to_bytes(32, "little")), 4, True, i)


def _random_eagle(target, seed: int) -> EagleHead:
    head = new_eagle(target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return head.eval()


def _prompt(i: int) -> list[int]:
    return [(7 * i + 2 * j + 1) % VOCAB for j in range(1 + i % 5)]  # includes 1-token prompts


CONFIGS = [
    pytest.param(1, 4, Processing(), id="B1_L4"),
    pytest.param(4, 2, Processing(), id="B4_L2"),
    pytest.param(4, 4, Processing(), id="B4_L4"),
    pytest.param(8, 6, Processing(), id="B8_L6"),
    pytest.param(4, 3, Processing(0.7, 8, 0.9), id="B4_L3_T07_top8_p09"),
    pytest.param(6, 4, Processing(1.3, 0, 1.0), id="B6_L4_T13"),
]


@pytest.mark.parametrize("init", ["untrained", "random"])
@pytest.mark.parametrize(("drafts", "lookahead", "processing"), CONFIGS)
def test_mpfr_with_eagle_is_basic_uwm(target, init, drafts, lookahead, processing):
    """Prop. 4.4: mpfr with the eagle head == basic-uwm, 8 prompts per config, and its drafts
    are accepted (the comparison is not vacuous)."""
    head = new_eagle(target).eval() if init == "untrained" else _random_eagle(target, 0)
    accepted, mismatches = 0, []
    for i in range(8):
        ref_config = SamplerConfig("basic-uwm", max_new_tokens=20, processing=processing)
        ref = generate(target, _prompt(i), ref_config, _source(i))
        config = SamplerConfig("mpfr", drafts, lookahead, 20, processing)
        drafter = EagleDrafter(head, target, "eagle:test")
        out = generate(target, _prompt(i), config, _source(i), drafter)
        accepted += sum(out.stats.accepted_per_level)
        if out.token_ids != ref.token_ids:
            mismatches.append(i)
    assert mismatches == []
    assert accepted > 0


def test_batched_eagle_equals_solo(target):
    """generate_many over 6 requests (different B, L, processing, lengths) == each alone."""
    head = _random_eagle(target, 1)
    proto = EagleDrafter(head, target, "eagle:test")
    configs = [SamplerConfig("mpfr", b, lookahead, 18) for b, lookahead in [(4, 4), (2, 3)]]
    configs.append(SamplerConfig("mpfr", 8, 2, 12, Processing(0.7, 8, 1.0)))
    requests = [(_prompt(i), configs[i % 3], _source(i)) for i in range(6)]
    solo = [generate(target, p, c, s, fresh_drafter(proto)) for p, c, s in requests]
    batched = generate_many(
        target, [(p, c, s, fresh_drafter(proto)) for p, c, s in requests], max_batch=4
    )
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    assert sum(sum(r.stats.accepted_per_level) for r in batched) > 0


def test_mpfr_with_eagle_on_the_static_target():
    """The static target (float32 rows, bit-invariant) hands the head its own hidden states;
    mpfr with the head == basic-uwm on it."""
    static = StaticLlama(
        tiny_llama(0, layers=3), weights=torch.float32, group_slots=2, rows=4,
        capacity=2 * ATTENTION_BLOCK, slots=4,
    )  # fmt: skip
    head = _random_eagle(static.model, 2)
    accepted = 0
    for i, (b, lookahead) in enumerate([(4, 3), (2, 4), (8, 2)]):
        ref = generate(static, _prompt(i + 1), SamplerConfig("basic-uwm", max_new_tokens=16),
                       _source(i))  # fmt: skip
        drafter = EagleDrafter(head, static, "eagle:test")
        out = generate(static, _prompt(i + 1), SamplerConfig("mpfr", b, lookahead, 16),
                       _source(i), drafter)  # fmt: skip
        accepted += sum(out.stats.accepted_per_level)
        assert out.token_ids == ref.token_ids
    assert accepted > 0


def test_propose_gives_each_node_its_own_paths_law(target):
    """Level s of a hand-built tree: (n, V) float64 logits, row i equal to the head run along
    node i's own path one context at a time (the per-node states and path caches are kept
    and gathered right); −inf rows before any hidden state."""
    head = _random_eagle(target, 3)
    drafter = EagleDrafter(head, target, "eagle:test")
    tree = DraftTree(11, 4)
    committed = [5, 9, 11]
    assert torch.isneginf(drafter.propose(tree, 1, committed)).all()
    hidden = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    drafter.see_target_hidden(hidden)
    levels = [drafter.propose(tree, 1, committed)]
    tree.add_drafts(0, [3, 7, 7])
    levels.append(drafter.propose(tree, 2, committed))
    tree.add_drafts(1, [20])
    tree.add_drafts(2, [4, 5])
    levels.append(drafter.propose(tree, 3, committed))
    for level, logits in enumerate(levels, 1):
        nodes = tree.levels[level - 1]
        assert logits.shape == (len(nodes), VOCAB) and logits.dtype == torch.float64
        for row, node in enumerate(nodes):
            path = [11, *tree.path_tokens(node)]
            state, past = hidden[None], None
            with torch.inference_mode():
                for token in path:
                    embedding = target.get_input_embeddings()(torch.tensor([token]))
                    state, past = head.advance(state, embedding, past)
                want = head.logits(target, state)[0]
            torch.testing.assert_close(logits[row], want, atol=1e-12, rtol=0)
    assert drafter.calls == 4
    assert not torch.allclose(levels[2][0], levels[2][1])  # siblings' paths differ


def test_untrained_eagle_drafts_the_targets_previous_law(target):
    """W_in = [I, 0] and zero output projections: the untrained head's level-1 law is the
    target's norm and head applied to rms(h) (module docstring)."""
    head = new_eagle(target).eval()
    hidden = torch.randn((3, 32), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        state, _ = head.advance(hidden, target.get_input_embeddings()(torch.arange(3)), None)
        got = head.logits(target, state)
        rms = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)
        want = target.lm_head(target.model.norm(rms))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_eagle_files_round_trip_and_refuse_another_target(target, tmp_path: Path):
    head = _random_eagle(target, 4)
    head.save(tmp_path / "e", dtype=torch.float64)
    drafter = make_drafter(f"eagle:{tmp_path / 'e'}", target)
    assert isinstance(drafter, EagleDrafter) and drafter.name == f"eagle:{tmp_path / 'e'}"
    for a, b in zip(head.state_dict().values(), drafter.head.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="trained for target"):
        make_drafter(f"eagle:{tmp_path / 'e'}", tiny_llama(5, layers=3))
    with pytest.raises(ValueError, match=r"eagle\.json"):
        make_drafter(f"eagle:{tmp_path / 'missing'}", target)


class _NoHidden(Target):
    def __init__(self, model) -> None:
        self.model = model
        self.vocab_size = VOCAB
        self.gives_hidden = False

    def backend(self) -> str:
        return "no-hidden"


@pytest.mark.parametrize("spec", ["eagle", "heads"])
def test_feature_drafters_refuse_a_backend_without_hidden_states(target, spec):
    with pytest.raises(ValueError, match="gives none"):
        make_drafter(spec, _NoHidden(target))
    assert as_target(target).gives_hidden


def test_eagle_with_a_one_token_prompt_drafts_nothing_first(target):
    """No hidden state before the first step of a one-token prompt: that step drafts nothing
    (−inf laws), later steps draft; the output is still basic-uwm's."""
    drafter = EagleDrafter(_random_eagle(target, 5), target, "eagle:test")
    config = SamplerConfig("mpfr", 2, 3, 12)
    out = generate(target, [17], config, _source(9), drafter)
    ref = generate(target, [17], SamplerConfig("basic-uwm", max_new_tokens=12), _source(9))
    assert out.token_ids == ref.token_ids
    assert out.stats.drafted_per_level[0] > 0


def test_prime_eagle_batches_a_level_as_each_drafter_alone(target):
    """Three requests' level 1 and level 2 in one head call each: every drafter's laws equal
    those its own ``propose`` computes alone (float64, 1e-12); ``propose`` then returns them
    without another head call."""
    head = _random_eagle(target, 6)
    g = torch.Generator().manual_seed(4)
    hiddens = [torch.randn(32, dtype=torch.float64, generator=g) for _ in range(3)]
    roots, children = [11, 2, 40], [[3, 7], [9], [1, 5, 6]]

    def grown(i: int) -> DraftTree:
        tree = DraftTree(roots[i], 4)
        tree.add_drafts(0, children[i])
        return tree

    alone, batched = [], []
    for i in range(3):
        drafter = EagleDrafter(head, target, "eagle:test")
        drafter.see_target_hidden(hiddens[i])
        tree = grown(i)
        alone.append((drafter.propose(tree, 1, [roots[i]]), drafter.propose(tree, 2, [roots[i]])))
    drafters = [EagleDrafter(head, target, "eagle:test") for _ in range(3)]
    for drafter, hidden in zip(drafters, hiddens, strict=True):
        drafter.see_target_hidden(hidden)
    trees = [grown(i) for i in range(3)]
    for level in (1, 2):
        prime_eagle(drafters, trees, level)
        assert all(d._primed is not None for d in drafters)
        batched.append(
            [d.propose(t, level, [r]) for d, t, r in zip(drafters, trees, roots, strict=True)]
        )
        assert all(d._primed is None for d in drafters)
    for i in range(3):
        for level in (0, 1):
            torch.testing.assert_close(batched[level][i], alone[i][level], atol=1e-12, rtol=0)


def test_a_draft_vocabulary_drafts_only_its_tokens_and_stays_exact(target, tmp_path: Path):
    """A head with a draft vocabulary of half the tokens: −inf outside it, its columns equal
    to the LM head's rows for those tokens; mpfr with it emits basic-uwm's tokens; its token
    ids are stored as int64 (float16 would round ids above 2048)."""
    tokens = torch.arange(0, VOCAB, 2)
    head = new_eagle(target, "test", tokens)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    head.eval()
    state = torch.randn((3, 32), generator=g, dtype=torch.float64)
    with torch.no_grad():
        logits = head.logits(target, state)
        want = target.lm_head(target.model.norm(state))[:, tokens]
    assert bool(torch.isinf(logits[:, 1::2]).all())
    torch.testing.assert_close(logits[:, tokens], want)
    head.save(tmp_path / "e")
    assert load_file(str(tmp_path / "e" / "eagle.safetensors"))["draft_tokens"].dtype == torch.int64
    loaded = EagleHead.load(tmp_path / "e", target)
    assert loaded.draft_tokens is not None and torch.equal(loaded.draft_tokens, tokens)
    drafted = 0
    for i in range(4):
        ref = generate(target, _prompt(i + 2), SamplerConfig("basic-uwm", max_new_tokens=16),
                       _source(i))  # fmt: skip
        drafter = EagleDrafter(loaded, target, "eagle:test")
        out = generate(target, _prompt(i + 2), SamplerConfig("mpfr", 4, 3, 16), _source(i),
                       drafter)  # fmt: skip
        assert out.token_ids == ref.token_ids
        drafted += sum(out.stats.drafted_per_level)
    assert drafted > 0


def test_a_draft_vocabulary_must_be_distinct_ids_of_the_vocabulary(target):
    for bad in (torch.tensor([1, 1, 2]), torch.tensor([0, VOCAB])):
        with pytest.raises(ValueError, match="distinct token ids"):
            new_eagle(target, "test", bad)
    with pytest.raises(ValueError, match="fewer than the"):
        new_eagle(target, "test", torch.arange(VOCAB).flip(0))
    unsorted = new_eagle(target, "test", torch.tensor([9, 3, 5]))
    assert unsorted.draft_tokens is not None
    assert unsorted.draft_tokens.tolist() == [3, 5, 9]


@pytest.mark.parametrize("start", [None, "half"], ids=["whole", "draft_vocab"])
def test_a_narrowed_head_drafts_the_heads_law_on_its_subset_and_stays_exact(
    target, tmp_path: Path, start
):
    """``narrowed``: the same weights, the draft vocabulary cut to a subset of the head's own;
    its law is the head's conditioned on the subset (equal log-probabilities up to one
    normaliser per row, −inf elsewhere); it round-trips through its files with the new size;
    mpfr with it emits basic-uwm's tokens. Ids outside the head's draft vocabulary, repeats,
    none or all of them are refused."""
    own = None if start is None else torch.arange(0, VOCAB, 2)
    head = new_eagle(target, "test", own)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in head.parameters():
            if p.is_floating_point():
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    head.eval()
    pool = torch.arange(VOCAB) if own is None else own
    subset = pool[torch.randperm(pool.numel(), generator=g)[: pool.numel() // 3]]
    small = narrowed(head, subset)
    assert small.config.draft_vocab == subset.numel()
    assert small.draft_tokens is not None
    assert torch.equal(small.draft_tokens, subset.sort().values)
    state = torch.randn((3, 32), generator=g, dtype=torch.float64)
    with torch.no_grad():
        full = torch.log_softmax(head.logits(target, state), -1)
        part = torch.log_softmax(small.logits(target, state), -1)
    kept = small.draft_tokens
    shift = part[:, kept] - full[:, kept]  # one normaliser per row
    torch.testing.assert_close(shift, shift[:, :1].expand_as(shift))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[kept] = False
    assert bool(torch.isinf(part[:, outside]).all())
    small.save(tmp_path / "n", dtype=torch.float64)
    loaded = EagleHead.load(tmp_path / "n", target)
    assert loaded.config.draft_vocab == subset.numel()
    for i in range(3):
        ref = generate(target, _prompt(i + 2), SamplerConfig("basic-uwm", max_new_tokens=16),
                       _source(i))  # fmt: skip
        out = generate(target, _prompt(i + 2), SamplerConfig("mpfr", 4, 3, 16), _source(i),
                       EagleDrafter(loaded, target, "eagle:narrowed"))  # fmt: skip
        assert out.token_ids == ref.token_ids
    outsider = 1 if own is not None else VOCAB
    for bad in (torch.tensor([kept[0], kept[0]]), torch.tensor([outsider]), kept[:0], pool):
        with pytest.raises(ValueError, match="narrowed"):
            narrowed(head, bad)


def test_the_default_drafter_is_ngram_where_the_shipped_head_does_not_fit(target):
    assert default_drafter(target).name == "ngram"


def test_a_head_trained_in_the_data_dir_is_found_by_the_targets_fingerprint(target, tmp_path):
    """``eagle`` without a path: the head in ``<data dir>/drafters/<fingerprint>/eagle`` where
    there is one, else the shipped head (refused here: another target); a head for another
    target put in its place is refused by the fingerprint check, naming both."""
    with pytest.raises(ValueError, match="trained for target"):
        make_drafter("eagle", target, tmp_path)
    assert default_drafter(target, tmp_path).name == "ngram"
    directory = trained_dir(tmp_path, target, "eagle")
    assert (
        directory == tmp_path / "drafters" / target_fingerprint(target).replace(":", "-") / "eagle"
    )
    head = _random_eagle(target, 6)
    head.save(directory, dtype=torch.float64)
    found = make_drafter("eagle", target, tmp_path)
    assert isinstance(found, EagleDrafter) and found.name == "eagle"
    for a, b in zip(head.state_dict().values(), found.head.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert default_drafter(target, tmp_path).name == "eagle"
    with pytest.raises(ValueError, match="trained for target"):
        make_drafter("eagle", target)  # no data dir: the shipped head
    for name in ("eagle.json", "eagle.safetensors"):
        shutil.copy(SHIPPED_EAGLE / name, directory / name)
    shipped_for = json.loads((SHIPPED_EAGLE / "eagle.json").read_text())["target"]
    with pytest.raises(ValueError, match=f"trained for target {shipped_for}, this target is"):
        make_drafter("eagle", target, tmp_path)


def test_the_shipped_head_carries_its_provenance():
    """The shipped eagle head (package data, at most 20 MB) says what it was trained on (train-
    split prompts only, rollouts at T = 1 and T = 0.7), how (objective, stages, steps) and at
    which commit; its draft vocabulary is stored whole."""
    names = {p.name for p in SHIPPED_EAGLE.iterdir()}
    assert {"eagle.json", "eagle.safetensors", "provenance.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in SHIPPED_EAGLE.iterdir()) <= 20 * 2**20
    provenance = json.loads((SHIPPED_EAGLE / "provenance.json").read_text())
    config = json.loads((SHIPPED_EAGLE / "eagle.json").read_text())
    assert provenance["objective"] == config["objective"]
    assert provenance["training"][0]["objective"] == "ce"
    assert all(stage["steps"] > 0 for stage in provenance["training"])
    assert len(provenance["commit"]) == 40 and provenance["dirty_tree"] is False
    data = provenance["data"]
    assert data["temperatures"] == [0.7, 1.0] and data["rollouts"] > 1000
    assert data["train_prompt_ids"]
    assert all(split_of(i) == "train" for i in data["train_prompt_ids"])
    assert all(split_of(i) == "train" for i in data["validation_prompt_ids"])
    tokens = load_file(str(SHIPPED_EAGLE / "eagle.safetensors"))["draft_tokens"]
    assert config["draft_vocab"] == tokens.numel() == data["draft_vocabulary"]["size"]
