"""Score families (detector/scores.py, detector/chernoff.py): per-token terms, log-MGFs,
Chernoff bounds against exact tails and continuous optima, parameters, the registry, ANLPPT.

Statistical assertions name their α and why; numerical ones their tolerance and why.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from detector.chernoff import ChernoffTail, lambda_grid
from detector.scores import (
    AARONSON,
    SCORE_NAMES,
    SCORES,
    LattimoreShape,
    LiShape,
    aaronson_terms,
    anlppt,
    lattimore_log_mgf,
    lattimore_score,
    lattimore_terms,
    li_log_mgf,
    li_score,
    li_terms,
    resolve_scores,
    u_chernoff,
    u_log_mgf,
    u_score,
    u_terms,
)
from detector.stats import PValue, aaronson_p_value, irwin_hall_log_sf

# r values from the smallest pivot the PRF can emit to the largest (1 − 2^−53).
EDGE_PIVOTS = np.array([2.0**-54, 1e-300, 1e-17, 0.25, 0.5, 0.999, 0.9995, 1.0 - 2.0**-53])


def test_registry_names_match() -> None:
    assert list(SCORES) == ["aaronson", "u", "li", "lattimore"] == list(SCORE_NAMES)
    assert all(name == SCORES[name].name for name in SCORES)
    assert SCORES["li"].params == {"delta": 0.1}
    assert SCORES["lattimore"].params == {"epsilon": 1e-3}
    with pytest.raises(TypeError):
        SCORES["other"] = AARONSON  # type: ignore[index]


# --- per-token terms -------------------------------------------------------------------


def test_aaronson_term_is_minus_log_one_minus_r() -> None:
    r = np.array([1e-300, 1e-17, 0.25, 0.5, 0.999, 1.0 - 2.0**-53])
    terms = aaronson_terms(r)
    assert terms.dtype == np.float64
    assert terms[0] == pytest.approx(1e-300, rel=1e-15)  # log1p keeps tiny r exact
    assert terms[1] == pytest.approx(1e-17, rel=1e-15)
    assert terms[2:5] == pytest.approx([-math.log(0.75), math.log(2.0), -math.log(0.001)])
    assert math.isfinite(terms[5]) and terms[5] == pytest.approx(53 * math.log(2.0))


def test_u_term_is_the_pivot() -> None:
    r = np.array([0.1, 0.7])
    terms = u_terms(r)
    assert terms.tolist() == [0.1, 0.7] and terms is not r


@pytest.mark.parametrize(
    ("delta", "k", "q"),
    [(0.1, 1, 0.1), (0.3, 1, 0.3), (0.5, 2, 0.0), (0.6, 2, 0.2), (0.75, 4, 0.0), (2 / 3, 3, 0.0)],
    ids=lambda v: str(round(v, 4)),
)
def test_li_constants(delta: float, k: int, q: float) -> None:
    # k = floor(1/(1 − Δ)), q = 1 − k(1 − Δ) (MPFR paper App. E.3); Δ = 2/3 must give q = 0
    # although 1/(1 − 2/3) is 2.9999999999999996 in floating point.
    shape = LiShape.of(delta)
    assert (shape.k, shape.q) == pytest.approx((k, q), abs=1e-12)
    assert shape.h_max == pytest.approx(math.log(k + (1 if q > 0 else 0)))


@pytest.mark.parametrize("delta", [0.1, 0.3, 0.6, 0.5])
def test_li_term_matches_the_formula(delta: float) -> None:
    # h(r) = ln(k r^{Δ/(1−Δ)} + 1{q>0} r^{(1−q)/q}), evaluated naively where that is safe
    # (moderate r), rel 1e-12; finite at the PRF's extreme pivots (log-space evaluation).
    shape = LiShape.of(delta)
    r = np.array([0.01, 0.2, 0.5, 0.9, 0.999])
    naive = np.log(shape.k * r**shape.a + (r**shape.b if shape.q > 0 else 0.0))
    assert li_terms(r, shape) == pytest.approx(naive, rel=1e-12)
    edge = li_terms(EDGE_PIVOTS, shape)
    assert np.all(np.isfinite(edge)) and np.all(edge <= shape.h_max + 1e-15)


def test_lattimore_term_matches_the_formula() -> None:
    shape = LattimoreShape.of(1e-3)
    r = np.array([0.0 + 1e-12, 0.5, 0.99, 0.999, 0.9995, 1.0 - 2.0**-53])
    expected = [
        1.0 - (2 - math.sqrt(1e-3)),
        math.sqrt(2.0) - (2 - math.sqrt(1e-3)),
        10.0 - (2 - math.sqrt(1e-3)),
    ]
    terms = lattimore_terms(r, shape)
    assert terms[:3] == pytest.approx(expected, rel=1e-9)
    # Truncated at ε^{-1/2} for r >= 1 − ε: bounded by h_max.
    assert terms[3:] == pytest.approx([shape.h_max] * 3, rel=1e-9)


def test_h0_means() -> None:
    # E[h(U)]: U-score 1/2; Lattimore 0 by its centring (App. E.4); Li −KL < 0 (a log-likelihood
    # ratio). Checked against 10^6 fixed-seed uniforms; tolerance 5 standard errors.
    u = np.random.default_rng(11).random(1_000_000)
    for terms, mean in [
        (u_terms(u), 0.5),
        (lattimore_terms(u, LattimoreShape.of(1e-3)), 0.0),
        (li_terms(u, LiShape.of(0.1)), None),
    ]:
        se = terms.std() / math.sqrt(u.size)
        if mean is None:
            assert terms.mean() < 0.0
        else:
            assert abs(terms.mean() - mean) < 5 * se


# --- log moment generating functions ---------------------------------------------------


def test_u_log_mgf_closed_form() -> None:
    lam = np.array([1e-6, 1e-3, 0.5, 3.0, 40.0, 1e4])
    expected = [math.log(math.expm1(v) / v) if v < 700 else v - math.log(v) for v in lam]
    assert u_log_mgf(lam) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("delta", [0.1, 0.3, 0.6])
def test_li_log_mgf_integer_lambda_closed_forms(delta: float) -> None:
    # λ = 1: E[e^{h}] = E[likelihood ratio] = 1, so Λ(1) = 0; λ = 2: expand the square,
    # k²/(2a+1) + 2k/(a+b+1) + 1/(2b+1). Quadrature returns an upper bound (value + error
    # estimate), so it may exceed the truth by ~1e-10 relative, never fall below it.
    s = LiShape.of(delta)
    k, a, b = s.k, s.a, s.b
    two = math.log(k * k / (2 * a + 1) + 2 * k / (a + b + 1) + 1 / (2 * b + 1))
    for lam, exact in [(1.0, 0.0), (2.0, two)]:
        got = li_log_mgf(lam, s)
        assert exact - 1e-14 <= got <= exact + 1e-9, (lam, got, exact)


@pytest.mark.parametrize("delta", [0.1, 0.6])
@pytest.mark.parametrize("lam", [1e-4, 0.3, 7.0, 300.0, 1e4])
def test_li_log_mgf_against_independent_quadrature(delta: float, lam: float) -> None:
    # The reference integrates (k r^a + r^b)^λ in r on a fine breakpoint grid (no substitution,
    # no normalisation): a different route to the same number. Tolerance 1e-8 relative to |Λ|
    # (+1e-12), well above both quadratures' errors.
    s = LiShape.of(delta)
    points = [0.0, 1e-12, 1e-8, 1e-5, 1e-3, 0.05, 0.3, 0.7, 0.9, 0.99, 0.999, 0.9999, 1 - 1e-6, 1]

    def integrand(r: float) -> float:
        return math.exp(lam * (math.log(s.k * r**s.a + r**s.b) - s.h_max)) if r > 0 else 0.0

    total = sum(
        integrate.quad(integrand, x0, x1, epsabs=0, epsrel=1e-12, limit=400)[0]
        for x0, x1 in itertools.pairwise(points)
    )
    reference = lam * s.h_max + math.log(total)
    got = li_log_mgf(lam, s)
    assert got >= reference - 1e-12 * max(1.0, abs(reference))
    assert got == pytest.approx(reference, rel=1e-8, abs=1e-12)


# Λ_PL(λ) for ε = 1e-3 from mpmath at 30 digits: −λ(2 − √ε) + ln(ε e^{λ ε^{−1/2}} +
# ∫_ε^1 e^{λ v^{−1/2}} dv) (mpmath.quad on [ε, 2ε, 10ε, 0.1, 1]).
LATTIMORE_MPMATH = [
    (0.01, 0.00021249485837368954),
    (1.0, 22.814446782211174),
    (10.0, 289.6426035305434),
    (300.0, 8889.412269069633),
]


@pytest.mark.parametrize(("lam", "reference"), LATTIMORE_MPMATH, ids=lambda v: str(v))
def test_lattimore_log_mgf_against_mpmath(lam: float, reference: float) -> None:
    got = lattimore_log_mgf(lam, LattimoreShape.of(1e-3))
    assert got >= reference - 1e-12 * abs(reference)  # an upper bound, never below the truth
    assert got == pytest.approx(reference, rel=1e-9)


# --- Chernoff bounds -------------------------------------------------------------------


@pytest.mark.parametrize("m", [5, 30, 64])
def test_u_chernoff_is_an_upper_bound_on_the_exact_tail(m: int) -> None:
    # The bound is valid: ln p_chernoff >= ln p_exact (Irwin–Hall) everywhere, and it is not
    # vacuous: the gap is at most ½ ln(2πM) + 2 nats (the Bahadur–Rao prefactor of a Chernoff
    # bound is ~ 1/(λσ√(2πM)); +2 covers λσ in the far tail of these M).
    tail = u_score()
    sums = np.linspace(0.55 * m, 0.99 * m, 25)
    chernoff = u_chernoff().log_sf_many(m, sums)
    exact = np.array([irwin_hall_log_sf(m, float(s)) for s in sums])
    assert np.all(chernoff >= exact - 1e-12)
    assert np.all(chernoff - exact <= 0.5 * math.log(2 * math.pi * m) + 2.0)
    assert tail.log_sf(m, sums)[1] == "exact"  # M <= 64 reports the exact tail, not the bound


def continuous_chernoff(log_mgf, m: int, s: float, upper: float) -> float:  # type: ignore[no-untyped-def]
    """inf over λ in [0, upper] of M Λ(λ) − λ s by bounded scalar minimisation (reference)."""
    result = optimize.minimize_scalar(
        lambda lam: m * log_mgf(lam) - lam * s if lam > 0 else 0.0,
        bounds=(1e-9, upper),
        method="bounded",
        options={"xatol": 1e-10},
    )
    return min(0.0, float(result.fun))


@pytest.mark.parametrize(
    ("name", "m", "ratio"),
    [
        ("u", 300, 0.55),
        ("u", 300, 0.8),
        ("u", 5000, 0.52),
        ("li", 64, 0.2),
        ("li", 500, 0.05),
        ("li", 128, 0.5),
        ("lattimore", 64, 1.0),
        ("lattimore", 1000, 0.3),
        ("lattimore", 128, 5.0),
    ],
)
def test_grid_bound_is_close_to_the_continuous_infimum(name: str, m: int, ratio: float) -> None:
    # The grid minimum is >= the continuous infimum (it is one of the candidates) and within
    # 3e-4 relative of it (the grid ratio 1.02 costs ≈ (0.02)²/4 = 1e-4 at an interior optimum).
    family = SCORES[name]
    s = ratio * m
    grid = float(family.log_sf(m, np.array([s]))[0][0])
    if name == "u":
        reference = continuous_chernoff(lambda v: float(u_log_mgf(np.array([v]))[0]), m, s, 1e4)
    elif name == "li":
        shape = LiShape.of(0.1)
        reference = continuous_chernoff(lambda v: li_log_mgf(v, shape), m, s, 1e3)
    else:
        shape_pl = LattimoreShape.of(1e-3)
        reference = continuous_chernoff(lambda v: lattimore_log_mgf(v, shape_pl), m, s, 1e2)
    assert reference < -1.0  # a real tail, not the trivial bound
    assert grid >= reference - 1e-9 * abs(reference)
    assert grid == pytest.approx(reference, rel=3e-4)


@pytest.mark.parametrize("name", ["u", "li", "lattimore"])
def test_chernoff_p_values_are_finite_and_monotone(name: str) -> None:
    # Finite ln p for every finite S, including S at or past M·h_max (float rounding can reach
    # it); non-increasing in S; 0 at and below the H0 mean; M = 0 gives p = 1.
    family = SCORES[name]
    for m in [1, 7, 100, 100_000]:
        h_max = {"u": 1.0, "li": math.log(2.0), "lattimore": LattimoreShape.of(1e-3).h_max}[name]
        sums = np.linspace(-2.0 * m, 1.5 * h_max * m, 300)
        log_p, _ = family.log_sf(m, sums)
        assert np.all(np.isfinite(log_p)) and np.all(log_p <= 0.0)
        assert np.all(np.diff(log_p) <= 1e-12)
        assert log_p[0] == 0.0
    assert family.log_sf(0, np.array([5.0]))[0].tolist() == [0.0]


def test_chernoff_rejects_bad_input() -> None:
    tail = ChernoffTail(lambda_grid(0.1, 1.0), np.zeros(lambda_grid(0.1, 1.0).size), 0.0, 1.0)
    for m, s in [(-1, [1.0]), (True, [1.0]), (2, [math.nan]), (2, [[1.0]])]:
        with pytest.raises(ValueError, match="expected"):
            tail.log_sf_many(m, s)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="increasing"):
        ChernoffTail(np.array([1.0, 0.5]), np.zeros(2), 0.0, 1.0)


# --- parameters and the registry -------------------------------------------------------


@pytest.mark.parametrize(
    "delta", [0.0, 1.0, -0.1, math.nan, math.inf, True, "0.1", 1 - 1e-9], ids=repr
)
def test_li_rejects_bad_delta(delta: object) -> None:
    with pytest.raises(ValueError, match="li delta"):
        li_score(delta)  # type: ignore[arg-type]


@pytest.mark.parametrize("epsilon", [0.0, 1.0, -1e-3, math.nan, math.inf, False, "1e-3"], ids=repr)
def test_lattimore_rejects_bad_epsilon(epsilon: object) -> None:
    with pytest.raises(ValueError, match="lattimore epsilon"):
        lattimore_score(epsilon)  # type: ignore[arg-type]


def test_non_default_parameters() -> None:
    li = li_score(0.3)
    pl = lattimore_score(1e-4)
    assert (li.name, li.params, pl.name, pl.params) == (
        "li",
        {"delta": 0.3},
        "lattimore",
        {"epsilon": 1e-4},
    )
    assert li_score(0.3) is li  # cached: the grid is tabulated once per parameter
    r = np.array([0.9, 0.99, 0.5])
    assert li.evaluate(r)[1].score != SCORES["li"].evaluate(r)[1].score


def test_resolve_scores() -> None:
    assert [f.name for f in resolve_scores(())] == ["aaronson"]
    assert [f.name for f in resolve_scores(["lattimore", "u"])] == ["aaronson", "lattimore", "u"]
    assert [f.name for f in resolve_scores(["u", "aaronson"])] == ["aaronson", "u"]
    assert resolve_scores([li_score(0.3)])[1].params == {"delta": 0.3}
    for bad, message in [
        ("li", "sequence of names"),
        (["pl"], "expected scores from"),
        (["li", "li"], "requested twice"),
        (["li", li_score(0.3)], "requested twice"),
        ([3], "expected scores from"),
    ]:
        with pytest.raises(ValueError, match=message):
            resolve_scores(bad)  # type: ignore[arg-type]


# --- evaluate, the exact Aaronson path, ANLPPT ------------------------------------------


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
    for name in SCORE_NAMES:
        empty_terms, empty = SCORES[name].evaluate(np.zeros(0))
        assert empty_terms.shape == (0,) and (empty.p_value, empty.log10_p_value) == (1.0, 0.0)


def test_evaluate_many_matches_evaluate() -> None:
    pivots = np.random.default_rng(5).random((6, 40))
    for name in SCORE_NAMES:
        log_p, method = SCORES[name].evaluate_many(pivots)
        single = [SCORES[name].evaluate(row)[1] for row in pivots]
        assert log_p == pytest.approx([p.log_p_value for p in single], rel=1e-12, abs=1e-300)
        assert {p.method for p in single} == {method}


@pytest.mark.parametrize(
    "pivots", [np.array([0.0, 0.5]), np.array([0.5, 1.0]), np.array([[0.5]])], ids=str
)
@pytest.mark.parametrize("name", SCORE_NAMES)
def test_evaluate_rejects_bad_pivots(name: str, pivots: np.ndarray) -> None:
    with pytest.raises(ValueError, match="pivots"):
        SCORES[name].evaluate(pivots)


def test_anlppt() -> None:
    p = PValue.from_log(30.0, -20.0, "exact")
    assert anlppt(p, 10) == pytest.approx(2.0)
    assert anlppt(p, 0) == 0.0
    assert anlppt(PValue.from_log(0.0, 0.0, "exact"), 5) == 0.0
    with pytest.raises(ValueError, match="num_scored"):
        anlppt(p, -1)
