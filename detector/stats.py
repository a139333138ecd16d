"""Null laws and p-values of watermark scores, in float64 and log space (docs/design.md §4).

Glossary:
- M: the number of scored tokens; S: a score summed over them.
- Q(M, S): the regularised upper incomplete gamma function, P(Gamma(M, 1) >= S). Under H0
  (text independent of the key) every pivot r_t is an independent U(0, 1), each Aaronson term
  −ln(1 − r_t) is Exp(1), and S_A ~ Gamma(M, 1), so p = Q(M, S_A) is an exact p-value.
- ln p is ln of scipy's ``gammaincc`` (Q itself, ~1e-14 relative against mpmath) while
  Q >= ``GAMMAINCC_FLOOR``; where Q > 1/2, ln Q = log1p(−P(M, S)) with scipy's lower tail P
  (small and accurate there); below the floor, where ``gammaincc`` would underflow (to 0 near
  ln p = −745; scipy's ``gamma.logsf`` returns −inf at M = 1000, S = 3000), the finite series
  of Q for integer M, Q(M, S) = e^{−S} Σ_{k=0}^{M−1} S^k / k!, as
  ln Q = −S + logsumexp_k (k ln S − ln k!), which never underflows (~1e-12 relative).

- Irwin–Hall: the law of U_1 + … + U_M for i.i.d. U(0, 1), the null law of the U-score
  S_U = Σ r_t. Its CDF is F(x) = (1/M!) Σ_{k=0}^{⌊x⌋} (−1)^k C(M, k) (x − k)^M; the series
  cancels catastrophically in floating point, so ``irwin_hall_log_sf`` evaluates it exactly in
  integer arithmetic on the binary value of the float S (cheap for small M, see
  ``U_EXACT_MAX_M``).

Sources: Aaronson & Kirchner (2023), the Gamma test of the Aaronson score; MPFR paper, Alg. 8
and App. E (the scores and their p-values); DLMF 8.4.10 (the finite series of Q); Irwin (1927)
and Hall (1927) for the law of a sum of uniforms.

Shapes: N sums of one null law, M scored tokens. Sums S and their natural-log p-values (N,)
float64; the series constants k = 0..M−1 and ln k! (M,) float64; scalars float64, p-values in
log space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Final, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammainc, gammaincc, gammaln

PValueMethod = Literal["exact", "chernoff_bound"]
PVALUE_METHODS: Final[frozenset[str]] = frozenset({"exact", "chernoff_bound"})

LN10: Final = math.log(10.0)
# min_scored_tokens scans M upward (ln Q(M, cM) is not monotone in M for c near 1, so no
# bisection), with scipy's gammaincc while α is far above its underflow, else on the exact
# log-space path; past this many tokens the scan stops and says so.
MAX_MIN_SCORED_TOKENS: Final = 1_000_000
GAMMAINCC_FLOOR: Final = 1e-280
_SCAN_CHUNK: Final = 4096
U_EXACT_MAX_M: Final = 64
"""Largest M for which the U-score p-value is the exact Irwin–Hall tail (above: Chernoff)."""
# Every pivot is at most 1 − 2^−53 (keyed/prf.py), so a true U-score sum of M pivots is at most
# M − M·2^−53; a float sum rounded up to (or past) that is read as exactly that.
_U_DEFICIT_FLOOR: Final = Fraction(1, 2**53)


def _check_m(m: int) -> None:
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 0:
        raise ValueError(f"expected m, the number of scored tokens, an int >= 0, got {m!r}")


def aaronson_log_sf_many(m: int, s: ArrayLike) -> NDArray[np.float64]:
    """ln Q(M, S) for one M and many S: the Aaronson log p-value, vectorised over S.

    Args:
        m: M >= 0, the number of scored tokens (Q(0, S) = 1: no tokens, no evidence).
        s: (N,) float64 sums S >= 0 (finite).
    Returns:
        (N,) float64 natural-log p-values in (−inf, 0], never −inf or NaN for finite input.
        Memory O(N·M) only for the sums past ``GAMMAINCC_FLOOR`` (the series).
    Raises:
        ValueError: m not an int >= 0, or an S negative, NaN or infinite.
    """
    _check_m(m)
    values = np.asarray(s, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"expected s of shape (N,), got {values.shape}")
    if values.shape == (1,):  # one text's p-value: the scalar path, the same bits, ~7x faster
        return np.array([aaronson_log_sf(m, float(values[0]))])
    if not np.all(np.isfinite(values)) or np.any(values < 0.0):
        bad = values[~np.isfinite(values) | (values < 0.0)][0]
        raise ValueError(f"expected finite scores S >= 0, got {bad!r}")
    out = np.zeros_like(values)  # ln Q = 0 for M = 0 and for S = 0
    live = values > 0.0
    if m == 0 or not np.any(live):
        return out
    s_live = values[live]  # (N',)
    q = gammaincc(m, s_live)  # (N',) Q(M, S); underflows to 0 near ln Q = -745
    log_q = np.log(q, out=np.full_like(q, -np.inf), where=q > 0.0)
    # Near Q = 1, ln Q = ln(1 - P) with P, the lower tail, small and accurate in scipy.
    near_one = q > 0.5
    if np.any(near_one):
        log_q[near_one] = np.log1p(-gammainc(m, s_live[near_one]))
    # Deep in the tail, the exact log-space series (no underflow at any S).
    deep = q < GAMMAINCC_FLOOR
    if np.any(deep):
        log_q[deep] = _log_sf_series(m, s_live[deep])
    out[live] = np.minimum(log_q, 0.0)
    return out


def _log_sf_series(m: int, s: NDArray[np.float64]) -> NDArray[np.float64]:
    """ln Q(M, S) = −S + logsumexp_k (k ln S − ln k!) for (N,) sums S > 0 (DLMF 8.4.10).

    Memory O(N·M). Accurate to ~1e-12 relative in ln Q, never underflows; used below
    ``GAMMAINCC_FLOOR``, where scipy's ``gammaincc`` (~1e-14 relative, against mpmath) would.
    """
    k, log_factorials = _series_constants(m)  # (M,), (M,)
    terms = np.log(s)[:, None] * k[None, :] - log_factorials[None, :]  # (N, M)
    top = terms.max(axis=1)  # (N,) logsumexp by hand: scipy's costs ~1 ms a call in overhead
    log_q: NDArray[np.float64] = -s + top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
    return log_q


@lru_cache(maxsize=64)
def _series_constants(m: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """k = 0..M−1 and ln k! as read-only (M,) float64 arrays (cached: spans reuse a few M)."""
    k = np.arange(m, dtype=np.float64)
    log_factorials = gammaln(k + 1.0)
    k.flags.writeable = False
    log_factorials.flags.writeable = False
    return k, log_factorials


def aaronson_log_sf(m: int, s: float) -> float:
    """ln Q(M, S), the natural-log upper tail of Gamma(M, 1) at S (the Aaronson p-value).

    Args:
        m: M >= 0 scored tokens. s: S >= 0, the Aaronson score Σ −ln(1 − r_t).
    Returns:
        ln p in (−inf, 0] as a finite float64; 0.0 when M = 0 or S = 0.
        E.g. (M, S) = (200, 300) -> ln p = −21.81…, log10 p = −9.47223 (case C7).
    Raises:
        ValueError: m < 0 or not an int; s negative, NaN or infinite.

    The same bits as ``aaronson_log_sf_many`` (the same three regimes and ufuncs) on scalars
    (tested); ``aaronson_log_sf_many`` hands a single sum here: ~3 µs against ~20 µs for its
    array path.
    """
    _check_m(m)
    value = float(s)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"expected finite scores S >= 0, got {s!r}")
    if m == 0 or value == 0.0:
        return 0.0
    # NumPy's log/log1p, not math's: the same bits as the array path (they can differ by 1 ulp)
    # and np.minimum, not min: -0.0 (log1p of an underflowed lower tail) comes out as 0.0 there
    q = gammaincc(m, value)
    if q > 0.5:
        log_q = np.log1p(-gammainc(m, value))
    elif q >= GAMMAINCC_FLOOR:
        log_q = np.log(q)
    else:
        log_q = _log_sf_series(m, np.array([value]))[0]
    return float(np.minimum(log_q, 0.0))


@dataclass(frozen=True)
class PValue:
    """A p-value with its score, kept in log10 so that it never underflows.

    Attributes:
        score: the aggregate score S (finite, units of the score family).
        p_value: 10**log10_p_value in [0, 1]; it is 0.0 only when that power underflows
            float64, and then log10_p_value still holds the value.
        log10_p_value: finite, <= 0.
        method: ``"exact"`` (the null law's tail) or ``"chernoff_bound"`` (a valid upper bound).
    Raises:
        ValueError: a NaN/infinite field, p outside [0, 1], log10 > 0, p inconsistent with
            log10, or an unknown method.
    """

    score: float
    p_value: float
    log10_p_value: float
    method: PValueMethod

    def __post_init__(self) -> None:
        for name in ("score", "p_value", "log10_p_value"):
            value = getattr(self, name)
            if not isinstance(value, float) or not math.isfinite(value):
                raise ValueError(f"expected {name} a finite float, got {value!r}")
        if self.method not in PVALUE_METHODS:
            raise ValueError(f"expected method in {sorted(PVALUE_METHODS)}, got {self.method!r}")
        if self.log10_p_value > 0.0:
            raise ValueError(f"expected log10_p_value <= 0, got {self.log10_p_value}")
        if not 0.0 <= self.p_value <= 1.0:
            raise ValueError(f"expected p_value in [0, 1], got {self.p_value}")
        implied = 10.0**self.log10_p_value
        if not math.isclose(self.p_value, implied, rel_tol=1e-9, abs_tol=1e-300):
            raise ValueError(
                f"p_value {self.p_value!r} does not match log10_p_value {self.log10_p_value!r}"
            )

    @classmethod
    def from_log(cls, score: float, log_p: float, method: PValueMethod) -> PValue:
        """Build from a natural-log p-value ``log_p`` <= 0 (clamped to 0 from above)."""
        log_p = min(float(log_p), 0.0)
        return cls(
            score=float(score),
            p_value=math.exp(log_p),
            log10_p_value=log_p / LN10,
            method=method,
        )

    @property
    def log_p_value(self) -> float:
        """Natural-log p-value, ln p = log10 p · ln 10."""
        return self.log10_p_value * LN10


def aaronson_p_value(m: int, s: float) -> PValue:
    """Exact Aaronson p-value Q(M, S) as a ``PValue`` (method ``"exact"``).

    Args:
        m: M >= 0 scored tokens. s: S_A >= 0.
    Raises:
        ValueError: as ``aaronson_log_sf``.
    """
    return PValue.from_log(s, aaronson_log_sf(m, s), "exact")


@lru_cache(maxsize=256)
def min_scored_tokens(alpha: float, mean_score: float = 1.5) -> int:
    """Tokens a typical watermarked text needs to reach level α under the Aaronson test.

    The smallest M with ln Q(M, mean_score·M) < ln α: below it, even a text whose every scored
    token carries the typical watermarked evidence (docs/design.md §4: mean Aaronson term 1.5)
    cannot be significant, so "not significant" means ``insufficient_evidence``, not
    ``not_detected``.
    E.g. α = 0.01 -> 28.

    Args:
        alpha: level in (0, 1).
        mean_score: the per-token mean Aaronson term of watermarked text, > 1 (the H0 mean).
    Returns:
        M >= 1.
    Raises:
        ValueError: alpha outside (0, 1), mean_score <= 1 or not finite, or no M up to
            ``MAX_MIN_SCORED_TOKENS`` reaches α.
    """
    if not (isinstance(alpha, float | int) and 0.0 < alpha < 1.0):
        raise ValueError(f"expected alpha in (0, 1), got {alpha!r}")
    if not (isinstance(mean_score, float | int) and math.isfinite(mean_score) and mean_score > 1):
        raise ValueError(f"expected mean_score > 1 (the H0 mean), got {mean_score!r}")
    log_alpha = math.log(alpha)
    if alpha >= GAMMAINCC_FLOOR:
        m = _first_below_gammaincc(alpha, float(mean_score))
        # Settle the boundary on the exact log-space path (gammaincc agrees to ~1e-13 here).
        while m > 1 and aaronson_log_sf(m - 1, mean_score * (m - 1)) < log_alpha:
            m -= 1
        while aaronson_log_sf(m, mean_score * m) >= log_alpha:
            m += 1
        return m
    # Exact scan, skipping every M whose largest series term alone keeps Q >= alpha.
    for start in range(1, MAX_MIN_SCORED_TOKENS + 1, _SCAN_CHUNK):
        ms = np.arange(start, min(start + _SCAN_CHUNK, MAX_MIN_SCORED_TOKENS + 1))  # (C,)
        s = mean_score * ms  # (C,)
        largest_term = -s + (ms - 1) * np.log(s) - gammaln(ms)  # (C,) ln of the k = M-1 term
        for m in ms[largest_term < log_alpha].tolist():
            if aaronson_log_sf(m, mean_score * m) < log_alpha:
                return int(m)
    raise _too_many(alpha, mean_score)


def _first_below_gammaincc(alpha: float, mean_score: float) -> int:
    """Smallest M with Q(M, mean_score·M) < alpha by scipy's gammaincc, scanned in chunks."""
    for start in range(1, MAX_MIN_SCORED_TOKENS + 1, _SCAN_CHUNK):
        ms = np.arange(start, min(start + _SCAN_CHUNK, MAX_MIN_SCORED_TOKENS + 1))  # (C,)
        hits = np.flatnonzero(gammaincc(ms, mean_score * ms) < alpha)
        if hits.size:
            return int(ms[hits[0]])
    raise _too_many(alpha, mean_score)


def _too_many(alpha: float, mean_score: float) -> ValueError:
    return ValueError(
        f"mean_score {mean_score} needs more than {MAX_MIN_SCORED_TOKENS} tokens to reach "
        f"alpha {alpha}"
    )


def irwin_hall_log_sf(m: int, s: float) -> float:
    """ln P(U_1 + … + U_M >= S) for i.i.d. U(0, 1): the exact U-score log p-value.

    Evaluated in exact integer arithmetic on the binary value of ``s``: with y = N / D,
    F(y) = Σ_{k<=⌊y⌋} (−1)^k C(M, k) (N − kD)^M / (D^M M!). By symmetry P(S >= s) = F(M − s);
    the side with the fewer terms is summed (F(M − s) when M − s <= M/2, else 1 − F(s)), so the
    result has full relative precision. Cost grows like M² big-integer products of M·53 bits:
    meant for M <= ``U_EXACT_MAX_M``.

    Args:
        m: M >= 0 scored tokens. s: S_U, a finite float (any sign).
    Returns:
        ln p in (−inf, 0], finite: 0.0 when M = 0 or S <= 0; for S >= M − M·2^−53 (only float
        rounding can get there: pivots are at most 1 − 2^−53) the value at M − M·2^−53.
    Raises:
        ValueError: m not an int >= 0, or s not finite.
    """
    _check_m(m)
    if not math.isfinite(s):
        raise ValueError(f"expected a finite U-score sum, got {s!r}")
    if m == 0 or s <= 0.0:
        return 0.0
    exact = Fraction(s)
    deficit = max(Fraction(m) - exact, m * _U_DEFICIT_FLOOR)  # M − S, the Irwin–Hall argument
    if deficit <= Fraction(m, 2):
        total, denominator = _irwin_hall_cdf_parts(m, deficit)
        ratio = total / denominator  # correctly rounded, 0.0 only below the float range
        log_p = math.log(ratio) if ratio > 1e-300 else math.log(total) - math.log(denominator)
        return min(log_p, 0.0)
    total, denominator = _irwin_hall_cdf_parts(m, exact)  # P(S >= s) = 1 − F(s), F(s) <= 1/2
    return math.log1p(-(total / denominator))


def _irwin_hall_cdf_parts(m: int, y: Fraction) -> tuple[int, int]:
    """(numerator, denominator) integers with F_M(y) = numerator / denominator, y in (0, M)."""
    n, d = y.numerator, y.denominator
    total = 0
    for k in range(math.floor(y) + 1):
        term = math.comb(m, k) * (n - k * d) ** m
        total += -term if k % 2 else term
    return total, d**m * math.factorial(m)


def irwin_hall_log_sf_many(m: int, s: ArrayLike) -> NDArray[np.float64]:
    """``irwin_hall_log_sf`` over many sums: (N,) float64 -> (N,) float64 ln p."""
    values = np.asarray(s, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"expected s of shape (N,), got {values.shape}")
    return np.array([irwin_hall_log_sf(m, float(v)) for v in values], dtype=np.float64)
