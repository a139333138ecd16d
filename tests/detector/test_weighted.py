"""The entropy-weighted Aaronson test: its null tail against references, and H0 validity."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.stats import binom

from detector.stats import aaronson_log_sf
from detector.weighted import (
    ENTROPY_WEIGHTING,
    RANK_FILTER,
    EntropyWeighting,
    RankFilter,
    chernoff_log_sf,
    entropy_weighted_test,
    label_windows_flagged,
    rank_filtered_test,
    weighted_log_sf,
    weighted_test,
)
from tests.detector.helpers import hypoexponential_log_tail


def two_level_log_sf(n1: int, a: float, n2: int, b: float, s: float) -> float:
    """ln P(a·G1 + b·G2 >= s), G_i ~ Gamma(n_i, 1), by mpmath quadrature over G2."""
    with mpmath.workdps(30):

        def f(y: mpmath.mpf) -> mpmath.mpf:
            rest = (s - b * y) / a
            tail = mpmath.gammainc(n1, rest, mpmath.inf, regularized=True) if rest > 0 else 1
            return mpmath.exp(-y) * y ** (n2 - 1) / mpmath.gamma(n2) * tail

        return float(mpmath.log(mpmath.quad(f, [0, s / b, mpmath.inf])))


@pytest.mark.parametrize("s", [0.5, 2.0, 6.0, 15.0, 40.0])
def test_distinct_weights_match_the_closed_form(s: float) -> None:
    weights = [0.25, 0.5, 0.75, 1.0, 0.375]
    log_p, method = weighted_log_sf(np.array(weights), s)
    reference = hypoexponential_log_tail(weights, s)
    assert method == "exact"
    # a valid upper bound (never below the tail, up to 1e-12 of float rounding in ln p) and
    # within the documented 1e-10 relative margin (plus 1e-12) of it
    assert log_p >= reference - 1e-12 * abs(reference)
    assert log_p - reference <= 1.1e-10 + 1e-12 * abs(reference)


@pytest.mark.parametrize(
    ("n1", "a", "n2", "b", "s"),
    [
        pytest.param(10, 0.25, 20, 1.0, 30.0, id="M30_quarter"),
        pytest.param(50, 0.5, 50, 1.0, 120.0, id="M100_half"),
        pytest.param(30, 0.25, 5, 0.75, 40.0, id="M35_deep"),
        pytest.param(3, 0.5, 2, 1.0, 0.5, id="M5_below_mean"),
    ],
)
def test_two_levels_match_quadrature(n1: int, a: float, n2: int, b: float, s: float) -> None:
    weights = np.array([a] * n1 + [b] * n2)
    log_p, method = weighted_log_sf(weights, s)
    reference = two_level_log_sf(n1, a, n2, b, s)
    assert method == "exact"
    assert log_p == pytest.approx(reference, rel=1e-9, abs=2e-10)


@pytest.mark.parametrize("m", [1, 7, 64, 500])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_one_level_is_the_plain_aaronson_p(m: int, scale: float) -> None:
    """All weights c: S_w / c ~ Gamma(M, 1), the plain test's law, to the bit."""
    s = 1.3 * m * scale
    log_p, method = weighted_log_sf(np.full(m, scale), s)
    assert method == "exact"
    assert log_p == aaronson_log_sf(m, s / scale)


def test_zero_weights_drop_out() -> None:
    with_zeros = weighted_log_sf(np.array([0.0, 0.5, 0.0, 1.0, 0.25]), 4.0)
    without = weighted_log_sf(np.array([0.5, 1.0, 0.25]), 4.0)
    assert with_zeros == without
    assert weighted_log_sf(np.zeros(5), 3.0) == (0.0, "exact")
    assert weighted_log_sf(np.zeros(0), 0.0) == (0.0, "exact")


def test_chernoff_bounds_the_exact_tail() -> None:
    levels = np.array([0.25, 0.5, 0.75, 1.0])
    counts = np.array([10, 10, 10, 10])
    weights = np.repeat(levels, counts)
    for s in (30.0, 50.0, 90.0, 200.0):
        exact, method = weighted_log_sf(weights, s)
        assert method == "exact"
        assert chernoff_log_sf(levels, counts, s) >= exact


def test_many_levels_fall_back_to_a_valid_chernoff_bound() -> None:
    weights = list(np.linspace(0.3, 1.0, 20))  # 20 distinct levels > MAX_SERIES_LEVELS
    for s in (10.0, 25.0, 60.0):
        log_p, method = weighted_log_sf(np.array(weights), s)
        assert method == "chernoff_bound"
        assert log_p >= hypoexponential_log_tail(weights, s)


