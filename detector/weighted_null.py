"""The null law of a weighted Aaronson sum: P(S_w >= s) and P(S_w <= s) for S_w = Σ_t w_t E_t,
E_t i.i.d. Exp(1), weights fixed without the key (``detector.weighting``, ``detector.weighted``).

p-value, P(S_w >= s) under H0 (natural logs; never underflows):

1. *Mixture series* (exact to float rounding, every term positive). Let c = min w_t > 0 and
   group the positive weights into J distinct levels v_j (n_j positions, ρ_j = v_j / c >= 1).
   An Exp(1) scaled by ρ is a geometric number of Exp(1): ρE =_d Σ_{i=1}^{1+N} E_i with
   N ~ Geometric(1/ρ) on {0, 1, …} (so ρ_j G_j =_d Gamma(n_j + NB_j), NB_j ~ NegBin(n_j,
   1/ρ_j)), hence with n = Σ n_j and K = Σ_j NB_j (Moschopoulos 1985, the same mixture):

       P(S_w >= s) = Σ_{k>=0} P(K = k) Q(n + k, s/c).

   Truncated at k <= K0, the rest is bounded by P(K > K0) (Q <= 1), itself bounded by the
   Chernoff bound of K's negative-binomial MGF; K0 grows until that rest is below
   ``SERIES_REL_TOL`` of the sum. Float rounding and underflow of the pmf convolution are
   covered by a relative margin and an absolute allowance (``_series_log_tail``), so the value is
   a valid upper bound equal to the exact tail to ~1e-10 relative: ``method`` ``"exact"``.
   Cost O(J·K0²) with K0 ≈ Σ n_j (ρ_j − 1) + a few standard deviations: the weights are
   quantised to multiples of 1/``ENTROPY_WEIGHTING.levels`` (ρ <= levels), so a 128-token
   text costs well under a millisecond of convolution.
2. *Chernoff bound* (Markov on e^{θ S_w}), ln p <= inf_{θ ∈ [0, 1/max w)} (−θ s − Σ ln(1 −
   θ w_t)), convex in θ, solved by bisection on its derivative; any θ is a valid bound. Used
   when the series would need more than ``MAX_SERIES_TERMS`` terms or more than
   ``MAX_SERIES_LEVELS`` distinct weights, and below ln p = ``SERIES_MIN_LOG_P`` (``method``
   ``"chernoff_bound"``). The reported p is the smaller of the two valid bounds.

With all weights 1 the series is the single term Q(M, S): the plain Aaronson p (tested).

Sources: Aaronson & Kirchner (2023) for the score; Moschopoulos (1985), "The distribution of
the sum of independent gamma random variables", Ann. Inst. Stat. Math. 37, for the positive
mixture; the geometric-sum identity of the exponential law (e.g. Feller II, §I.3).

Shapes: M scored positions, J distinct weight levels. Weights w_t (M,) float64 >= 0; levels v_j
(J,) float64 > 0 with counts n_j (J,) int64; the score S_w and its natural-log p-value float64.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln

from detector.stats import PValueMethod, aaronson_log_sf

MAX_SERIES_TERMS: Final = 8_192
"""Largest K0 the mixture series may use (then the Chernoff bound alone): a few tenths of a
second of convolution per level; about 2,000 scored tokens at ρ <= 4."""
SERIES_MIN_LOG_P: Final = -650.0
"""Below this ln p (p < 1e-282) the series' underflow allowance would dominate it: the
Chernoff bound is reported instead (such a text is watermarked at any level anyway)."""
MAX_LOWER_SERIES_TERMS: Final = 2_048
"""Largest K0 of the lower-tail series (``weighted_log_cdf``; then the Chernoff bound): a few
tens of milliseconds at 16 levels. K's mean is Σ n_j (ρ_j − 1), so with weights spread over a
wide range (ρ up to 76 for ``LIKELIHOOD_RATIO``) a few dozen scored tokens reach it."""
MAX_SERIES_LEVELS: Final = 16
"""Most distinct positive weights the series handles (one NB convolution each)."""
SERIES_REL_TOL: Final = 1e-12
"""The truncated rest P(K > K0) must be below this fraction of the series' sum."""
_ROUNDING_MARGIN: Final = 1e-10  # relative: O(K0·eps) rounding of the positive sums
_TINY: Final = 2.3e-308  # above the largest float64 product lost to underflow, per product


