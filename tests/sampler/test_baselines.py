"""The unwatermarked baselines ``vsps`` and ``gls`` (``sampler.baselines``): case C10 for one
level, the decoder-level law of the first two tokens, full acceptance when drafter = target
(C11), and the step counters.

Every statistical assertion uses α = 0.001 with fixed seeds: deterministic, and a correct
implementation fails one with probability 0.1 % per assertion.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from keyed import KeyedSource, Secret
from sampler.baselines import (
    LevelNoise,
    gls_drafts,
    gls_target,
    gumbels,
    residual_logp,
    vsps_accepts,
)
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import ModelDrafter, NgramDrafter, self_drafter
from sampler.processing import Processing, dense_logp, process
from tests.sampler.conftest import C10_CASES, VOCAB, first_two_token_law, tiny_llama

ALPHA = 1e-3
DRAWS = 20_000


def chisquare_p(counts: np.ndarray, probs: np.ndarray) -> float:
    mask = probs > 0
    assert counts[~mask].sum() == 0, "a zero-probability outcome occurred"
    expected = probs[mask] / probs[mask].sum() * counts.sum()
    return float(stats.chisquare(counts[mask], expected).pvalue)


def dense_laws(
    p_values: list[float], q_values: list[float], processing: Processing | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(V,) dense log P and log Q after processing (values given as probabilities when
    ``processing`` is None, else as logits)."""
    if processing is None:
        p_raw, q_raw = torch.tensor([p_values]).log(), torch.tensor([q_values]).log()
        processing = Processing(1.0, 0, 1.0)
    else:
        p_raw, q_raw = torch.tensor([p_values]), torch.tensor([q_values])
    v = len(p_values)
    return (
        dense_logp(process(p_raw, processing), v)[0],
        dense_logp(process(q_raw, processing), v)[0],
    )


@pytest.mark.parametrize(("p_values", "q_values", "processing", "expected"), C10_CASES)
def test_case_c10_vsps_keeps_target_law(p_values, q_values, processing, expected) -> None:  # type: ignore[no-untyped-def]
    p, q = dense_laws(p_values, q_values, processing)
    generator = torch.Generator().manual_seed(10)
    emitted = []
    for _ in range(DRAWS):
        x = int(torch.multinomial(q.exp(), 1, generator=generator))
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if vsps_accepts(p, q, x, u):
            emitted.append(x)
        else:
            residual = residual_logp(p, q).exp()
            emitted.append(int(torch.multinomial(residual, 1, generator=generator)))
    counts = np.bincount(emitted, minlength=len(expected))
    assert chisquare_p(counts, np.array(expected)) > ALPHA


def gls_level(
    p: torch.Tensor, q: torch.Tensor, drafts: int, seed: int, fresh_at_rejection: bool = False
) -> tuple[np.ndarray, float]:
    """One GLS level DRAWS times: emitted tokens and the acceptance rate. With
    ``fresh_at_rejection`` the (wrong) variant that redraws from P after a rejection."""
    generator = torch.Generator().manual_seed(seed)
    emitted, accepted = [], 0
    for _ in range(DRAWS):
        noise = gumbels(generator, (drafts, p.shape[0]))
        drafted = gls_drafts(q, noise)
        y = gls_target(p, noise)
        if y in drafted:
            accepted += 1
        elif fresh_at_rejection:
            y = int(torch.multinomial(p.exp(), 1, generator=generator))
        emitted.append(y)
    return np.bincount(emitted, minlength=p.shape[0]), accepted / DRAWS


@pytest.mark.parametrize(("p_values", "q_values", "processing", "expected"), C10_CASES)
@pytest.mark.parametrize("drafts", [1, 4])
def test_case_c10_gls_keeps_target_law(p_values, q_values, processing, expected, drafts) -> None:  # type: ignore[no-untyped-def]
    p, q = dense_laws(p_values, q_values, processing)
    counts, accepted = gls_level(p, q, drafts, seed=20 + drafts)
    assert chisquare_p(counts, np.array(expected)) > ALPHA
    assert accepted > 0.5  # the coupling works: most target tokens were drafted


def test_case_c10_gls_fresh_draw_at_rejection_is_biased() -> None:
    """The bug the coupled emission avoids: redrawing from P after a rejection gives
    P(0) = 0.6 + 0.2 * 0.6 = 0.72 for q = [0.8, 0.2], p = [0.6, 0.4] (B = 1), not 0.6."""
    p, q = dense_laws([0.6, 0.4], [0.8, 0.2], None)
    counts, _ = gls_level(p, q, 1, seed=30, fresh_at_rejection=True)
    assert chisquare_p(counts, np.array([0.6, 0.4])) < 1e-12
    assert chisquare_p(counts, np.array([0.72, 0.28])) > ALPHA


def test_residual_law() -> None:
    p = torch.tensor([0.6, 0.4, 0.0], dtype=torch.float64).log()
    q = torch.tensor([0.8, 0.1, 0.1], dtype=torch.float64).log()
    assert residual_logp(p, q).exp().tolist() == pytest.approx([0.0, 1.0, 0.0])
    assert residual_logp(p, p).exp().tolist() == pytest.approx([0.6, 0.4, 0.0])