def test_deep_tails_stay_finite_and_decrease() -> None:
    weights = np.array([0.25] * 100 + [1.0] * 100)
    previous = 0.0
    for s in (150.0, 400.0, 800.0, 2_000.0, 20_000.0):
        log_p, _ = weighted_log_sf(weights, s)
        assert math.isfinite(log_p)
        assert log_p < previous
        previous = log_p


def test_h0_rejections_stay_within_the_binomial_bound() -> None:
    """Uniform pivots, fixed key-independent weights (quantised entropies of a fixed draw):
    the weighted p is exact, so the rejections at α are Binomial(N, α) — checked from both
    sides with a 99.9 % two-sided binomial interval at α = 0.01 and 0.05 (a 0.1 % false alarm
    per check keeps the suite quiet; an anti-conservative p, or a loose bound posing as
    exact, fails it)."""
    rng = np.random.default_rng(20261201)
    texts, m = 3000, 48
    weights = ENTROPY_WEIGHTING.weights(rng.exponential(1.0, size=m))
    assert np.unique(weights[weights > 0]).size > 1  # several levels: the series is exercised
    terms = -np.log1p(-rng.random((texts, m)))  # (N, M) Exp(1) Aaronson terms under H0
    log_p = np.array([weighted_log_sf(weights, float(weights @ row))[0] for row in terms])
    for alpha in (0.01, 0.05):
        rejected = int(np.sum(log_p < math.log(alpha)))
        low, high = binom.interval(0.999, texts, alpha)
        assert low <= rejected <= high, (alpha, rejected, low, high)


def test_weighted_test_and_entropy_wiring() -> None:
    skip = np.array([1, 1, 0, 0, 2, 0, 0], dtype=np.int8)  # 4 scored positions
    entropy = np.array([3.0, 0.0, 0.0, 2.0, 1.0, 0.05, 4.0])
    terms = np.array([1.0, 2.0, 3.0, 0.5])
    found = entropy_weighted_test(skip, terms, entropy)
    expected_w = ENTROPY_WEIGHTING.weights(entropy)[skip == 0]
    assert found.num_scored == 4
    assert found.num_weighted == int(np.count_nonzero(expected_w))
    assert found.score == pytest.approx(float(expected_w @ terms))
    assert found.to_json()["log10_p_value"] == pytest.approx(found.log_p / math.log(10))
    with pytest.raises(ValueError, match="entropy of shape"):
        entropy_weighted_test(skip, terms, entropy[:-1])
    with pytest.raises(ValueError, match="one shape"):
        weighted_test(np.ones(3), np.ones(4))


def test_weighting_rule_and_its_errors() -> None:
    rule = EntropyWeighting("ratio", 1.0, 4)
    assert rule.weights(np.array([0.0, 1.0, 100.0])).tolist() == [0.0, 0.5, 1.0]
    clip = EntropyWeighting("clip", 2.0, 1)
    assert clip.weights(np.array([0.5, 1.0, 3.0])).tolist() == [0.0, 0.0, 1.0]  # rint(0.5)=0
    with pytest.raises(ValueError, match="shape"):
        EntropyWeighting("log", 1.0, 4)
    with pytest.raises(ValueError, match="scale"):
        EntropyWeighting("ratio", 0.0, 4)
    with pytest.raises(ValueError, match="levels"):
        EntropyWeighting("ratio", 1.0, 0)
    with pytest.raises(ValueError, match="entropies"):
        rule.weights(np.array([1.0, -0.5]))
    with pytest.raises(ValueError, match="weights"):
        weighted_log_sf(np.array([1.0, -1.0]), 1.0)


def test_label_windows_cover_the_token_and_the_m_after_it() -> None:
    flags = np.zeros(9, bool)
    flags[[2, 7]] = True
    assert label_windows_flagged(flags, 2).tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert label_windows_flagged(flags, 0).tolist() == flags.tolist()
    assert label_windows_flagged(np.zeros(0, bool), 4).shape == (0,)
    with pytest.raises(ValueError, match="context_width"):
        label_windows_flagged(flags, -1)
    with pytest.raises(ValueError, match="flags of shape"):
        label_windows_flagged(flags.reshape(3, 3), 2)