def weighted_log_sf(weights: ArrayLike, s: float) -> tuple[float, PValueMethod]:
    """ln P(Σ_t w_t E_t >= s) for i.i.d. E_t ~ Exp(1): the weighted Aaronson log p-value.

    Args:
        weights: (M,) float64 w_t >= 0, finite (zeros drop out; all zero: p = 1).
        s: the observed S_w, finite (S_w <= 0 gives p = 1).
    Returns:
        (ln p in (−inf, 0], finite; method ``"exact"`` or ``"chernoff_bound"``): a valid
        upper bound on the tail (module docstring), the exact tail to ~1e-10 relative when
        ``"exact"``.
    Raises:
        ValueError: weights not 1-D, negative or not finite; s not finite.
    """
    levels, counts = _weight_levels(weights, s)
    if levels.size == 0 or s <= 0.0:
        return 0.0, "exact"
    if levels.size == 1:  # one level: S_w / v ~ Gamma(n, 1) exactly
        return aaronson_log_sf(int(counts[0]), s / float(levels[0])), "exact"
    return _smaller_bound(levels, counts, s, chernoff_log_sf(levels, counts, s), lower=False)


def chernoff_log_sf(levels: NDArray[np.float64], counts: NDArray[np.int64], s: float) -> float:
    """inf_θ (−θ s − Σ_j n_j ln(1 − θ v_j)) over θ ∈ [0, 1/max v), capped at 0.

    Args:
        levels: (J,) float64 distinct weights v_j > 0. counts: (J,) int64 n_j >= 1. s: S_w.
    Returns:
        a valid upper bound on ln P(S_w >= s) (finite, <= 0): every θ in range gives one; the
        θ is the root of the derivative found by 200 bisection steps.
    """
    v = np.asarray(levels, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if float(np.dot(n, v)) >= s:  # the mean is at or above s: θ = 0, p <= 1
        return 0.0
    low, high = 0.0, 1.0 / float(v.max())
    for _ in range(200):  # g(θ) = −s + Σ n v / (1 − θ v), increasing
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        if float(np.dot(n, v / (1.0 - mid * v))) < s:
            low = mid
        else:
            high = mid
    theta = low
    bound = -theta * s - float(np.dot(n, np.log1p(-theta * v)))
    return min(0.0, bound)


def _nb_log_pmf(k: NDArray[np.float64], n: int, q: float) -> NDArray[np.float64]:
    """ln P(NB = k) for NB ~ NegBin(n, q) (failures before the n-th success, success prob q)."""
    if q >= 1.0:
        return np.where(k == 0, 0.0, -np.inf)
    out = gammaln(k + n) - gammaln(n) - gammaln(k + 1.0) + n * math.log(q) + k * math.log1p(-q)
    return np.asarray(out, dtype=np.float64)


def _nb_tail_log_bound(n: NDArray[np.float64], q: NDArray[np.float64], k0: int) -> float:
    """A Chernoff bound on ln P(K > k0) for K = Σ_j NegBin(n_j, q_j) (ln 0 -> −inf if K
    cannot exceed k0): ln E[z^K] − (k0 + 1) ln z at the best z of a grid in (1, 1/(1 − q_min))."""
    live = q < 1.0
    if not np.any(live):
        return -math.inf
    n, q = n[live], q[live]
    u_max = -math.log1p(-float(q.min()))  # ln z < −ln(1 − q_min)
    u = u_max * np.linspace(1e-4, 1.0 - 1e-6, 400)[:, None]  # (G, 1)
    log_mgf = np.sum(n * (np.log(q) - np.log1p(-(1.0 - q) * np.exp(u))), axis=1)  # (G,)
    return float(np.min(log_mgf - (k0 + 1) * u[:, 0]))


def _weight_levels(weights: ArrayLike, s: float) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """The distinct positive weights (J,) and their counts (J,), after checking the input.

    Raises:
        ValueError: weights not 1-D, negative or not finite; s not finite."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"expected weights of shape (M,), got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0.0):
        raise ValueError("expected finite weights >= 0")
    if not math.isfinite(s):
        raise ValueError(f"expected a finite weighted score, got {s!r}")
    levels, counts = np.unique(w[w > 0.0], return_counts=True)
    return levels, counts


def _smaller_bound(
    levels: NDArray[np.float64],
    counts: NDArray[np.int64],
    s: float,
    chernoff: float,
    *,
    lower: bool,
) -> tuple[float, PValueMethod]:
    """The smaller of two valid bounds on a tail's ln p: the mixture series (``"exact"``) where
    it is cheap and above underflow, else (or where it is larger) the Chernoff bound."""
    if levels.size > MAX_SERIES_LEVELS or chernoff < SERIES_MIN_LOG_P:
        return chernoff, "chernoff_bound"
    series = _series_log_tail(levels, counts, s, lower=lower)
    if series is None or series > chernoff:
        return chernoff, "chernoff_bound"
    return series, "exact"


def _series_log_tail(
    levels: NDArray[np.float64], counts: NDArray[np.int64], s: float, *, lower: bool
) -> float | None:
    """ln of the mixture series (module docstring) for the upper tail P(S >= s) or, with
    ``lower``, the lower tail P(S <= s) (``weighted_log_cdf``), with its truncation, rounding
    and underflow allowances; None when more than ``MAX_SERIES_TERMS`` (upper) or
    ``MAX_LOWER_SERIES_TERMS`` (lower) terms would be needed."""
    c = float(levels.min())
    rho = levels / c  # (J,) >= 1
    q = 1.0 / rho
    n_j = counts.astype(np.float64)
    n = int(counts.sum())
    x = s / c
    mean = float(np.sum(n_j * (rho - 1.0)))
    sd = math.sqrt(float(np.sum(n_j * (1.0 - q) / q**2)))
    k0 = int(mean + 12.0 * sd + 64.0)
    if lower:
        # Either factor of the lower rest P(K > K0) · P(n + K0 + 1, x) may be made small: the
        # second past x (a Poisson tail), so the small sums, the evidence, need few terms.
        k0 = min(k0, int(max(0.0, x - n) + 12.0 * math.sqrt(x) + 64.0))
    limit = MAX_LOWER_SERIES_TERMS if lower else MAX_SERIES_TERMS
    while True:
        if k0 > limit:
            return None
        pmf, log_scale = _mixing_pmf(rho, counts, k0)
        rest = _nb_tail_log_bound(n_j, q, k0)
        if lower:
            log_p = gamma_log_cdf_many(n, x, k0 + 2)  # (K0 + 2,)
            log_sum = _log_dot(pmf, log_p[:-1]) + log_scale
            rest += float(log_p[-1])
        else:
            log_sum = _log_dot(pmf, _gamma_log_sf_many(n, x, k0 + 1)) + log_scale
        if rest - log_sum <= math.log(SERIES_REL_TOL):
            break
        k0 *= 2
    allowance = 2.0 * math.log(k0 + 1.0) + math.log(2.0 * len(levels) * _TINY)
    total = np.logaddexp(np.logaddexp(log_sum + _ROUNDING_MARGIN, rest), allowance + log_scale)
    return min(0.0, float(total))


def _gamma_log_sf_many(n: int, x: float, count: int) -> NDArray[np.float64]:
    """ln Q(n + k, x) for k = 0..count − 1: ln Q(n, x), then the upward recurrence Q(m + 1,
    x) = Q(m, x) + e^{−x} x^m / m! in log space (positive terms)."""
    k = np.arange(count - 1, dtype=np.float64)  # (count − 1,)
    steps = -x + (n + k) * math.log(x) - gammaln(n + k + 1.0)
    log_q = np.logaddexp.accumulate(np.concatenate(([aaronson_log_sf(n, x)], steps)))
    return np.minimum(log_q, 0.0)


def _mixing_pmf(
    rho: NDArray[np.float64], counts: NDArray[np.int64], k0: int
) -> tuple[NDArray[np.float64], float]:
    """The pmf of K = Σ_j NegBin(n_j, 1/ρ_j) on 0..k0, scaled to max 1, and ln of its scale.

    By direct convolution of the NB pmfs, each scaled to max 1 (positive terms only: relative
    rounding O(k0·eps); a product lost to underflow is below ``_TINY`` times the scale, at most
    2·J·(k0 + 1)² of them)."""
    k = np.arange(k0 + 1, dtype=np.float64)  # (K0 + 1,)
    pmf = np.zeros(k0 + 1)
    pmf[0] = 1.0
    log_scale = 0.0
    for r, m in zip(rho.tolist(), counts.tolist(), strict=True):
        if r == 1.0:
            continue
        log_pmf = _nb_log_pmf(k, int(m), 1.0 / r)  # (K0 + 1,)
        top = float(log_pmf.max())
        pmf = np.convolve(pmf, np.exp(log_pmf - top))[: k0 + 1]
        peak = float(pmf.max())
        pmf /= peak
        log_scale += top + math.log(peak)
    return pmf, log_scale


def _log_dot(pmf: NDArray[np.float64], log_tail: NDArray[np.float64]) -> float:
    """ln Σ_k pmf[k] e^{log_tail[k]} (positive terms; −inf where the pmf underflowed)."""
    with np.errstate(divide="ignore"):
        terms = np.log(pmf) + log_tail
    top = float(terms.max())
    return top + math.log(float(np.sum(np.exp(terms - top))))


def gamma_log_cdf_many(n: int, x: float, count: int) -> NDArray[np.float64]:
    """ln P(n + k, x) for k = 0..count − 1: the lower tails of Gamma(n + k, 1) at x.

    P(a, x) = P(Poisson(x) >= a) for an integer a, so the tails are the reversed cumulative
    sums of the Poisson pmf in log space (positive terms, no cancellation at any x), up to
    j_max >= 2x, plus a geometric bound on the rest (ratio x / (j_max + 1) <= 1/2) and a
    margin for rounding (4·eps per term of the sums, and 4·eps times the largest part of a
    log-pmf, x + |j ln x| + ln j!): a valid upper bound, within that margin of the tail.

    Args:
        n: >= 1. x: > 0, finite. count: >= 1.
    Returns:
        (count,) float64 ln P in (−inf, 0], finite, non-increasing in k.
    """
    top = n + count - 1
    j_max = int(max(top, 2.0 * x) + 64 + 10.0 * math.sqrt(x + 1.0))
    j = np.arange(n, j_max + 1, dtype=np.float64)  # (J,)
    log_pmf = -x + j * math.log(x) - gammaln(j + 1.0)
    ratio = x / (j_max + 1.0)
    rest = float(log_pmf[-1]) + math.log(ratio) - math.log1p(-ratio)
    log_tail = np.logaddexp.accumulate(log_pmf[::-1])[::-1]  # (J,) Σ_{i >= j}
    # rounding, relative: each ln pmf is off by ~eps times its largest part, and the sums add
    # eps per term
    size = x + float(np.max(np.abs(j * math.log(x)) + gammaln(j + 1.0)))
    margin = 4.0 * np.finfo(np.float64).eps * (j.size + size)
    return np.minimum(np.logaddexp(log_tail[:count], rest) + margin, 0.0)


def weighted_log_cdf(weights: ArrayLike, s: float) -> tuple[float, PValueMethod]:
    """ln P(Σ_t w_t E_t <= s) for i.i.d. E_t ~ Exp(1): the lower tail, the p-value of the
    likelihood-ratio test (``likelihood_ratio_test``; small sums are the evidence).

    Method as ``weighted_log_sf`` with the lower tails of the mixture: P(S <= s) = Σ_k P(K = k)
    P(n + k, s/c); P(n + k, x) falls with k, so the truncated rest is at most P(K > K0) ·
    P(n + K0 + 1, x). The Chernoff bound: ln p <= inf_{θ >= 0} (θ s − Σ_j n_j ln(1 + θ v_j)).

    Args:
        weights: (M,) float64 w_t >= 0, finite (zeros drop out; all zero: S = 0, p = 1).
        s: the observed Σ w_t E_t, finite (values <= 0 are taken as 1e-300: S > 0 a.s.).
    Returns:
        (ln p in (−inf, 0], finite; ``"exact"`` or ``"chernoff_bound"``), a valid upper bound.
    Raises:
        ValueError: weights not 1-D, negative or not finite; s not finite.
    """
    levels, counts = _weight_levels(weights, s)
    if levels.size == 0:
        return 0.0, "exact"
    s = max(s, 1e-300)
    if levels.size == 1:  # one level: S / v ~ Gamma(n, 1) exactly
        return float(gamma_log_cdf_many(int(counts[0]), s / float(levels[0]), 1)[0]), "exact"
    return _smaller_bound(levels, counts, s, chernoff_log_cdf(levels, counts, s), lower=True)


def chernoff_log_cdf(levels: NDArray[np.float64], counts: NDArray[np.int64], s: float) -> float:
    """inf_{θ >= 0} (θ s − Σ_j n_j ln(1 + θ v_j)), capped at 0: a valid upper bound on
    ln P(S <= s) (Markov on e^{−θ S}); the θ is the root of the derivative by bisection.

    Args:
        levels: (J,) float64 distinct weights v_j > 0. counts: (J,) int64 n_j >= 1. s: > 0.
    """
    v = np.asarray(levels, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if float(np.dot(n, v)) <= s:  # the mean is at or below s: θ = 0, p <= 1
        return 0.0
    # g(θ) = s − Σ n v / (1 + θ v), increasing from g(0) < 0; g(Σ n / s) >= 0
    low, high = 0.0, float(n.sum()) / s
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        if float(np.dot(n, v / (1.0 + mid * v))) > s:
            low = mid
        else:
            high = mid
    theta = high
    bound = theta * s - float(np.dot(n, np.log1p(theta * v)))
    return min(0.0, bound)
