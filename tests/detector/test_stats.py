"""Null laws and p-values (detector/stats.py): the Gamma tail in log space, PValue, min tokens."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import special, stats

import detector.stats as stats_module
from detector.stats import (
    GAMMAINCC_FLOOR,
    LN10,
    PValue,
    aaronson_log_sf,
    aaronson_log_sf_many,
    aaronson_p_value,
    min_scored_tokens,
)

# log10 Q(M, S) from mpmath at 50 digits (mpmath.gammainc(M, S, inf, regularized=True)).
C7_REFERENCE = [
    pytest.param(200, 300.0, -9.4722279450114088434717680876, id="C7_M200_S300"),
    pytest.param(2000, 4000.0, -268.57902893553858749301981413, id="C7_M2000_S4000"),
]


# log10 Q(M, S) from mpmath at 50 digits, in gammaincc's regime and where Q > 1/2 (log1p).
MPMATH_REFERENCE = [
    pytest.param(1, 3.0, -1.30288344570975548295338675675),
    pytest.param(5, 12.0, -2.11916408320990127817870403778),
    pytest.param(30, 45.0, -2.13446968417481722328399679452),
    pytest.param(64, 60.0, -0.167214488592352519350998200187),
    pytest.param(483, 469.0, -0.133698698194481662815223832723),
    pytest.param(483, 560.0, -3.39044602359557796504814824594),
    pytest.param(1000, 1100.0, -2.97497149411710327988149927583),
    pytest.param(4096, 4098.5, -0.316639950172123712267854007171),
]


@pytest.mark.parametrize(("m", "s", "log10_p"), MPMATH_REFERENCE)
def test_log10_p_within_1e13_of_mpmath(m: int, s: float, log10_p: float) -> None:
    """P_VALUES_VERSION 2's accuracy claim: within 1e-13 relative of the 50-digit value (all
    of these are within 2e-15; the v1 series, everywhere, was off by up to ~7e-12 at M = 4096),
    on the scalar path and the array path alike."""
    assert aaronson_log_sf(m, s) / LN10 == pytest.approx(log10_p, rel=1e-13)
    both = aaronson_log_sf_many(m, np.array([s, s]))
    assert both[0] / LN10 == pytest.approx(log10_p, rel=1e-13)


@pytest.mark.parametrize(("m", "s", "log10_p"), C7_REFERENCE)
def test_c7_log10_p_matches_mpmath(m: int, s: float, log10_p: float) -> None:
    # Case C7: the expected values to 5 decimals, and to rel 1e-9 against the 50-digit reference.
    got = aaronson_log_sf(m, s) / LN10
    assert got == pytest.approx(log10_p, rel=1e-9)
    assert round(got, 5) == round(log10_p, 5)
    p = aaronson_p_value(m, s)
    assert p.log10_p_value == pytest.approx(log10_p, rel=1e-9)
    assert p.method == "exact"


def test_agrees_with_scipy_gammaincc_where_finite() -> None:
    # Q(M, S) by the log-space series vs scipy's gammaincc, rel 1e-10, wherever scipy's value is
    # a normal float (> 1e-300): a wrong series bound (M vs M+1 terms) misses by far more.
    compared = 0
    for m in [1, 2, 3, 5, 10, 30, 100, 300, 1000, 3000]:
        for ratio in [0.01, 0.1, 0.5, 0.9, 0.99, 1.0, 1.01, 1.1, 1.5, 2.0, 3.0, 5.0]:
            s = ratio * m
            reference = float(special.gammaincc(m, s))
            if reference < 1e-300:
                continue
            assert math.exp(aaronson_log_sf(m, s)) == pytest.approx(reference, rel=1e-10), (m, s)
            compared += 1
    assert compared > 100


def test_finite_where_scipy_underflows() -> None:
    # docs/design.md §4: scipy's gamma.logsf returns -inf at M = 1000, S = 3000; ours stays finite.
    for m, s in [(1000, 3000.0), (1, 1e6), (5, 2e4), (20_000, 60_000.0)]:
        log_p = aaronson_log_sf(m, s)
        assert math.isfinite(log_p) and log_p < -700, (m, s, log_p)
    # M = 1 is the exponential tail: ln Q(1, S) = -S exactly.
    assert aaronson_log_sf(1, 1e6) == pytest.approx(-1e6, rel=1e-15)


@pytest.mark.parametrize("m", [1, 7, 200, 2000])
def test_monotone_decreasing_in_s(m: int) -> None:
    s = np.linspace(0.0, 4.0 * m + 20.0, 400)
    log_q = aaronson_log_sf_many(m, s)
    assert np.all(np.diff(log_q) <= 0.0)
    # Strictly decreasing once the tail is away from 1 (ln Q clamps at 0 by rounding only).
    away = log_q[:-1] < -1e-9
    assert np.all(np.diff(log_q)[away] < 0.0)


def test_vectorised_matches_scalar() -> None:
    # Q near 1 (log1p of the lower tail), gammaincc, and past GAMMAINCC_FLOOR (the series).
    s = np.array([0.0, 0.5, 10.0, 99.0, 250.0, 1000.0, 5000.0])
    assert aaronson_log_sf_many(100, s).tolist() == [aaronson_log_sf(100, float(v)) for v in s]
    # Bit for bit (signed zeros too) around the mean, where Q crosses 1/2 (the log1p path) and
    # gammaincc takes over, and where the lower tail underflows (log1p(-0) = -0.0).
    rng = np.random.default_rng(4)
    for m in (1, 7, 64, 483, 3000):
        s = np.abs(m + np.sqrt(m) * rng.normal(size=2000)) + 1e-9
        s = np.append(s, [1e-300, 1e-9])
        scalar = np.array([aaronson_log_sf(m, float(v)) for v in s])
        assert np.array_equal(aaronson_log_sf_many(m, s).view(np.uint64), scalar.view(np.uint64))


@pytest.mark.parametrize("m", [1, 30, 483])
def test_continuous_and_monotone_where_gammaincc_hands_over_to_the_series(m: int) -> None:
    """ln Q switches from ln gammaincc to the exact series where Q < GAMMAINCC_FLOOR: both
    sides agree to 1e-10 there and the switch does not make ln Q increase in S."""
    s = np.linspace(m + 10.0, 40.0 * m + 2000.0, 200_001)
    q = special.gammaincc(m, s)
    switch = int(np.argmax(q < GAMMAINCC_FLOOR))
    assert switch > 0  # the grid crosses the floor
    near = s[switch - 50 : switch + 50]
    log_q = aaronson_log_sf_many(m, near)
    assert np.all(np.diff(log_q) <= 0.0)
    series = stats_module._log_sf_series(m, near)
    assert log_q == pytest.approx(series, rel=1e-10)


@pytest.mark.parametrize(("m", "s"), [(0, 0.0), (0, 12.5), (7, 0.0), (3000, 0.0)])
def test_no_tokens_or_zero_score_is_p_one(m: int, s: float) -> None:
    assert aaronson_log_sf(m, s) == 0.0
    p = aaronson_p_value(m, s)
    assert (p.p_value, p.log10_p_value) == (1.0, 0.0)


@pytest.mark.parametrize(
    ("m", "s"),
    [(-1, 1.0), (3, -0.1), (3, math.nan), (3, math.inf), (True, 1.0), (2.5, 1.0)],
    ids=["m_negative", "s_negative", "s_nan", "s_inf", "m_bool", "m_float"],
)
def test_rejects_bad_m_or_s(m: int, s: float) -> None:
    with pytest.raises(ValueError, match=r"expected (m|finite scores)"):
        aaronson_log_sf(m, s)


def test_pvalue_underflows_only_beside_a_finite_log10() -> None:
    # Case C7: p may print 0 only next to a finite log10 p; JSON never carries NaN/Infinity.
    p = aaronson_p_value(20_000, 60_000.0)
    assert p.p_value == 0.0 and math.isfinite(p.log10_p_value) and p.log10_p_value < -300
    json.dumps(p.__dict__, allow_nan=False)
    tiny = PValue.from_log(5.0, -800.0, "exact")
    assert tiny.p_value == 0.0 and tiny.log10_p_value == pytest.approx(-800.0 / LN10)
    assert tiny.log_p_value == pytest.approx(-800.0)


@pytest.mark.parametrize(
    "fields",
    [
        {"score": math.nan, "p_value": 1.0, "log10_p_value": 0.0},
        {"score": 1.0, "p_value": math.inf, "log10_p_value": 0.0},
        {"score": 1.0, "p_value": 0.0, "log10_p_value": -math.inf},
        {"score": 1.0, "p_value": 0.5, "log10_p_value": 0.1},
        {"score": 1.0, "p_value": 1.5, "log10_p_value": 0.0},
        {"score": 1.0, "p_value": 0.5, "log10_p_value": -1.0},
        {"score": 1.0, "p_value": 0.0, "log10_p_value": -2.0},
    ],
    ids=["nan_score", "inf_p", "inf_log10", "log10_positive", "p_above_1", "p_mismatch", "p_0"],
)
def test_pvalue_rejects_invalid(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PValue(**fields, method="exact")


def test_pvalue_rejects_unknown_method() -> None:
    with pytest.raises(ValueError, match="method"):
        PValue(1.0, 1.0, 0.0, "bootstrap")  # type: ignore[arg-type]


@pytest.mark.parametrize(("alpha", "expected"), [(0.05, 13), (0.01, 28), (0.001, 50)])
def test_min_scored_tokens_values(alpha: float, expected: int) -> None:
    got = min_scored_tokens(alpha)
    assert got == expected
    # The definition: the first M whose typical watermarked score (1.5 M) reaches alpha.
    log_alpha = math.log(alpha)
    assert aaronson_log_sf(got, 1.5 * got) < log_alpha
    assert all(aaronson_log_sf(m, 1.5 * m) >= log_alpha for m in range(1, got))


def test_min_scored_tokens_exceeds_case_c5() -> None:
    # Case C5: 20 scored tokens cannot reach alpha = 0.01 even when watermarked, so a
    # non-significant 20-token text is insufficient evidence.
    assert min_scored_tokens(0.01) > 20


def test_min_scored_tokens_tiny_alpha_uses_log_path() -> None:
    # Below gammaincc's range the scan runs on the exact log-space path and still agrees.
    m = min_scored_tokens(1e-290)
    assert aaronson_log_sf(m, 1.5 * m) < math.log(1e-290) <= aaronson_log_sf(m - 1, 1.5 * (m - 1))


@pytest.mark.parametrize(
    ("alpha", "mean_score"), [(0.0, 1.5), (1.0, 1.5), (0.01, 1.0), (0.01, math.nan), (0.01, 1e-4)]
)
def test_min_scored_tokens_rejects(alpha: float, mean_score: float) -> None:
    with pytest.raises(ValueError, match="expected"):
        min_scored_tokens(alpha, mean_score)


def test_min_scored_tokens_gives_up_past_the_cap() -> None:
    with pytest.raises(ValueError, match="needs more than"):
        min_scored_tokens(0.01, 1.0001)


def test_gamma_null_is_the_law_of_the_aaronson_sum() -> None:
    # Sanity on the null law itself (Aaronson & Kirchner 2023): Σ -ln(1-U) over M uniforms is
    # Gamma(M, 1); KS at alpha = 0.001 on 5,000 sums with M = 30 (seed fixed).
    rng = np.random.default_rng(7)
    sums = -np.log1p(-rng.random((5000, 30))).sum(axis=1)
    assert stats.kstest(sums, stats.gamma(30).cdf).pvalue > 0.001
