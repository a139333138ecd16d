"""Parallel drafter heads (docs/design.md §7; MDraft paper Alg. 1) on tiny random Llamas: the heads
drafter keeps MPFR's drafter invariance, files round-trip and refuse another target, the batched
verifier equals path-by-path forwards, training raises acceptance, and a run resumes exactly."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import make_drafter
from sampler.drafters.heads import HeadsDrafter, ParallelHeads, new_heads
from sampler.training.distill import DistillConfig, evaluate, train, verifier_laws
from sampler.training.mdraft import Objective
from sampler.training.rollouts import Rollout, hidden_states
from tests.sampler.conftest import VOCAB, tiny_llama


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret((100 + i).to_bytes(32, "little")), 4, True, i)


def _random_heads(target, lookahead: int, seed: int) -> ParallelHeads:
    heads = new_heads(target, lookahead)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return heads.eval()


def _rollouts(target, count: int, seed: int) -> list[Rollout]:
    out = []
    for i in range(count):
        prompt = [(5 * i + 3 * j + seed) % VOCAB for j in range(3 + i % 4)]
        done = generate(
            target, prompt, SamplerConfig("ar", max_new_tokens=40), _source(seed * 1000 + i)
        )
        out.append(Rollout(f"r{seed}-{i}", len(prompt), tuple(prompt + list(done.token_ids))))
    return out


def test_heads_drafter_keeps_drafter_invariance(target):
    """Prop. 4.4 holds for heads too: mpfr output == basic-uwm output for 10 prompts x B x L,
    and the heads' drafts are accepted somewhere (the test is not vacuous)."""
    heads = _random_heads(target, 4, 0)
    mismatches, accepted = [], 0
    for i, (b, lookahead) in itertools.product(range(10), [(1, 4), (4, 2), (4, 4)]):
        prompt = [(7 * i + 2 * j) % VOCAB for j in range(1 + i % 5)]  # includes 1-token prompts
        ref = generate(target, prompt, SamplerConfig("basic-uwm", max_new_tokens=16), _source(i))
        drafter = HeadsDrafter(heads, target, "heads:test")
        out = generate(target, prompt, SamplerConfig("mpfr", b, lookahead, 16), _source(i), drafter)
        accepted += sum(out.stats.accepted_per_level)
        assert out.stats.drafter_calls > 0
        if out.token_ids != ref.token_ids:
            mismatches.append((i, b, lookahead))
    assert mismatches == []
    assert accepted > 0


class _Recording(HeadsDrafter):
    """Checks, at every step, that the hidden state it was handed is the target's final hidden
    state at the token before the root (what the heads were trained on)."""

    def __init__(self, heads, target):
        super().__init__(heads, target, "heads:recording")
        self.checked = self.missing = 0

    def propose(self, tree, level, committed):
        if level == 1:
            if self._hidden is None:
                self.missing += 1
                assert len(committed) == 1  # only a one-token prompt has no state to hand over
            else:
                want = hidden_states(self.target.model, Rollout("x", 0, tuple(committed)))[-2]
                got = self._hidden.get().to(torch.float16)
                assert torch.allclose(got, want, atol=1e-2), len(committed)
                self.checked += 1
        return super().propose(tree, level, committed)


@pytest.mark.parametrize("method", ["mpfr", "vsps", "gls"])
def test_decoder_hands_heads_the_hidden_state_before_the_root(target, method):
    heads = _random_heads(target, 3, 1)
    drafter = _Recording(heads, target)
    for prompt in ([9], [1, 2, 3]):
        out = generate(target, prompt, SamplerConfig(method, 2, 3, 20), _source(3), drafter)
        assert len(out.token_ids) == 20
    assert drafter.checked >= 10 and drafter.missing == 1


