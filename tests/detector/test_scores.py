"""Score families (detector/scores.py): the Aaronson term, its p-value, ANLPPT, the registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from detector.scores import AARONSON, SCORES, aaronson_terms, anlppt
from detector.stats import PValue, aaronson_p_value


def test_registry_names_match() -> None:
    assert list(SCORES) == ["aaronson"]
    assert all(name == family.name for name, family in SCORES.items())
    with pytest.raises(TypeError):
        SCORES["other"] = AARONSON  # type: ignore[index]


def test_aaronson_term_is_minus_log_one_minus_r() -> None:
    r = np.array([1e-300, 1e-17, 0.25, 0.5, 0.999, 1.0 - 2.0**-53])
    terms = aaronson_terms(r)
    assert terms.dtype == np.float64
    assert terms[0] == pytest.approx(1e-300, rel=1e-15)  # log1p keeps tiny r exact
    assert terms[1] == pytest.approx(1e-17, rel=1e-15)
    assert terms[2:5] == pytest.approx([-math.log(0.75), math.log(2.0), -math.log(0.001)])
    assert math.isfinite(terms[5]) and terms[5] == pytest.approx(53 * math.log(2.0))


def test_aaronson_term_is_exp1_under_h0() -> None:
    # Under H0 the term of a U(0,1) pivot is Exp(1) (Aaronson & Kirchner 2023); KS at
    # alpha = 0.001 on 20,000 fixed-seed draws.
    terms = aaronson_terms(np.random.default_rng(3).random(20_000))
    assert stats.kstest(terms, "expon").pvalue > 0.001


def test_evaluate_sums_terms_into_an_exact_p_value() -> None:
    r = np.array([0.9, 0.99, 0.5, 0.999])
    terms, p = AARONSON.evaluate(r)
    assert p == aaronson_p_value(4, float(terms.sum()))
    assert p.method == "exact"
    empty_terms, empty = AARONSON.evaluate(np.zeros(0))
    assert empty_terms.shape == (0,) and (empty.p_value, empty.log10_p_value) == (1.0, 0.0)


@pytest.mark.parametrize(
    "pivots", [np.array([0.0, 0.5]), np.array([0.5, 1.0]), np.array([[0.5]])], ids=str
)
def test_evaluate_rejects_bad_pivots(pivots: np.ndarray) -> None:
    with pytest.raises(ValueError, match="pivots"):
        AARONSON.evaluate(pivots)


def test_anlppt() -> None:
    p = PValue.from_log(30.0, -20.0, "exact")
    assert anlppt(p, 10) == pytest.approx(2.0)
    assert anlppt(p, 0) == 0.0
    assert anlppt(PValue.from_log(0.0, 0.0, "exact"), 5) == 0.0
    with pytest.raises(ValueError, match="num_scored"):
        anlppt(p, -1)
