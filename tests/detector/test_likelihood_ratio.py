"""The likelihood-ratio test: its lower-tail null against references, H0 validity, H1 power."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.stats import binom

from detector.stats import aaronson_log_sf
from detector.weighted import (
    LIKELIHOOD_RATIO,
    MAX_TERM,
    LikelihoodRatioWeighting,
    chernoff_log_cdf,
    gamma_log_cdf_many,
    likelihood_ratio_test,
    weighted_log_cdf,
)
from tests.detector.helpers import hypoexponential_log_tail


def two_level_log_cdf(n1: int, a: float, n2: int, b: float, s: float) -> float:
    """ln P(a·G1 + b·G2 <= s), G_i ~ Gamma(n_i, 1), by mpmath quadrature over G2."""
    with mpmath.workdps(30):

        def f(y: mpmath.mpf) -> mpmath.mpf:
            rest = (s - b * y) / a
            head = mpmath.gammainc(n1, 0, rest, regularized=True)
            return mpmath.exp(-y) * y ** (n2 - 1) / mpmath.gamma(n2) * head

        return float(mpmath.log(mpmath.quad(f, [0, s / (2 * b), s / b])))


@pytest.mark.parametrize("s", [0.05, 0.3, 1.0, 3.0, 8.0, 20.0, 60.0])
def test_distinct_weights_match_the_closed_form(s: float) -> None:
    weights = [0.25, 0.5, 0.75, 1.0, 0.375, 4.0, 8.0]
    log_p, method = weighted_log_cdf(np.array(weights), s)
    reference = hypoexponential_log_tail(weights, s, lower=True)
    assert method == "exact"
    # a valid upper bound (never below, up to float rounding) within the 1e-10 margin of it
    assert log_p >= reference - 1e-12 * abs(reference)
    assert log_p - reference <= 1.1e-10 + 1e-12 * abs(reference)


@pytest.mark.parametrize(
    ("n1", "a", "n2", "b", "s"),
    [
        pytest.param(10, 0.25, 20, 1.0, 3.0, id="M30_deep"),
        pytest.param(50, 0.5, 50, 3.0, 60.0, id="M100_below_mean"),
        pytest.param(30, 0.25, 5, 19.0, 40.0, id="M35_wide"),
        pytest.param(3, 0.5, 2, 1.0, 5.0, id="M5_above_mean"),
    ],
)
def test_two_levels_match_quadrature(n1: int, a: float, n2: int, b: float, s: float) -> None:
    weights = np.array([a] * n1 + [b] * n2)
    log_p, method = weighted_log_cdf(weights, s)
    assert method == "exact"
    assert log_p == pytest.approx(two_level_log_cdf(n1, a, n2, b, s), rel=1e-9, abs=2e-10)


@pytest.mark.parametrize("m", [1, 7, 64, 500])
@pytest.mark.parametrize("ratio", [0.01, 0.5, 1.0, 2.0])
def test_one_level_is_the_gamma_lower_tail(m: int, ratio: float) -> None:
    x = ratio * m
    log_p, method = weighted_log_cdf(np.full(m, 0.25), 0.25 * x)
    with mpmath.workdps(40):
        reference = float(mpmath.log(mpmath.gammainc(m, 0, x, regularized=True)))
    assert method == "exact"
    assert log_p >= reference - 1e-15  # valid: never below the tail
    assert log_p == pytest.approx(reference, rel=1e-12, abs=2e-11)
    # and P + Q = 1 against the upper tail the plain test uses
    assert math.exp(log_p) + math.exp(aaronson_log_sf(m, x)) == pytest.approx(1.0, abs=1e-11)


def test_gamma_lower_tails_fall_with_the_shape() -> None:
    tails = gamma_log_cdf_many(5, 30.0, 200)
    assert np.all(np.diff(tails) <= 0.0) and np.all(np.isfinite(tails))
    reference = float(mpmath.log(mpmath.gammainc(5, 0, 30, regularized=True)))
    assert reference <= tails[0] <= reference + 1e-11  # a valid bound within its margin


def test_chernoff_bounds_the_exact_lower_tail() -> None:
    levels = np.array([0.25, 1.0, 4.0, 19.0])
    counts = np.array([10, 10, 5, 3])
    weights = np.repeat(levels, counts)
    mean = float(levels @ counts)
    for s in (0.5, 5.0, 20.0, 0.8 * mean, 1.2 * mean):
        exact, method = weighted_log_cdf(weights, s)
        assert method == "exact"
        assert chernoff_log_cdf(levels, counts, s) >= exact - 1e-12


def test_many_levels_fall_back_to_a_valid_chernoff_bound() -> None:
    weights = list(np.linspace(0.3, 5.0, 20))  # 20 distinct levels > MAX_SERIES_LEVELS
    for s in (1.0, 8.0, 30.0):
        log_p, method = weighted_log_cdf(np.array(weights), s)
        assert method == "chernoff_bound"
        assert log_p >= hypoexponential_log_tail(weights, s, lower=True)


def test_edge_cases_stay_finite_and_monotone() -> None:
    assert weighted_log_cdf(np.zeros(4), 3.0) == (0.0, "exact")  # no weight: S = 0, p = 1
    assert weighted_log_cdf(np.zeros(0), 0.0) == (0.0, "exact")
    weights = np.array([0.25] * 100 + [19.0] * 100)
    previous = 0.0
    for s in (2_000.0, 500.0, 50.0, 1.0, 1e-6, 0.0, -3.0):
        log_p, _ = weighted_log_cdf(weights, s)
        assert math.isfinite(log_p) and log_p <= previous
        previous = log_p
    with pytest.raises(ValueError, match="weights"):
        weighted_log_cdf(np.array([1.0, -1.0]), 1.0)
    with pytest.raises(ValueError, match="finite weighted score"):
        weighted_log_cdf(np.ones(3), math.inf)


def test_h0_rejections_stay_within_the_binomial_bound() -> None:
    """Uniform pivots, fixed key-independent weights (the rule on a fixed draw of token
    probabilities, spread over every level the floor allows): the p is exact, so rejections
    at α are Binomial(N, α) — checked from both sides with a 99.9 % two-sided interval at
    α = 0.01 and 0.05 (0.1 % false alarm per check; an anti-conservative p or a loose bound
    posing as exact fails it)."""
    rng = np.random.default_rng(20261203)
    texts, m = 3000, 40
    logp = np.log(rng.choice([1.0, 0.9, 0.6, 0.3, 0.1, 0.02], size=m))
    skip = np.zeros(m, dtype=np.int8)
    assert np.unique(LIKELIHOOD_RATIO.weights(logp)).size >= 4  # several levels: the series
    terms = -np.log1p(-rng.random((texts, m)))  # (N, M) Exp(1) Aaronson terms under H0
    tests = [likelihood_ratio_test(skip, row, logp) for row in terms]
    assert {t.method for t in tests} == {"exact"}
    log_p = np.array([t.log_p for t in tests])
    for alpha in (0.01, 0.05):
        rejected = int(np.sum(log_p < math.log(alpha)))
        low, high = binom.interval(0.999, texts, alpha)
        assert low <= rejected <= high, (alpha, rejected, low, high)


def test_it_beats_the_aaronson_sum_where_most_positions_are_near_certain() -> None:
    """H1 at known token probabilities (the chosen token's pivot is Beta(1/p, 1)): 80 % of the
    positions at p = 0.95, 20 % at p = 0.2, 24 scored tokens, 400 texts. The most powerful
    test for known p must detect more texts at α = 0.01 than the plain Aaronson sum; measured
    (seed 7) 0.69 against 0.13 — the margin asked, 0.3, is ~8 binomial standard errors below
    the measured gap, and an LR p that ignored the weights would not reach it."""
    rng = np.random.default_rng(7)
    texts, m = 400, 24
    hits_lr = hits_plain = 0
    for _ in range(texts):
        p = np.where(rng.random(m) < 0.8, 0.95, 0.2)
        r = rng.beta(1.0 / p, 1.0)
        x = -np.log1p(-r)
        lr = likelihood_ratio_test(np.zeros(m, np.int8), x, np.log(p))
        hits_lr += lr.log_p < math.log(0.01)
        hits_plain += aaronson_log_sf(m, float(x.sum())) < math.log(0.01)
    assert hits_lr / texts >= hits_plain / texts + 0.3, (hits_lr, hits_plain)


def test_weights_wiring_and_errors() -> None:
    rule = LikelihoodRatioWeighting(floor=0.05, levels=4)
    logp = np.log([1.0, 0.5, 0.1, 0.01, 0.9])
    assert rule.weights(logp).tolist() == [0.0, 1.0, 9.0, 19.0, 0.0]  # 1/0.9 − 1 rounds to 0
    assert rule.weights(np.array([-math.inf]))[0] == 19.0  # outside the support: the floor
    skip = np.array([0, 1, 0, 0], dtype=np.int8)  # 3 scored positions
    x = np.array([2.0, 0.0, 0.7])
    found = likelihood_ratio_test(
        skip, x, np.log([0.5, 0.9, 0.1, 0.05]), conditioned_on_prompt=True
    )
    w = np.array([1.0, 9.0, 19.0])
    y = np.array([-math.log(-math.expm1(-2.0)), MAX_TERM, -math.log(-math.expm1(-0.7))])
    assert found.score == pytest.approx(float(w @ y))  # r = 0 (x = 0): capped, finite
    assert found.log_p == weighted_log_cdf(w, float(w @ y))[0]
    shaped = found.to_json()
    assert shaped["name"] == "likelihood_ratio" and shaped["conditioned_on_prompt"] is True
    assert shaped["weighting"] == {
        "rule": "likelihood_ratio",
        "floor": 0.05,
        "levels": 4,
        "grid": "linear",
    }
    with pytest.raises(ValueError, match="token_logp of shape"):
        likelihood_ratio_test(skip, x, np.zeros(3))
    with pytest.raises(ValueError, match="3 Aaronson terms"):
        likelihood_ratio_test(skip, x[:2], np.zeros(4))
    with pytest.raises(ValueError, match="Aaronson terms >= 0"):
        likelihood_ratio_test(skip, np.array([1.0, -1.0, 1.0]), np.zeros(4))
    with pytest.raises(ValueError, match="token_logp <= 0"):
        rule.weights(np.array([0.5]))
    with pytest.raises(ValueError, match="floor"):
        LikelihoodRatioWeighting(floor=1.0)
    with pytest.raises(ValueError, match="levels"):
        LikelihoodRatioWeighting(levels=0)
    with pytest.raises(ValueError, match="grid"):
        LikelihoodRatioWeighting(grid="log")


def test_geometric_grid_rounds_in_octaves_and_drops_what_is_below_its_smallest_level() -> None:
    rule = LikelihoodRatioWeighting(floor=0.05, levels=4, grid="geometric")
    p = np.array([1.0, 0.9, 0.85, 0.8, 0.6, 0.5, 0.3, 0.1, 0.01, 0.0])
    with np.errstate(divide="ignore"):
        w = rule.weights(np.log(p))
    # raw 1/p − 1: 0, 0.111, 0.176 (< 2^−½/4 = 0.177: dropped), 0.25, 0.667, 1, 2.33, 9, 19, 19
    assert w.tolist() == [0.0, 0.0, 0.0, 0.25, 0.5, 1.0, 2.0, 8.0, 16.0, 16.0]
    grid = rule.weights(np.log(np.linspace(1e-3, 1.0, 5000)))
    assert set(np.unique(grid).tolist()) == {0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0}
    assert LikelihoodRatioWeighting(0.02, 1, "geometric").weights(np.array([-9.0]))[0] == 64.0
    spread = np.log(np.linspace(0.02, 1.0, 2000))
    for levels in range(1, 9):  # the grid is anchored on 1/L, whatever L
        w = LikelihoodRatioWeighting(0.05, levels, "geometric").weights(spread)
        octaves = np.log2(w[w > 0] * levels)
        assert w[w > 0].min() == 1.0 / levels and np.all(octaves == np.rint(octaves)), levels


def test_geometric_grid_keeps_a_long_text_on_the_exact_series() -> None:
    """The reason for the grid: a 128-token text whose token probabilities spread over the
    whole range gets a p from the exact series (seven levels), where the linear grid's dozens
    of levels leave only the Chernoff bound; and the series' p is below that bound for the
    same weights (it is the tail itself, the bound is above it)."""
    rng = np.random.default_rng(11)
    m = 128
    p = np.exp(rng.uniform(math.log(0.02), 0.0, size=m))  # log-uniform over [0.02, 1]
    r = rng.beta(1.0 / p, 1.0)  # H1: the chosen token's pivot
    x = -np.log1p(-r)
    skip = np.zeros(m, np.int8)
    geometric = LikelihoodRatioWeighting(0.05, 4, "geometric")
    found = likelihood_ratio_test(skip, x, np.log(p), geometric)
    # seed 11: ln p ≈ −159 (the text is strongly watermarked); 1e-6 only checks that the
    # test sees it, the point is the method
    assert found.method == "exact" and found.log_p < math.log(1e-6)
    w = geometric.weights(np.log(p))
    levels, counts = np.unique(w[w > 0], return_counts=True)
    assert found.log_p <= chernoff_log_cdf(levels, counts, found.score)
    linear = likelihood_ratio_test(skip, x, np.log(p), LikelihoodRatioWeighting(0.05, 4))
    assert linear.method == "chernoff_bound"
