"""Watermark score families: per-token terms of the pivots and the p-value of their sum.

Glossary (docs/design.md §4): the pivot r_t = U(k, ℓ_t, w_t, 1) is the uniform behind the observed
token's first clock; under H0 the pivots of the scored set T (M = |T|) are i.i.d. U(0, 1), and
the keyed race makes them large in watermarked text. A score family maps each pivot to a term
h(r_t), sums them over T into S and turns S into a p-value under H0 (natural logs throughout).

Families (MPFR paper App. E; names are the keys of ``Detection.scores``):
- ``aaronson`` (Aaronson & Kirchner 2023; App. E, Alg. 8): h(r) = −ln(1 − r), Exp(1) under H0,
  so S ~ Gamma(M, 1) and p = Q(M, S) exactly.
- ``u`` (the U-score of Hu & Huang 2024; App. E.1-E.2): h(r) = r, S ~ Irwin–Hall(M) under H0;
  p exact for M <= ``U_EXACT_MAX_M``, else the Chernoff bound
  inf_{λ>=0} exp(M ln((e^λ − 1)/λ) − λS).
- ``li`` (Li et al. 2025; App. E.3): with k = ⌊1/(1 − Δ)⌋ and q = 1 − k(1 − Δ),
  h(r) = ln(k r^{Δ/(1−Δ)} + 1{q>0} r^{(1−q)/q}), the log-likelihood ratio of the least
  favourable law in {P: max P <= 1 − Δ}; default Δ = 0.1; p by the Chernoff bound with
  Λ(λ) = ln E[e^{λh(U)}] by quadrature.
- ``lattimore`` (Lattimore 2026, truncated power law; App. E.4):
  h(r) = min(ε^{−1/2}, (1 − r)^{−1/2}) − (2 − √ε), E[h(U)] = 0; default ε = 1e−3; p by the
  Chernoff bound, Λ by quadrature.
Every p-value is exact or a valid upper bound, and its ``method`` says which.

Shapes: T scored tokens; pivots and terms are (T,) float64 (or (N, T) for ``evaluate_many``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from detector.chernoff import ChernoffTail, lambda_grid, peak_edges, quad_segments
from detector.stats import (
    U_EXACT_MAX_M,
    PValue,
    PValueMethod,
    aaronson_log_sf_many,
    irwin_hall_log_sf_many,
)

Terms = Callable[[NDArray[np.float64]], NDArray[np.float64]]
LogTail = Callable[[int, NDArray[np.float64]], tuple[NDArray[np.float64], PValueMethod]]

P_VALUES_VERSION: Final = 2
"""Version of the scores' p-value computations, frozen by
``tests/goldens/detector_v{P_VALUES_VERSION}.json``: a deliberate change (a formula, the λ
grid, the quadrature, ``U_EXACT_MAX_M``) bumps it and freezes a new file with
``python -m tests.goldens.make_detector_goldens``. 2: the Aaronson tail from scipy's
``gammaincc`` above 1e-280 (v1: the log-space series everywhere); values moved by <= 5e-12
relative, ~100x closer to mpmath."""

DEFAULT_LI_DELTA: Final = 0.1
DEFAULT_LATTIMORE_EPSILON: Final = 1e-3
MAX_LI_K: Final = 1_000_000


@dataclass(frozen=True, eq=False)
class ScoreFamily:
    """One score: its per-token term h(r) and the p-value of S = Σ h(r_t) over M tokens.

    Attributes:
        name: the key of this family in responses (``"aaronson"``, ``"u"``, ``"li"``,
            ``"lattimore"``).
        terms: (T,) float64 pivots in (0, 1) -> (T,) float64 finite terms (any array shape).
        log_sf: (M, (N,) float64 sums) -> ((N,) float64 natural-log p-values, method): exact
            or a valid upper bound, finite, in (−inf, 0].
        params: the family's parameters, e.g. ``{"delta": 0.1}`` (reported with the score).
        chernoff: the tabulated Chernoff tail behind ``log_sf`` where it uses one (U-score for
            M > ``U_EXACT_MAX_M``, Li, Lattimore), else None.
    """

    name: str
    terms: Terms
    log_sf: LogTail
    params: Mapping[str, float]
    chernoff: ChernoffTail | None = None

    def p_value(self, m: int, s: float) -> PValue:
        """The p-value of one sum S over M tokens as a ``PValue``."""
        log_p, method = self.log_sf(m, np.array([s], dtype=np.float64))
        return PValue.from_log(s, float(log_p[0]), method)

    def evaluate(self, pivots: NDArray[np.float64]) -> tuple[NDArray[np.float64], PValue]:
        """Per-token terms and the p-value of their sum.

        Args:
            pivots: (T,) float64 in (0, 1); T = 0 gives S = 0, p = 1.
        Returns:
            ((T,) float64 terms, ``PValue`` of S = Σ terms with M = T).
        Raises:
            ValueError: pivots not 1-D or outside (0, 1).
        """
        if pivots.ndim != 1:
            raise ValueError(f"expected pivots of shape (T,), got {pivots.shape}")
        _check_pivots(pivots)
        terms = self.terms(pivots)  # (T,)
        return terms, self.p_value(int(pivots.size), float(np.sum(terms)))

    def evaluate_many(self, pivots: NDArray[np.float64]) -> tuple[NDArray[np.float64], str]:
        """Log p-values of many texts with M scored tokens each (for simulations).

        Args:
            pivots: (N, M) float64 in (0, 1).
        Returns:
            ((N,) float64 natural-log p-values, method).
        """
        if pivots.ndim != 2:
            raise ValueError(f"expected pivots of shape (N, M), got {pivots.shape}")
        _check_pivots(pivots)
        sums = self.terms(pivots).sum(axis=1)  # (N,)
        return self.log_sf(int(pivots.shape[1]), sums)


def _check_pivots(pivots: NDArray[np.float64]) -> None:
    if pivots.size and not (pivots.min() > 0.0 and pivots.max() < 1.0):  # NaN fails too
        raise ValueError("expected pivots strictly inside (0, 1)")


def anlppt(p: PValue, num_scored: int) -> float:
    """ANLPPT = −ln p / M, the average negative log p-value per scored token (natural log).

    Args:
        p: the p-value. num_scored: M >= 0.
    Returns:
        nats per token, >= 0; 0.0 when M = 0 (no tokens, no evidence).
    Raises:
        ValueError: num_scored < 0.
    """
    if num_scored < 0:
        raise ValueError(f"expected num_scored >= 0, got {num_scored}")
    if num_scored == 0:
        return 0.0
    return max(0.0, -p.log_p_value / num_scored)


# --- Aaronson ---------------------------------------------------------------------------


def aaronson_terms(pivots: NDArray[np.float64]) -> NDArray[np.float64]:
    """Aaronson per-token term −ln(1 − r), Exp(1) under H0; float64 -> float64, same shape.

    ``-log1p(-r)`` keeps precision for r near 0; the PRF's uniforms stay below 1 (at most
    1 − 2^−53), so terms are at most 36.8 and always finite.
    """
    return np.asarray(-np.log1p(-pivots), dtype=np.float64)


def _aaronson_log_sf(m: int, s: NDArray[np.float64]) -> tuple[NDArray[np.float64], PValueMethod]:
    return aaronson_log_sf_many(m, s), "exact"


AARONSON: Final = ScoreFamily("aaronson", aaronson_terms, _aaronson_log_sf, {})


# --- U-score ----------------------------------------------------------------------------


def u_terms(pivots: NDArray[np.float64]) -> NDArray[np.float64]:
    """U-score per-token term h(r) = r (U(0, 1) under H0); float64 -> float64, same shape."""
    return np.array(pivots, dtype=np.float64, copy=True)


def u_log_mgf(lambdas: NDArray[np.float64]) -> NDArray[np.float64]:
    """Λ_U(λ) = ln E[e^{λU}] = ln((e^λ − 1)/λ), computed as λ + ln(−expm1(−λ)) − ln λ.

    Args:
        lambdas: (G,) float64 > 0.
    Returns:
        (G,) float64, exact to rounding (closed form).
    """
    return np.asarray(lambdas + np.log(-np.expm1(-lambdas)) - np.log(lambdas), dtype=np.float64)


@functools.cache
def u_chernoff() -> ChernoffTail:
    lambdas = lambda_grid(1e-4, 1e6)  # (G,)
    return ChernoffTail(lambdas, u_log_mgf(lambdas), mean=0.5, h_max=1.0)


def _u_log_sf(m: int, s: NDArray[np.float64]) -> tuple[NDArray[np.float64], PValueMethod]:
    if m <= U_EXACT_MAX_M:
        return irwin_hall_log_sf_many(m, s), "exact"
    return u_chernoff().log_sf_many(m, s), "chernoff_bound"


@functools.cache
def u_score() -> ScoreFamily:
    """The U-score family: h(r) = r; exact Irwin–Hall p for M <= ``U_EXACT_MAX_M``, else the
    Chernoff bound with Λ_U in closed form (``u_log_mgf``)."""
    return ScoreFamily("u", u_terms, _u_log_sf, {}, u_chernoff())


# --- Li et al. (2025) ---------------------------------------------------------------------


@dataclass(frozen=True)
class LiShape:
    """The constants of the Li et al. score for one Δ.

    Attributes:
        delta: Δ in (0, 1). k: ⌊1/(1 − Δ)⌋ >= 1. q: 1 − k(1 − Δ) in [0, 1 − Δ) (0 when
        1/(1 − Δ) is an integer, up to 1e-12). a: Δ/(1 − Δ), the exponent of the k atoms.
        b: (1 − q)/q, the exponent of the q atom (inf when q = 0, unused).
    """

    delta: float
    k: int
    q: float
    a: float
    b: float

    @classmethod
    def of(cls, delta: float) -> LiShape:
        """Validate Δ and derive the constants. Raises ValueError for Δ outside (0, 1) or
        k above ``MAX_LI_K``."""
        if isinstance(delta, bool) or not isinstance(delta, float | int):
            raise ValueError(f"expected li delta a number in (0, 1), got {delta!r}")
        delta = float(delta)
        if not (math.isfinite(delta) and 0.0 < delta < 1.0):
            raise ValueError(f"expected li delta in (0, 1), got {delta!r}")
        ratio = 1.0 / (1.0 - delta)
        k = math.floor(ratio + 1e-12)
        if k > MAX_LI_K:
            raise ValueError(f"expected li delta <= {1 - 1 / MAX_LI_K}, got {delta!r}")
        q = 1.0 - k * (1.0 - delta)
        if q < 1e-12:
            q = 0.0
        b = (1.0 - q) / q if q > 0.0 else math.inf
        return cls(delta, k, q, delta / (1.0 - delta), b)

    @property
    def h_max(self) -> float:
        """sup h = ln(k + 1{q > 0}), approached as r -> 1."""
        return math.log(self.k + (1 if self.q > 0.0 else 0))

    def h_of_x(self, x: float) -> float:
        """h(e^{−x}) − h_max for x >= 0 (scalar, for quadrature), <= 0."""
        first = math.log(self.k) - self.a * x
        if self.q == 0.0:
            return first - self.h_max
        second = -self.b * x
        high, low = max(first, second), min(first, second)
        return high + math.log1p(math.exp(low - high)) - self.h_max


def li_terms(pivots: NDArray[np.float64], shape: LiShape) -> NDArray[np.float64]:
    """Li et al. per-token term h(r) = ln(k r^a + 1{q>0} r^b), in log space:
    logaddexp(ln k + a ln r, b ln r); float64 -> float64, same shape, finite for r in (0, 1)."""
    log_r = np.log(pivots)
    first = math.log(shape.k) + shape.a * log_r
    if shape.q == 0.0:
        return np.asarray(first, dtype=np.float64)
    return np.asarray(np.logaddexp(first, shape.b * log_r), dtype=np.float64)


def li_log_mgf(lam: float, shape: LiShape) -> float:
    """Upper bound on Λ_Li(λ) = ln E[e^{λ h(U)}] for one λ > 0.

    q = 0: closed form, E[(k U^a)^λ] = k^λ / (aλ + 1). Otherwise by quadrature in x = −ln r
    (r = e^{−x}, dr = e^{−x} dx), which removes the r -> 0 singularity of h:
    E[e^{λ(h − h_max)}] = ∫_0^∞ exp(λ(h(e^{−x}) − h_max) − x) dx, an integrand in (0, 1] that
    peaks at x = 0 with width ≈ 1/(1 + λ(ka + b)/(k + 1)); Λ = λ h_max + ln(value + error).
    """
    if shape.q == 0.0:
        return lam * math.log(shape.k) - math.log1p(shape.a * lam)
    width = 1.0 / (1.0 + lam * (shape.k * shape.a + shape.b) / (shape.k + 1))
    edges = peak_edges(0.0, 64.0, width)

    def integrand(x: float) -> float:
        return math.exp(lam * shape.h_of_x(x) - x)

    value, error = quad_segments(integrand, edges, tail=True)
    return lam * shape.h_max + math.log(value + error)


def _li_mean(shape: LiShape) -> float:
    """E[h(U)] = ∫_0^∞ h(e^{−x}) e^{−x} dx by quadrature (negative: h is a log-likelihood
    ratio, so E_H0[h] = −KL <= 0)."""
    from scipy import integrate

    result = integrate.quad(
        lambda x: (shape.h_of_x(x) + shape.h_max) * math.exp(-x),
        0.0,
        math.inf,
        limit=200,
        full_output=1,
    )
    return float(result[0])


@functools.lru_cache(maxsize=16)
def _li_chernoff(shape: LiShape) -> ChernoffTail:
    lambdas = lambda_grid(1e-4, 1e4)  # (G,)
    log_mgf = np.array([li_log_mgf(float(lam), shape) for lam in lambdas])  # (G,)
    return ChernoffTail(lambdas, log_mgf, mean=_li_mean(shape), h_max=shape.h_max)


def _chernoff_log_sf(
    m: int, s: NDArray[np.float64], tail: ChernoffTail
) -> tuple[NDArray[np.float64], PValueMethod]:
    return tail.log_sf_many(m, s), "chernoff_bound"


@functools.lru_cache(maxsize=16)
def li_score(delta: float = DEFAULT_LI_DELTA) -> ScoreFamily:
    """The Li et al. (2025) family for Δ (default 0.1); p by the Chernoff bound.

    The first call for a Δ tabulates Λ on the λ grid by quadrature (about a second).
    Raises:
        ValueError: Δ outside (0, 1) or too close to 1 (k > ``MAX_LI_K``).
    """
    shape = LiShape.of(delta)
    tail = _li_chernoff(shape)
    return ScoreFamily(
        "li",
        functools.partial(li_terms, shape=shape),
        functools.partial(_chernoff_log_sf, tail=tail),
        {"delta": shape.delta},
        tail,
    )


# --- Lattimore (2026) ---------------------------------------------------------------------


@dataclass(frozen=True)
class LattimoreShape:
    """Constants of the truncated power-law score for one ε.

    Attributes:
        epsilon: ε in (0, 1). cap: ε^{−1/2}, the truncation. centre: 2 − √ε = E[min(cap,
        (1 − U)^{−1/2})], so E[h(U)] = 0.
    """

    epsilon: float
    cap: float
    centre: float

    @classmethod
    def of(cls, epsilon: float) -> LattimoreShape:
        """Validate ε and derive the constants. Raises ValueError for ε outside (0, 1)."""
        if isinstance(epsilon, bool) or not isinstance(epsilon, float | int):
            raise ValueError(f"expected lattimore epsilon a number in (0, 1), got {epsilon!r}")
        epsilon = float(epsilon)
        if not (math.isfinite(epsilon) and 0.0 < epsilon < 1.0):
            raise ValueError(f"expected lattimore epsilon in (0, 1), got {epsilon!r}")
        return cls(epsilon, epsilon**-0.5, 2.0 - math.sqrt(epsilon))

    @property
    def h_max(self) -> float:
        """sup h = ε^{−1/2} − (2 − √ε), attained for r >= 1 − ε."""
        return self.cap - self.centre


def lattimore_terms(pivots: NDArray[np.float64], shape: LattimoreShape) -> NDArray[np.float64]:
    """Lattimore per-token term min(ε^{−1/2}, (1 − r)^{−1/2}) − (2 − √ε); float64 -> float64,
    same shape, in [√ε − 1, h_max]."""
    return np.asarray(
        np.minimum(shape.cap, 1.0 / np.sqrt(1.0 - pivots)) - shape.centre, dtype=np.float64
    )


def lattimore_log_mgf(lam: float, shape: LattimoreShape) -> float:
    """Upper bound on Λ_PL(λ) = ln E[e^{λ h(U)}] for one λ > 0.

    With W = ε^{−1/2}: the truncated region r >= 1 − ε gives ε·e^{λ h_max}; below it,
    w = (1 − r)^{−1/2} in [1, W] (dr = 2 w^{−3} dw) and y = W − w give
    E[e^{λ(h − h_max)}] = ε + ∫_0^{W−1} 2 (W − y)^{−3} e^{−λy} dy, a bounded smooth integrand
    (the (1 − r)^{−1/2} singularity at r -> 1 is gone), split at y = 4^j/λ near its peak and
    at W − 1 − 4^j near the far end; Λ = λ h_max + ln(value + error).
    """
    top = shape.cap - 1.0
    near = peak_edges(0.0, top, 1.0 / (lam + 3.0 / shape.cap))
    far = top - peak_edges(0.0, top, 1.0)
    edges = np.unique(np.concatenate([near, far]))

    def integrand(y: float) -> float:
        return 2.0 * (shape.cap - y) ** -3 * math.exp(-lam * y)

    value, error = quad_segments(integrand, edges)
    return lam * shape.h_max + math.log(shape.epsilon + value + error)


@functools.lru_cache(maxsize=16)
def _lattimore_chernoff(shape: LattimoreShape) -> ChernoffTail:
    lambdas = lambda_grid(1e-5, 1e3)  # (G,)
    log_mgf = np.array([lattimore_log_mgf(float(lam), shape) for lam in lambdas])  # (G,)
    return ChernoffTail(lambdas, log_mgf, mean=0.0, h_max=shape.h_max)


@functools.lru_cache(maxsize=16)
def lattimore_score(epsilon: float = DEFAULT_LATTIMORE_EPSILON) -> ScoreFamily:
    """The Lattimore (2026) truncated power-law family for ε (default 1e-3); p by the
    Chernoff bound. The first call for an ε tabulates Λ by quadrature (about a second).

    Raises:
        ValueError: ε outside (0, 1).
    """
    shape = LattimoreShape.of(epsilon)
    tail = _lattimore_chernoff(shape)
    return ScoreFamily(
        "lattimore",
        functools.partial(lattimore_terms, shape=shape),
        functools.partial(_chernoff_log_sf, tail=tail),
        {"epsilon": shape.epsilon},
        tail,
    )


# --- the registry -------------------------------------------------------------------------


class _Registry(Mapping[str, ScoreFamily]):
    """Read-only name -> family (default parameters); a family is built on first access."""

    _factories: Final[Mapping[str, Callable[[], ScoreFamily]]] = {
        "aaronson": lambda: AARONSON,
        "u": u_score,
        "li": li_score,
        "lattimore": lattimore_score,
    }

    def __getitem__(self, name: str) -> ScoreFamily:
        return self._factories[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)


SCORES: Final[Mapping[str, ScoreFamily]] = _Registry()
"""The score families by name, with default parameters: ``aaronson``, ``u``, ``li``
(Δ = 0.1), ``lattimore`` (ε = 1e-3)."""

SCORE_NAMES: Final = tuple(SCORES)


def resolve_scores(scores: Sequence[str | ScoreFamily]) -> tuple[ScoreFamily, ...]:
    """The families to compute: Aaronson first (always: the verdict, the evidence ``score`` and
    the spans use it), then the requested others in order.

    Args:
        scores: names from ``SCORE_NAMES`` (default parameters) or ``ScoreFamily`` instances
            (e.g. ``li_score(0.2)``).
    Raises:
        ValueError: a string, an unknown name, a family named twice, or a family named
            ``aaronson`` that is not ``AARONSON``.
    """
    if isinstance(scores, str | bytes):
        raise ValueError(f"expected scores to be a sequence of names, got {scores!r}")
    chosen: dict[str, ScoreFamily] = {"aaronson": AARONSON}
    for item in scores:
        if isinstance(item, ScoreFamily):
            family = item
        elif isinstance(item, str) and item in SCORES:
            family = SCORES[item]
        else:
            raise ValueError(f"expected scores from {list(SCORE_NAMES)}, got {item!r}")
        if family.name == "aaronson":
            if family is not AARONSON:
                raise ValueError("the aaronson score has no parameters; pass 'aaronson'")
            continue
        if family.name in chosen:
            raise ValueError(f"score {family.name!r} requested twice")
        chosen[family.name] = family
    return tuple(chosen.values())