def test_heads_files_round_trip_and_refuse_another_target(target, tmp_path: Path):
    heads = _random_heads(target, 3, 2)
    heads.save(tmp_path / "h", dtype=torch.float64)
    drafter = make_drafter(f"heads:{tmp_path / 'h'}", target)
    assert isinstance(drafter, HeadsDrafter)
    h, tokens = torch.randn((5, 32), dtype=torch.float64), torch.arange(5)
    assert torch.equal(drafter.heads.logits(target, h, tokens), heads.logits(target, h, tokens))
    with pytest.raises(ValueError, match="trained for target"):
        make_drafter(f"heads:{tmp_path / 'h'}", tiny_llama(5, layers=3))
    with pytest.raises(ValueError, match=r"heads\.json"):
        make_drafter(f"heads:{tmp_path / 'missing'}", target)


def test_batched_verifier_equals_path_by_path_forwards(target):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (30,), generator=g).tolist()
    anchors = torch.tensor([2, 9, 20])
    drafts = torch.randint(0, VOCAB, (3, 2, 4), generator=g)
    log_p = verifier_laws(target, ids, anchors, drafts)
    for i, a in enumerate(anchors.tolist()):
        for k in range(2):
            seq = ids[: a + 1] + drafts[i, k, :3].tolist()
            ref = torch.log_softmax(target(input_ids=torch.tensor([seq])).logits[0].float(), -1)
            assert torch.allclose(ref[a : a + 4], log_p[i, k], atol=1e-5)


@pytest.fixture(scope="module")
def rollouts(target):
    return _rollouts(target, 12, 0), _rollouts(target, 4, 1)


def _run(target, rollouts, tmp: Path, objective: Objective, steps: int, on_step=None):
    """Train tiny heads (L = 3); returns ((heads, state), held-out hidden states)."""
    train_set, heldout = rollouts
    config = DistillConfig(
        objective=objective,
        lookahead=3,
        steps=steps,
        anchors=16,
        lr=2e-2,
        warmup=2,
        eval_every=0,
        checkpoint_every=5,
    )
    hidden = [hidden_states(target, r) for r in train_set]
    held_hidden = [hidden_states(target, r) for r in heldout]
    trained = train(target, train_set, hidden, heldout, held_hidden, config, tmp, on_step)
    return trained, held_hidden


@pytest.mark.parametrize("name", ["mdraft", "ce"])
def test_a_few_steps_lower_the_loss_and_raise_acceptance(target, rollouts, tmp_path, name):
    (heads, state), held_hidden = _run(target, rollouts, tmp_path, Objective.named(name), 150)
    before = evaluate(new_heads(target, 3).float(), target, rollouts[1], held_hidden, (1.0,))
    after = evaluate(heads, target, rollouts[1], held_hidden, (1.0,))
    losses = [e["loss"] for e in state.log]
    assert sum(losses[-8:]) / 8 < 0.8 * sum(losses[:8]) / 8
    # on-policy distillation fits the target's laws; CE only its sampled tokens (noisier)
    gain = {"mdraft": 0.1, "ce": 0.03}[name]
    assert after["T=1"]["tau"] > before["T=1"]["tau"] + gain, (before, after)
    assert (tmp_path / "heads.safetensors").is_file() and (tmp_path / "training.json").is_file()


def test_interrupted_run_resumes_to_the_same_heads(target, rollouts, tmp_path):
    objective = Objective.named("mdraft", proposals=2)
    (full, _), _ = _run(target, rollouts, tmp_path / "full", objective, 12)

    class Stop(Exception):
        pass

    def stop_at_seven(state, loss):
        if state.step == 7:
            raise Stop

    with pytest.raises(Stop):
        _run(target, rollouts, tmp_path / "cut", objective, 12, stop_at_seven)
    (resumed, state), _ = _run(target, rollouts, tmp_path / "cut", objective, 12)
    assert state.step == 12
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    train_set, heldout = rollouts
    hidden = [hidden_states(target, r) for r in train_set]
    held = [hidden_states(target, r) for r in heldout]
    other = DistillConfig(objective=objective, lookahead=3, steps=13)
    with pytest.raises(ValueError, match="another config"):
        train(target, train_set, hidden, heldout, held, other, tmp_path / "cut")
