"""Chernoff bounds on the upper tail of a sum of i.i.d. per-token scores under H0.

Glossary (docs/design.md §4):
- h: a per-token score term; under H0 every pivot r_t is an independent U ~ U(0, 1).
- M: the number of scored tokens; S = Σ_t h(r_t), the observed aggregate.
- Λ(λ) = ln E[e^{λ h(U)}]: the log moment generating function (cumulant generating function).
- h_max = sup h: every score here is bounded above, which keeps Λ finite for all λ >= 0.

Chernoff bound (Markov's inequality applied to e^{λS}): for every λ >= 0,
    P(S >= s) <= exp(M Λ(λ) − λ s),
so ln p <= inf_{λ >= 0} (M Λ(λ) − λ s) (MPFR paper App. E.1 for the U-score; the same bound
serves the scores of Li et al. 2025 and Lattimore 2026 with Λ by quadrature).

Implementation. Λ is tabulated once per score family on a fixed grid: λ = 0 and a geometric
grid λ_1 < … < λ_G with ratio ``GRID_RATIO``. Each tabulated value is an upper bound on the true
Λ(λ_g) (closed form, or quadrature value plus its error estimate), so each grid candidate
M Λ(λ_g) − λ_g s is itself a valid Chernoff bound, and the reported bound — their minimum — is a
valid upper bound on p for every (M, s), never an approximation from below. Where the optimal λ
is inside the grid, restricting λ to the grid loosens ln p by a relative ≈ (ρ − 1)²/4 ≈ 1e-4
(ρ = ``GRID_RATIO``); beyond the last grid point (s/M within ~1/λ_G of h_max) the bound stays
valid and finite but is looser than the infimum.

Quadrature (scipy.integrate.quad, QUADPACK) is done on e^{λ(h − h_max)} <= 1, so nothing
overflows for large λ, in variables where the integrand is smooth and bounded, split at
breakpoints on the scale 1/λ where large λ concentrates the mass near the top of h.

Shapes: N sums; s (N,) float64; the grid (G,) float64. Computation per call is O(N·G).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

GRID_RATIO: Final = 1.02
QUAD_EPSREL: Final = 1e-10
# A quadrature whose own error estimate exceeds this fraction of its value is a bug here
# (every integrand is smooth and bounded after the substitutions below), not a result.
QUAD_MAX_RELERR: Final = 1e-7
_CHUNK: Final = 2048


def lambda_grid(lowest: float, highest: float, ratio: float = GRID_RATIO) -> NDArray[np.float64]:
    """Geometric grid of λ values from ``lowest`` to at least ``highest``.

    Args:
        lowest, highest: 0 < lowest < highest, finite. ratio: the grid ratio ρ > 1.
    Returns:
        (G,) float64 increasing, G = ceil(ln(highest/lowest)/ln ρ) + 1.
    """
    if not (0.0 < lowest < highest and math.isfinite(highest) and ratio > 1.0):
        raise ValueError(
            f"expected 0 < lowest < highest and ratio > 1, got {lowest}, {highest}, {ratio}"
        )
    count = math.ceil(math.log(highest / lowest) / math.log(ratio)) + 1
    return np.asarray(lowest * ratio ** np.arange(count, dtype=np.float64), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class ChernoffTail:
    """The Chernoff bound on P(Σ_{t=1}^M h(U_t) >= s) from Λ tabulated on a λ grid.

    Attributes:
        lambdas: (G,) float64, increasing, > 0 (λ = 0, the trivial bound p <= 1, is implicit).
        log_mgf: (G,) float64, upper bounds on Λ(λ_g) = ln E[e^{λ_g h(U)}].
        mean: E[h(U)] under H0 (for reference; ln p = 0 whenever s/M <= mean).
        h_max: sup h (finite).
    """

    lambdas: NDArray[np.float64]
    log_mgf: NDArray[np.float64]
    mean: float
    h_max: float

    def __post_init__(self) -> None:
        if self.lambdas.ndim != 1 or self.lambdas.shape != self.log_mgf.shape:
            raise ValueError(
                f"expected lambdas and log_mgf of one shape (G,), got {self.lambdas.shape} "
                f"and {self.log_mgf.shape}"
            )
        if not (np.all(self.lambdas > 0.0) and np.all(np.diff(self.lambdas) > 0.0)):
            raise ValueError("expected an increasing grid of lambdas > 0")
        if not np.all(np.isfinite(self.log_mgf)):
            raise ValueError("expected finite log_mgf values")

    def log_sf_many(self, m: int, s: ArrayLike) -> NDArray[np.float64]:
        """Natural-log Chernoff bounds on P(S_M >= s) for many s.

        Args:
            m: M >= 0 scored tokens (M = 0: p = 1).
            s: (N,) float64 finite observed sums.
        Returns:
            (N,) float64 ln p bounds in (−inf, 0], finite: min(0, min_g M Λ(λ_g) − λ_g s).
        Raises:
            ValueError: m not an int >= 0; s not 1-D or not finite.
        """
        if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 0:
            raise ValueError(f"expected m, the number of scored tokens, an int >= 0, got {m!r}")
        values = np.asarray(s, dtype=np.float64)
        if values.ndim != 1:
            raise ValueError(f"expected s of shape (N,), got {values.shape}")
        if not np.all(np.isfinite(values)):
            raise ValueError("expected finite sums s")
        out = np.zeros_like(values)
        if m == 0 or values.size == 0:
            return out
        offsets = m * self.log_mgf  # (G,)
        for start in range(0, values.size, _CHUNK):
            chunk = values[start : start + _CHUNK]  # (C,)
            bounds = offsets[None, :] - chunk[:, None] * self.lambdas[None, :]  # (C, G)
            out[start : start + _CHUNK] = np.minimum(bounds.min(axis=1), 0.0)
        return out

    def optimal_lambda(self, m: int, s: float) -> float:
        """The grid λ that attains the bound (0.0 when the trivial bound p <= 1 wins)."""
        if m == 0:
            return 0.0
        bounds = m * self.log_mgf - s * self.lambdas  # (G,)
        best = int(np.argmin(bounds))
        return float(self.lambdas[best]) if bounds[best] < 0.0 else 0.0


def quad_segments(
    integrand: Callable[[float], float], edges: NDArray[np.float64], tail: bool = False
) -> tuple[float, float]:
    """∫ integrand over [edges[0], edges[-1]] (and on to +inf when ``tail``), piecewise.

    Returns:
        (value, absolute error estimate), summed over the segments.
    Raises:
        RuntimeError: the error estimate exceeds ``QUAD_MAX_RELERR`` of the value — an
            internal invariant (the integrands here are smooth and bounded), not an input error.
    """
    from scipy import integrate  # here: only the Li/Lattimore tails need it (0.15 s to import)

    total = error = 0.0
    pieces = [(float(a), float(b)) for a, b in itertools.pairwise(edges) if b > a]
    if tail:
        pieces.append((float(edges[-1]), math.inf))
    for a, b in pieces:
        result = integrate.quad(
            integrand, a, b, epsabs=0.0, epsrel=QUAD_EPSREL, limit=200, full_output=1
        )
        total += float(result[0])
        error += float(result[1])
    if not (math.isfinite(total) and total > 0.0 and error <= QUAD_MAX_RELERR * total):
        raise RuntimeError(f"quadrature did not converge: value {total!r}, error {error!r}")
    return total, error


def peak_edges(start: float, stop: float, scale: float) -> NDArray[np.float64]:
    """Breakpoints ``start + scale·4^j`` (j = 0, 1, …) inside (start, stop), with both ends.

    For an integrand that peaks at ``start`` and decays on the length ``scale``: every segment
    then holds a comparable share of the mass, which keeps adaptive quadrature accurate when
    the peak is narrow (large λ).
    """
    steps = [start]
    offset = scale
    while start + offset < stop:
        steps.append(start + offset)
        offset *= 4.0
    steps.append(stop)
    return np.asarray(steps, dtype=np.float64)
