"""Processed laws: temperature -> top-k -> top-p, in that order (docs/design.md §3, case C6)."""

from __future__ import annotations

import pytest
import torch

from sampler.processing import Processing, dense_logp, process


def probs(logits, processing):
    support = process(torch.tensor([logits], dtype=torch.float64), processing)
    return dense_logp(support, len(logits)).exp()[0].tolist()


def test_temperature_then_top_k():
    assert probs([2.0, 1.0, 0.5], Processing(0.7, 2, 1.0)) == pytest.approx(
        [0.80668, 0.19332, 0.0], abs=5e-6
    )


def test_top_p_keeps_smallest_prefix_reaching_p():
    out = probs([0.0, -1.0, -2.0, -3.0], Processing(1.0, 0, 0.7))
    p = torch.softmax(torch.tensor([0.0, -1.0, -2.0, -3.0]), 0).tolist()  # .64 .24 .09 .03
    assert out[2:] == [0.0, 0.0]
    assert out[0] == pytest.approx(p[0] / (p[0] + p[1]))


def test_greedy_is_a_point_mass_on_argmax():
    assert probs([0.1, 3.0, 2.9], Processing(0.0, 50, 1.0)) == [0.0, 1.0, 0.0]


def test_all_minus_inf_row_stays_empty():
    support = process(torch.full((2, 5), -torch.inf), Processing())
    assert support.empty_rows().tolist() == [True, True]


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("temperature", {"temperature": -1.0}),
        ("top_k", {"top_k": -2}),
        ("top_p", {"top_p": 0.0}),
        ("top_p", {"top_p": 1.5}),
    ],
)
def test_bad_processing_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        Processing(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("processing", [Processing(1.0, 50, 1.0), Processing(0.7, 0, 0.95)])
def test_low_precision_logits_give_the_float64_support(dtype, processing):
    """``process`` runs top-k on the logits as given and widens only the kept values: the
    support (slots and order, ties included) is the one of the same logits widened first.
    Logits on a coarse grid (multiples of 1/8 in [-4, 4]) make ties at the top-k boundary
    common, so a dtype-dependent tie-break would show."""
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randint(-32, 33, (64, 4096), generator=generator) / 8).to(dtype)
    logits[0, :] = 0.0  # one row all tied
    logits[1, :100] = -torch.inf
    ties = 0
    for row in logits:
        values = row.to(torch.float64)
        ties += int((values == values.topk(50).values[-1]).sum() > 1)
    assert ties > 50  # the boundary is tied in most rows: the check below can fail
    fast = process(logits, processing)
    wide = process(logits.to(torch.float64), processing)
    assert torch.equal(fast.tokens, wide.tokens)
    assert torch.equal(fast.logp, wide.logp)
    assert fast.logp.dtype == torch.float64