def test_level_noise_draws_each_token_once_and_keeps_it() -> None:
    """GLS's lazily drawn noise: a column is drawn on first use and never redrawn (the drafts'
    and the target's reads of one depth see the same Gumbels); its values are standard Gumbel
    (KS test, α = 0.001)."""
    noise = LevelNoise(torch.Generator().manual_seed(1), 3)
    ids, values = noise.over(torch.tensor([5, 2, 5]))
    assert sorted(ids.tolist()) == [2, 5] and values.shape == (3, 2)
    first = {token: values[:, j].tolist() for j, token in enumerate(ids.tolist())}
    ids, values = noise.over(torch.tensor([7, 2]))
    assert sorted(ids.tolist()) == [2, 5, 7] and values.shape == (3, 3)
    for token, column in first.items():
        assert values[:, ids.tolist().index(token)].tolist() == column
    wide = LevelNoise(torch.Generator().manual_seed(2), 1)
    _, sample = wide.over(torch.arange(20_000))
    assert stats.kstest(sample[0].numpy(), stats.gumbel_r.cdf).pvalue > ALPHA


@pytest.mark.parametrize("method", ["vsps", "gls"])
def test_decoder_law_of_first_two_tokens(method: str) -> None:
    """The first two tokens of the decoder (B = 2, L = 2, self:1 drafter) over 2,000 seeds
    follow the enumerated target law P(y1) P(y2 | y1) (16 cells at top-k 4): chi-square at
    α = 0.001."""
    processing = Processing(1.0, 4, 1.0)
    target = tiny_llama(3, layers=2)
    prompt = [3, 14, 15, 9, 26]
    law = first_two_token_law(target, prompt, processing)
    drafter = self_drafter(target, 1)
    config = SamplerConfig(method, 2, 2, 2, processing)
    counts = dict.fromkeys(law, 0)
    accepted = 0
    for i in range(2_000):
        source = KeyedSource(Secret(bytes(32)), nonce=50_000 + i)
        out = generate(target, prompt, config, source, drafter)
        counts[out.token_ids] += 1  # KeyError = an impossible pair was emitted
        accepted += sum(out.stats.accepted_per_level)
        assert not out.watermark_applied
    observed = np.array([counts[c] for c in law])
    expected = np.array(list(law.values())) * observed.sum()
    assert stats.chisquare(observed, expected).pvalue > ALPHA
    assert accepted > 0  # speculation happened


@pytest.mark.parametrize("method", ["vsps", "gls"])
@pytest.mark.parametrize("lookahead", [1, 3])
def test_drafter_equal_to_target_accepts_everything(target, method: str, lookahead: int) -> None:  # type: ignore[no-untyped-def]
    """C11 for the baselines: with Q = P, vsps accepts with probability min(1, P/Q) = 1 and the
    GLS target token is the argmax draft's own token: every drafted level is accepted."""
    for i in range(4):
        out = generate(
            target,
            [5, 6 + i, 7],
            SamplerConfig(method, 3, lookahead, 20),
            KeyedSource(Secret(bytes(32)), nonce=i),
            ModelDrafter(target, VOCAB, "self"),
        )
        assert sum(out.stats.accepted_per_level) == sum(out.stats.drafted_per_level) > 0
        steps = out.stats.target_forward_passes
        assert steps == -(-20 // (lookahead + 1))  # lookahead + 1 tokens per target pass


@pytest.mark.parametrize("method", ["vsps", "gls"])
def test_counters_callback_and_eos(target, method: str) -> None:  # type: ignore[no-untyped-def]
    source = KeyedSource(Secret(bytes(32)), nonce=3)
    seen: list[int] = []
    out = generate(
        target, [1, 2, 3], SamplerConfig(method, 4, 3, 30), source, self_drafter(target, 1),
        on_tokens=seen.extend,
    )  # fmt: skip
    assert tuple(seen) == out.token_ids and len(out.token_ids) == 30
    assert out.stats.drafter_calls <= 3 * out.stats.target_forward_passes
    again = generate(target, [1, 2, 3], SamplerConfig(method, 4, 3, 30), source,
                     self_drafter(target, 1))  # fmt: skip
    assert again.token_ids == out.token_ids  # seeded by the nonce
    eos = out.token_ids[5]
    stopped = generate(
        target, [1, 2, 3], SamplerConfig(method, 4, 3, 30), source, self_drafter(target, 1),
        eos_ids=frozenset({eos}),
    )  # fmt: skip
    assert stopped.finish_reason == "eos" and eos not in stopped.token_ids
    assert stopped.token_ids == out.token_ids[: out.token_ids.index(eos)]


@pytest.mark.parametrize("method", ["vsps", "gls"])
def test_a_drafter_with_nothing_to_propose_adds_no_drafts(target, method: str) -> None:  # type: ignore[no-untyped-def]
    """An all −inf drafter row (the n-gram drafter when the suffix never occurred) means no
    proposal: no child is added and the target alone decides (no crash, no bogus token-0
    drafts)."""
    out = generate(
        target, [1, 2, 3], SamplerConfig(method, 4, 4, 32), KeyedSource(Secret(bytes(32)), nonce=1),
        NgramDrafter(VOCAB),
    )  # fmt: skip
    assert len(out.token_ids) == 32
    assert sum(out.stats.drafted_per_level) <= out.stats.drafter_calls
