"""Weighted Aaronson tests: key-independent weights per position, and their p-values.

The tests reported beside the verdict that read the target's law (docs/design.md §4):
``entropy_weighted_test``, ``rank_filtered_test`` (the edit filter) and
``likelihood_ratio_test``. The weights come from the rules of
``detector.weighting``; the p-values from ``detector.weighted_null`` (exact mixture series or a
Chernoff bound). The weights do not depend on the key, so under H0 the scored pivots stay
i.i.d. U(0, 1) given the weights and every p is exact or a valid upper bound. This module
re-exports the rules and the null law, so ``detector.weighted`` is the one import for callers.

Sources: Aaronson & Kirchner (2023) for the score; Moschopoulos (1985) for the mixture.

Shapes: T tokens of the text, M of them scored. Skip codes (T,) int8 (0: scored); Aaronson
terms x_t (M,) float64 in text order; the target's per-position entropy, ln p_t (T,) float64
and raw rank (T,) int64, gathered to the scored positions as (M,) weights, float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from detector.stats import LN10, PValue, PValueMethod
from detector.weighted_null import (
    MAX_LOWER_SERIES_TERMS,
    MAX_SERIES_LEVELS,
    MAX_SERIES_TERMS,
    SERIES_MIN_LOG_P,
    SERIES_REL_TOL,
    chernoff_log_cdf,
    chernoff_log_sf,
    gamma_log_cdf_many,
    weighted_log_cdf,
    weighted_log_sf,
)
from detector.weighting import (
    ENTROPY_WEIGHTING,
    GRIDS,
    LIKELIHOOD_RATIO,
    RANK_FILTER,
    EntropyWeighting,
    LikelihoodRatioWeighting,
    RankFilter,
    label_windows_flagged,
)
from keyed import SKIP_CODES

__all__ = [
    "ENTROPY_WEIGHTING",
    "GRIDS",
    "LIKELIHOOD_RATIO",
    "MAX_LOWER_SERIES_TERMS",
    "MAX_SERIES_LEVELS",
    "MAX_SERIES_TERMS",
    "MAX_TERM",
    "RANK_FILTER",
    "SERIES_MIN_LOG_P",
    "SERIES_REL_TOL",
    "EntropyWeighting",
    "LikelihoodRatioTest",
    "LikelihoodRatioWeighting",
    "RankFilter",
    "WeightedTest",
    "chernoff_log_cdf",
    "chernoff_log_sf",
    "entropy_weighted_test",
    "gamma_log_cdf_many",
    "label_windows_flagged",
    "likelihood_ratio_test",
    "rank_filtered_test",
    "weighted_log_cdf",
    "weighted_log_sf",
    "weighted_test",
]

_SCORED: Final = SKIP_CODES.index(None)

MAX_TERM: Final = 800.0
"""y_t = −ln r_t is capped here (a pivot below e^−800 has probability e^−800): the terms stay
finite; capping lowers a sum only on that event, so a text with a capped term gets M·e^−800
added to its p (``likelihood_ratio_test``)."""


@dataclass(frozen=True)
class LikelihoodRatioTest:
    """The likelihood-ratio test of one text (natural logs inside, log10 on the wire).

    Attributes:
        score: S = Σ w_t y_t with y_t = −ln r_t (nats; small is evidence). log_p: ln P(S' <=
        S) under H0, <= 0, finite. method: ``"exact"`` or ``"chernoff_bound"``. num_scored:
        M. num_weighted: positions with w_t > 0. weight_sum: Σ w_t (the H0 mean of S).
        conditioned_on_prompt: whether the law came with the generation's prompt.
    """

    score: float
    log_p: float
    method: PValueMethod
    num_scored: int
    num_weighted: int
    weight_sum: float
    weighting: LikelihoodRatioWeighting
    conditioned_on_prompt: bool

    @property
    def p_value(self) -> PValue:
        return PValue.from_log(self.score, self.log_p, self.method)

    def to_json(self) -> dict[str, Any]:
        """``{"name", "score", "p_value", "log10_p_value", "method", "num_scored",
        "num_weighted", "weight_sum", "weighting", "conditioned_on_prompt"}``."""
        return {
            "name": "likelihood_ratio",
            "score": self.score,
            "p_value": math.exp(self.log_p),
            "log10_p_value": self.log_p / LN10,
            "method": self.method,
            "num_scored": self.num_scored,
            "num_weighted": self.num_weighted,
            "weight_sum": self.weight_sum,
            "weighting": self.weighting.to_json(),
            "conditioned_on_prompt": self.conditioned_on_prompt,
        }


def likelihood_ratio_test(
    skip: Sequence[int] | NDArray[np.int8],
    aaronson_terms: ArrayLike,
    token_logp: ArrayLike,
    weighting: LikelihoodRatioWeighting = LIKELIHOOD_RATIO,
    *,
    conditioned_on_prompt: bool = False,
) -> LikelihoodRatioTest:
    """The likelihood-ratio test of a detection (``LikelihoodRatioWeighting``).

    Args:
        skip: (T,) int8 skip codes of the text (``Detection.evidence.skip``: 0 scored).
        aaronson_terms: (M,) float64 the scored positions' x_t = −ln(1 − r_t), in text order;
            y_t = −ln r_t = −ln(−expm1(−x_t)), capped at ``MAX_TERM``.
        token_logp: (T,) float64 ln p_t from ``sampler.entropy.position_laws`` on the same ids.
        weighting: the rule. conditioned_on_prompt: reported.
    Returns:
        the test, p = P(Σ w_t E_t <= S) by ``weighted_log_cdf`` (exact for the given weights:
        they do not depend on the key).
    Raises:
        ValueError: lengths that do not match (naming them); terms negative or not finite.
    """
    codes = np.asarray(skip)
    logp = np.asarray(token_logp, dtype=np.float64)
    if logp.shape != codes.shape:
        raise ValueError(
            f"expected token_logp of shape ({codes.size},), one per token, got {logp.shape}"
        )
    x = np.asarray(aaronson_terms, dtype=np.float64)
    w = weighting.weights(logp)[codes == _SCORED]  # (M,)
    if x.shape != w.shape:
        raise ValueError(f"expected {w.size} Aaronson terms (one per scored token), got {x.size}")
    if not np.all(np.isfinite(x)) or np.any(x < 0.0):
        raise ValueError("expected finite Aaronson terms >= 0")
    with np.errstate(divide="ignore"):
        raw = -np.log(-np.expm1(-x))  # x = 0 (r = 0): +inf
    y = np.minimum(raw, MAX_TERM)
    s = float(np.dot(w, y))
    log_p, method = weighted_log_cdf(w, s)
    if np.any(raw > MAX_TERM):  # a capped term: add the cap's event, P <= M·e^−MAX_TERM
        log_p = min(0.0, float(np.logaddexp(log_p, math.log(w.size) - MAX_TERM)))
    return LikelihoodRatioTest(
        score=s,
        log_p=log_p,
        method=method,
        num_scored=int(w.size),
        num_weighted=int(np.count_nonzero(w)),
        weight_sum=float(w.sum()),
        weighting=weighting,
        conditioned_on_prompt=conditioned_on_prompt,
    )


@dataclass(frozen=True)
class WeightedTest:
    """A weighted Aaronson test of one text (natural logs inside, log10 on the wire): entropy
    weights or the edit filter (``weighting`` says which; ``name`` names it).

    Attributes:
        score: S_w = Σ w_t x_t (nats). log_p: ln p, <= 0, finite. method: ``"exact"`` (the
        mixture series) or ``"chernoff_bound"``. num_scored: M. num_weighted: positions with
        w_t > 0. weight_sum: Σ w_t (the H0 mean of S_w). weighting: the rule, or None when the
        caller gave the weights.
    """

    score: float
    log_p: float
    method: PValueMethod
    num_scored: int
    num_weighted: int
    weight_sum: float
    weighting: EntropyWeighting | RankFilter | None = None

    @property
    def p_value(self) -> PValue:
        return PValue.from_log(self.score, self.log_p, self.method)

    @property
    def name(self) -> str:
        """``"edit_filtered"`` (``RankFilter``), else ``"entropy_weighted"``
        (``EntropyWeighting`` or caller-given weights)."""
        if isinstance(self.weighting, RankFilter):
            return "edit_filtered"
        return "entropy_weighted"

    def to_json(self) -> dict[str, Any]:
        """``{"name", "score", "p_value", "log10_p_value", "method", "num_scored",
        "num_weighted", "weight_sum", "weighting"}``."""
        return {
            "name": self.name,
            "score": self.score,
            "p_value": math.exp(self.log_p),
            "log10_p_value": self.log_p / LN10,
            "method": self.method,
            "num_scored": self.num_scored,
            "num_weighted": self.num_weighted,
            "weight_sum": self.weight_sum,
            "weighting": None if self.weighting is None else self.weighting.to_json(),
        }


def weighted_test(
    weights: ArrayLike,
    terms: ArrayLike,
    weighting: EntropyWeighting | RankFilter | None = None,
) -> WeightedTest:
    """The weighted test of one text from its scored positions' weights and Aaronson terms.

    Args:
        weights: (M,) float64 w_t >= 0, key-independent. terms: (M,) float64 Aaronson terms
            x_t = −ln(1 − r_t) >= 0. weighting: the rule the weights came from (reported).
    Raises:
        ValueError: shapes differ or are not 1-D; weights as ``weighted_log_sf``.
    """
    w = np.asarray(weights, dtype=np.float64)
    x = np.asarray(terms, dtype=np.float64)
    if w.ndim != 1 or w.shape != x.shape:
        raise ValueError(f"expected weights and terms of one shape (M,), got {w.shape}, {x.shape}")
    s = float(np.dot(w, x))
    log_p, method = weighted_log_sf(w, s)
    return WeightedTest(
        score=s,
        log_p=log_p,
        method=method,
        num_scored=int(w.size),
        num_weighted=int(np.count_nonzero(w)),
        weight_sum=float(w.sum()),
        weighting=weighting,
    )


def entropy_weighted_test(
    skip: Sequence[int] | NDArray[np.int8],
    aaronson_terms: ArrayLike,
    entropy: ArrayLike,
    weighting: EntropyWeighting = ENTROPY_WEIGHTING,
) -> WeightedTest:
    """The weighted test of a detection: per-position entropies, weights on the scored ones.

    Args:
        skip: (T,) int8 skip codes of the text (``Detection.evidence.skip``: 0 scored).
        aaronson_terms: (M,) float64 the scored positions' Aaronson terms, in text order
            (``Detection.evidence.terms["aaronson"]``).
        entropy: (T,) float64 the processed target law's entropy (nats) at every position of
            the text (``sampler.entropy.processed_entropy`` on the same ids).
        weighting: the weight function (default ``ENTROPY_WEIGHTING``).
    Raises:
        ValueError: lengths that do not match (naming them), entropies as
            ``EntropyWeighting.weights``.
    """
    codes = np.asarray(skip)
    h = np.asarray(entropy, dtype=np.float64)
    if h.shape != codes.shape:
        raise ValueError(f"expected entropy of shape ({codes.size},), one per token, got {h.shape}")
    weights = weighting.weights(h)[codes == _SCORED]  # (M,)
    return weighted_test(weights, aaronson_terms, weighting)


def rank_filtered_test(
    skip: Sequence[int] | NDArray[np.int8],
    aaronson_terms: ArrayLike,
    raw_rank: ArrayLike,
    context_width: int,
    rank_filter: RankFilter = RANK_FILTER,
) -> WeightedTest:
    """The edit-filtered test of a detection (``RankFilter``): the Aaronson test over the
    scored positions whose label window holds no likely edit; p exact (Gamma tail).

    Args:
        skip: (T,) int8 skip codes of the text (``Detection.evidence.skip``: 0 scored).
        aaronson_terms: (M,) float64 the scored positions' Aaronson terms, in text order.
        raw_rank: (T,) int64 from ``sampler.entropy.position_laws`` on the same ids.
        context_width: m of the key the text is tested under (``Detection.context_width``).
        rank_filter: the rule (default ``RANK_FILTER``).
    Raises:
        ValueError: lengths that do not match (naming them); as ``RankFilter.weights``.
    """
    codes = np.asarray(skip)
    rank = np.asarray(raw_rank)
    if rank.shape != codes.shape:
        raise ValueError(
            f"expected raw_rank of shape ({codes.size},), one per token, got {rank.shape}"
        )
    weights = rank_filter.weights(rank, context_width)[codes == _SCORED]  # (M,)
    return weighted_test(weights, aaronson_terms, rank_filter)
