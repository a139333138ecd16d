"""Processed distributions: temperature -> top-k -> top-p, in that order (DESIGN §3, case C6)."""

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