def test_the_rank_filter_drops_the_scored_positions_of_the_flagged_windows() -> None:
    """Known answer for the alignment of text positions, skip codes and terms: 10 tokens,
    position 3 not scored, m = 2; the terms are powers of two, so the score names the kept
    set."""
    skip = np.zeros(10, np.int8)
    skip[3] = 1
    terms = 2.0 ** np.arange(9)  # scored positions 0, 1, 2, 4, 5, 6, 7, 8, 9 -> terms 0..8
    rank = np.zeros(10, np.int64)
    rank[5] = 1000  # drops positions 5, 6, 7 -> terms 4, 5, 6
    test = rank_filtered_test(skip, terms, rank, 2)
    assert test.num_scored == 9 and test.num_weighted == 6
    assert test.score == 1 + 2 + 4 + 8 + 128 + 256
    rank[5], rank[3] = 999, 5000  # an unscored token still breaks positions 3, 4, 5
    test = rank_filtered_test(skip, terms, rank, 2)
    assert test.num_weighted == 7 and test.score == 1 + 2 + 4 + 32 + 64 + 128 + 256


def test_the_rank_filter_p_is_the_plain_p_of_the_kept_positions() -> None:
    """0/1 weights: the weighted p is the Gamma(K, 1) tail of the kept terms, bit for bit the
    plain Aaronson p over them (and 1 when nothing is kept)."""
    rng = np.random.default_rng(20261204)
    skip = np.zeros(40, np.int8)
    skip[[0, 1, 17]] = 1  # not scored
    terms = rng.exponential(2.0, size=37)
    rank = rng.integers(0, 2000, size=40)
    test = rank_filtered_test(skip, terms, rank, 3)
    keep = ~label_windows_flagged(rank >= 1000, 3)[skip == 0]
    assert 0 < keep.sum() < keep.size
    assert test.log_p == pytest.approx(aaronson_log_sf(int(keep.sum()), float(terms[keep].sum())))
    assert test.method == "exact" and test.num_weighted == int(keep.sum())
    assert test.to_json()["name"] == "edit_filtered"
    assert test.to_json()["weighting"] == {"rule": "raw_rank_filter", "max_rank": 1000}
    everything = rank_filtered_test(skip, terms, np.full(40, 10**6), 3)
    assert everything.log_p == 0.0 and everything.num_weighted == 0
    with pytest.raises(ValueError, match="raw_rank of shape"):
        rank_filtered_test(skip, terms, rank[:39], 3)
    with pytest.raises(ValueError, match="raw_rank >= 0"):
        RANK_FILTER.weights(np.array([-1]), 3)
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="max_rank"):
            RankFilter(bad)  # type: ignore[arg-type]


def test_the_rank_filter_finds_edited_texts_the_plain_test_misses() -> None:
    """Simulated 30 % edits of 120 tokens at m = 4: 24 foreign tokens (substituted or
    inserted; the filter flags each with probability 0.5, about the real filter's recall) and
    12 deletions (unseen). The labels they enter carry Exp(1) terms (H0), the intact ones an
    H1 term Exp(mean 2), and 3 % of the other tokens are flagged by mistake. Over 2,000 texts
    at α = 0.01 the filter must find at least 0.06 more of them than the plain test (fixed
    seed: 0.46 plain, 0.59 filtered; the check fails if the filter loses what it zeroes), and
    under H0 (all terms Exp(1), the same flags) it must stay within the 99.9 % binomial
    interval of α (a 0.1 % false alarm keeps the suite quiet; an anti-conservative p fails
    it)."""
    rng = np.random.default_rng(20261205)
    texts, n, m, level = 2000, 120, 4, math.log(0.01)
    skip = np.zeros(n, np.int8)
    found = {"plain": 0, "filtered": 0}
    null_rejections = 0
    for _ in range(texts):
        foreign, deleted = np.zeros(n, bool), np.zeros(n, bool)
        foreign[rng.choice(n, size=24, replace=False)] = True
        deleted[rng.choice(n, size=12, replace=False)] = True
        # a foreign token breaks its own position and the m after it; a deletion before
        # position i breaks the m labels that span the gap, i .. i + m − 1
        destroyed = label_windows_flagged(foreign, m) | label_windows_flagged(deleted, m - 1)
        terms = np.where(destroyed, rng.exponential(1.0, n), rng.exponential(2.0, n))
        flagged = np.where(foreign, rng.random(n) < 0.5, rng.random(n) < 0.03)
        rank = np.where(flagged, 5000, 10)
        found["plain"] += aaronson_log_sf(n, float(terms.sum())) < level
        found["filtered"] += rank_filtered_test(skip, terms, rank, m).log_p < level
        null_rejections += rank_filtered_test(skip, rng.exponential(1.0, n), rank, m).log_p < level
    assert found["filtered"] >= found["plain"] + 0.06 * texts, found
    low, high = binom.interval(0.999, texts, 0.01)
    assert low <= null_rejections <= high, (null_rejections, low, high)
