"""The MPFR decoder on float64 tiny random Llamas (docs/design.md §3; MPFR paper Alg. 10, Prop. 4.4,
Thm. A.6): exact drafter invariance, the target law, tree verification, KV bookkeeping (C11)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import (
    FixedTokenDrafter,
    ModelDrafter,
    NgramDrafter,
    draft_law,
    self_drafter,
)
from sampler.policies import History, KeyedRace
from sampler.processing import Processing, dense_logp, process
from sampler.targets.transformers import CachedLM
from sampler.tree import DraftTree
from tests.sampler.conftest import VOCAB, first_two_token_law, tiny_llama


def source(i: int, nonce: int = 0, width: int = 4) -> KeyedSource:
    return KeyedSource(Secret(i.to_bytes(32, "little")), width, True, nonce)


PROMPTS = [[(7 * i + 3 * j) % VOCAB for j in range(2 + i % 5)] for i in range(20)]


def drafters(target, other):
    return {
        "other_model": lambda: ModelDrafter(other, VOCAB, "other"),
        "self1": lambda: self_drafter(target, 1),
        "fixed": lambda: FixedTokenDrafter(VOCAB, 5),
    }


def test_drafter_invariance_exact(target, other_drafter_model):
    """Prop. 4.4 (stopping-time drafter invariance): mpfr output == basic-uwm output, token for
    token, for 20 (prompt, key) pairs x B in {1,2,4,8} x L in {1,2,4} x three drafters."""
    makers = drafters(target, other_drafter_model)
    mismatches = []
    accepted_any = 0
    for i, prompt in enumerate(PROMPTS):
        src = source(i, nonce=i)
        ref = generate(target, prompt, SamplerConfig("basic-uwm", max_new_tokens=12), src)
        for (name, make), b, lookahead in itertools.product(
            makers.items(), [1, 2, 4, 8], [1, 2, 4]
        ):
            out = generate(target, prompt, SamplerConfig("mpfr", b, lookahead, 12), src, make())
            accepted_any += sum(out.stats.accepted_per_level)
            if out.token_ids != ref.token_ids:
                mismatches.append((i, name, b, lookahead))
    assert mismatches == []
    assert accepted_any > 0  # speculation actually happened, or the test would be vacuous


def test_drafter_equal_to_target_accepts_everything(target):
    """C11: drafter = target weights -> acceptance >= 99 % at every level."""
    for lookahead in [1, 2, 4]:
        accepted = drafted = 0
        for i in range(5):
            out = generate(
                target,
                PROMPTS[i],
                SamplerConfig("mpfr", 4, lookahead, 24),
                source(i),
                ModelDrafter(target, VOCAB, "self"),
            )
            accepted += sum(out.stats.accepted_per_level)
            drafted += sum(out.stats.drafted_per_level)
        assert drafted > 0
        assert accepted / drafted >= 0.99, (lookahead, accepted, drafted)


def test_fixed_token_and_ngram_drafters_keep_output(target):
    """C11 second half: a drafter that always proposes one token changes nothing."""
    for i in range(5):
        src = source(100 + i)
        ref = generate(target, PROMPTS[i], SamplerConfig("basic-uwm", max_new_tokens=30), src)
        for drafter in (FixedTokenDrafter(VOCAB, ref.token_ids[3]), NgramDrafter(VOCAB)):
            out = generate(target, PROMPTS[i], SamplerConfig("mpfr", 4, 3, 30), src, drafter)
            assert out.token_ids == ref.token_ids


def test_decoder_law_of_first_two_tokens():
    """Thm. A.6: the first two emitted tokens of mpfr (B = 4, L = 2, self:1 drafter) over 10,000
    keys follow the enumerated target law P(y1) P(y2 | y1). Chi-square at α = 0.001 (fixed keys:
    deterministic; a correct decoder fails with probability 0.1 %)."""
    processing = Processing(1.0, 6, 1.0)  # 36 outcomes: enough keys per cell for chi-square
    target = tiny_llama(3, layers=2)  # two layers keep 10,000 generations near a minute
    prompt = [3, 14, 15, 9, 26]
    law = first_two_token_law(target, prompt, processing)
    drafter = self_drafter(target, 1)
    config = SamplerConfig("mpfr", 4, 2, 2, processing)
    counts = dict.fromkeys(law, 0)
    for i in range(10_000):
        out = generate(target, prompt, config, source(10_000 + i), drafter)
        counts[out.token_ids] += 1  # KeyError = an impossible pair was emitted
    cells = list(law)
    observed = np.array([counts[c] for c in cells])
    expected = np.array([law[c] for c in cells]) * observed.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_tree_attention_matches_path_by_path():
    """Tree verification: one tree forward (4D mask, position ids = prefix + depth) gives the
    same logits as causal forwards of every root-to-node path (float32, max abs diff <= 1e-5)."""
    model = tiny_llama(7, layers=2, dtype=torch.float32)
    prefix = [4, 8, 15, 16, 23]
    #        root  a   b   a.c  a.d  b.e  a.c.f
    tokens = [42, 1, 2, 3, 4, 5, 6]
    parents = [-1, 0, 0, 1, 1, 2, 3]
    depths = [0, 1, 1, 2, 2, 2, 3]
    n = len(tokens)
    anc = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        if parents[i] >= 0:
            anc[i] = anc[parents[i]]
        anc[i, i] = True
    lm = CachedLM(model)
    lm.extend(prefix)
    visible = torch.cat([torch.ones((n, len(prefix)), dtype=torch.bool), anc], dim=1)
    tree_logits = lm.forward(tokens, depths, visible, len(prefix))
    for i in range(n):
        path = [tokens[j] for j in range(n) if anc[i, j]]
        ref = CachedLM(model).extend(prefix + path)[-1]
        assert (tree_logits[i] - ref).abs().max().item() <= 1e-5, i


def test_kv_cache_after_steps_equals_fresh_forward(target):
    """After speculative steps the cache holds exactly committed[:-1]: the next logits equal a
    fresh causal forward (guards KV rollback bookkeeping, case C11)."""
    src = source(5)
    out = generate(
        target, PROMPTS[3], SamplerConfig("mpfr", 4, 4, 20), src, self_drafter(target, 1)
    )
    ref = generate(target, PROMPTS[3], SamplerConfig("basic-uwm", max_new_tokens=20), src)
    assert out.token_ids == ref.token_ids
    assert out.stats.target_forward_passes < ref.stats.target_forward_passes


def test_stats_count_one_target_call_per_step_and_one_drafter_call_per_level(target):
    out = generate(
        target,
        PROMPTS[2],
        SamplerConfig("mpfr", 2, 3, 25),
        source(9),
        ModelDrafter(target, VOCAB, "same"),
    )
    s = out.stats
    assert s.emitted_tokens == len(out.token_ids) == 25
    # drafter = target: every level accepted, so each step but the last emits L + 1 = 4 tokens
    assert s.target_forward_passes == 7  # ceil(25 / 4)
    assert s.drafter_calls == sum(s.drafted_per_level) == 6 * 3 + 1  # last step: budget 1
    assert s.aatps == pytest.approx(25 / 7)


def test_step_seconds_split_the_decoding_time(target):
    """Drafting, forwards and the walk each took time in an mpfr generation and sum to no
    more than its decoding seconds; basic-uwm drafts nothing."""
    drafter = ModelDrafter(target, VOCAB, "same")
    for method, drafts in (("mpfr", 2), ("basic-uwm", 1)):
        out = generate(target, PROMPTS[1], SamplerConfig(method, drafts, 3, 12), source(3), drafter)
        part = out.stats.step_seconds
        assert part.forward > 0 and part.walk > 0
        assert (part.draft > 0) == (method == "mpfr")
        assert part.draft + part.forward + part.walk <= out.stats.seconds


def test_eos_stops_and_is_not_returned(target):
    src = source(11)
    ref = generate(target, PROMPTS[1], SamplerConfig("basic-uwm", max_new_tokens=20), src)
    eos = ref.token_ids[6]
    stop_at = ref.token_ids.index(eos)
    for config, drafter in [
        (SamplerConfig("basic-uwm", max_new_tokens=20), None),
        (SamplerConfig("mpfr", 4, 4, 20), self_drafter(target, 2)),
    ]:
        out = generate(target, PROMPTS[1], config, src, drafter, eos_ids=frozenset({eos}))
        assert out.finish_reason == "eos"
        assert out.token_ids == ref.token_ids[:stop_at]


def test_prompt_is_not_returned(target):
    """C3: the completion comes back on its own."""
    out = generate(
        target, [1, 2, 3, 4, 5, 6], SamplerConfig("basic-uwm", max_new_tokens=5), source(1)
    )
    assert len(out.token_ids) == 5


def test_methods_and_flags(target):
    src = source(12)
    greedy = SamplerConfig("mpfr", 2, 2, 10, Processing(0.0, 50, 1.0))
    g1 = generate(target, PROMPTS[0], greedy, src, self_drafter(target, 1))
    g2 = generate(target, PROMPTS[0], greedy, source(13), self_drafter(target, 1))
    assert g1.token_ids == g2.token_ids  # temperature 0: the key plays no role
    assert g1.watermark_applied is False  # C5
    keyed = generate(
        target, PROMPTS[0], SamplerConfig("mpfr", 2, 2, 10), src, self_drafter(target, 1)
    )
    assert keyed.watermark_applied is True
    nowm = generate(
        target, PROMPTS[0], SamplerConfig("mpfr-nowm", 2, 2, 10), src, self_drafter(target, 1)
    )
    assert nowm.watermark_applied is False
    ar1 = generate(target, PROMPTS[0], SamplerConfig("ar", max_new_tokens=10), source(1, 5))
    ar2 = generate(target, PROMPTS[0], SamplerConfig("ar", max_new_tokens=10), source(2, 5))
    assert ar1.token_ids == ar2.token_ids and ar1.watermark_applied is False  # seeded by nonce
    pfr = generate(target, PROMPTS[0], SamplerConfig("pfr", 8, 3, 10), src, self_drafter(target, 1))
    assert pfr.token_ids == keyed.token_ids
    assert pfr.stats.drafted_per_level  # B forced to 1 but still speculative


def test_nonce_changes_only_repeated_contexts(target):
    """The nonce stream only feeds masked positions (repeated contexts and the first m, see
    test_prompt_window.py): with masking off, the nonce is irrelevant."""
    a = KeyedSource(Secret(b"\x01" * 32), 1, False, 1)
    b = KeyedSource(Secret(b"\x01" * 32), 1, False, 2)
    cfg = SamplerConfig("basic-uwm", max_new_tokens=40)
    assert generate(target, [5], cfg, a).token_ids == generate(target, [5], cfg, b).token_ids
    # with width 1 and 40 tokens from a 64-token vocab, labels repeat: the nonce matters
    am = KeyedSource(Secret(b"\x01" * 32), 1, True, 1)
    bm = KeyedSource(Secret(b"\x01" * 32), 1, True, 2)
    assert generate(target, [5], cfg, am).token_ids != generate(target, [5], cfg, bm).token_ids


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"method": "beam"}, "method"),
        ({"drafts": 0}, "drafts"),
        ({"lookahead": 0}, "lookahead"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"drafts": 65}, "drafts"),
    ],
)
def test_config_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplerConfig(**kwargs)


def test_generate_rejects_bad_input(target):
    with pytest.raises(ValueError, match="prompt"):
        generate(target, [], SamplerConfig("basic-uwm"), source(1))
    with pytest.raises(ValueError, match="prompt ids"):
        generate(target, [VOCAB], SamplerConfig("basic-uwm"), source(1))
    with pytest.raises(ValueError, match="drafter"):
        generate(target, [1], SamplerConfig("mpfr"), source(1))


def _lookup_by_slices(seq: list[int], max_ngram: int) -> int | None:
    """Prompt lookup by its definition: for n = max..1, the token after the latest earlier
    occurrence of the last n tokens."""
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start : start + n] == seq[-n:]:
                return seq[start + n]
    return None


@pytest.mark.parametrize("max_ngram", [1, 2, 3, 5])
def test_ngram_lookup_is_the_latest_longest_match(max_ngram):
    """The n-gram drafter's fast lookup proposes what the definition does, on random texts
    over small alphabets (many repeats and partial matches) of every length from 0."""
    drafter = NgramDrafter(VOCAB, max_ngram)
    generator = torch.Generator().manual_seed(max_ngram)
    proposed = 0
    for trial in range(600):
        alphabet, length = 2 + trial % 5, trial % 40
        seq = torch.randint(0, alphabet, (length,), generator=generator).tolist()
        expected = _lookup_by_slices(seq, max_ngram)
        assert drafter._lookup(seq) == expected, seq
        proposed += expected is not None
    assert proposed > 300


@pytest.mark.parametrize("processing", [Processing(1.0, 50, 1.0), Processing(0.6, 0, 0.9),
                                        Processing(0.0, 50, 1.0)])  # fmt: skip
def test_point_mass_drafters_give_the_processed_law_and_the_same_drafts(processing):
    """``draft_law`` of the n-gram and fixed-token drafters (their (n, 1) support, no
    processing) is the law ``process`` makes of their dense logits, and the keyed race draws
    the same drafts from both, at a level with a proposal and one without."""
    committed = [5, 6, 7, 5, 6, 9, 5, 6]  # "5 6" recurs: the n-gram drafter proposes 7 or 9
    tree = DraftTree(committed[-1], 3)
    tree.add_drafts(0, [7, 11])  # level 1: after "... 6 7" a match, after "... 6 11" none
    source = KeyedSource(Secret(bytes(range(32))), 2, True, 4)
    history = History(list(committed), 3, 2)
    for drafter in (NgramDrafter(VOCAB), FixedTokenDrafter(VOCAB, 3)):
        for level in (1, 2):
            fast = draft_law(drafter, tree, level, committed, processing)
            slow = process(drafter.propose(tree, level, committed), processing)
            assert torch.equal(dense_logp(fast, VOCAB), dense_logp(slow, VOCAB))
            parents = tree.level(level - 1)
            race = KeyedRace(source)
            drafts = race.drafts(tree, parents, fast, history)
            assert drafts == race.drafts(tree, parents, slow, history)
            if isinstance(drafter, NgramDrafter) and level == 2:
                assert drafts[1] == [] and drafts[0] != []  # one row without a proposal
