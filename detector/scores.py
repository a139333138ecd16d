"""Watermark score families: per-token terms of the pivots and the p-value of their sum.

Glossary (DESIGN §4): the pivot r_t = U(k, ℓ_t, w_t, 1) is the uniform behind the observed
token's first clock; under H0 the pivots of the scored set T (M = |T|) are i.i.d. U(0, 1), and
the keyed race makes them large in watermarked text. A score family maps each pivot to a term
h(r_t), sums them over T and turns the sum into a p-value under H0.

Families:
- ``aaronson``: h(r) = −ln(1 − r), Exp(1) under H0, so S_A ~ Gamma(M, 1) and p = Q(M, S_A)
  exactly (Aaronson & Kirchner 2023; MPFR paper Alg. 8 and App. E).

More families (U-score, Li et al. 2025, Lattimore 2026) register here under their name, each a
per-token function and a p-value function; nothing else in the detector names a family.

Shapes: T scored tokens; pivots and terms are (T,) float64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import numpy as np
from numpy.typing import NDArray

from detector.stats import PValue, aaronson_p_value

Terms = Callable[[NDArray[np.float64]], NDArray[np.float64]]
Tail = Callable[[int, float], PValue]


@dataclass(frozen=True)
class ScoreFamily:
    """One score: its per-token term h(r) and the p-value of Σ h(r_t) over M tokens.

    Attributes:
        name: the key of this family in responses (``"aaronson"``).
        terms: (T,) float64 pivots in (0, 1) -> (T,) float64 finite terms.
        p_value: (M, S) -> ``PValue`` (exact or a valid upper bound, as its ``method`` says).
    """

    name: str
    terms: Terms
    p_value: Tail

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
        if pivots.size and not (np.all(pivots > 0.0) and np.all(pivots < 1.0)):
            raise ValueError("expected pivots strictly inside (0, 1)")
        terms = self.terms(pivots)  # (T,)
        return terms, self.p_value(int(pivots.size), float(np.sum(terms)))


def aaronson_terms(pivots: NDArray[np.float64]) -> NDArray[np.float64]:
    """Aaronson per-token term −ln(1 − r), Exp(1) under H0; (T,) float64 -> (T,) float64.

    ``-log1p(-r)`` keeps precision for r near 0; the PRF's uniforms stay below 1 (at most
    1 − 2^−53), so terms are at most 36.8 and always finite.
    """
    return np.asarray(-np.log1p(-pivots), dtype=np.float64)


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


AARONSON: Final = ScoreFamily(name="aaronson", terms=aaronson_terms, p_value=aaronson_p_value)

SCORES: Final[Mapping[str, ScoreFamily]] = MappingProxyType({AARONSON.name: AARONSON})
"""The registered score families by name; the detector reports every one of them."""
