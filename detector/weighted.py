"""Weighted Aaronson tests: key-independent weights per position.

Three rules give the weights: ``EntropyWeighting`` (item 5: the target's entropy at the
context), ``ModelWeighting`` (the text's own token's probability; measured, not served) and
``RankFilter`` (the edit filter: weight 0 on the labels that hold a token the target ranks
low, 1 elsewhere; its p is the plain Gamma tail of the kept positions).

Glossary (M scored tokens, Aaronson terms x_t = −ln(1 − r_t), i.i.d. Exp(1) under H0):

- weights: w_t >= 0 per scored position, fixed by the caller *without the key* (here: a
  function of the target's entropy H_t at that context, ``sampler.entropy``). Under H0 the
  text is independent of the key, so the pivots stay i.i.d. U(0, 1) *given* the weights, and
  S_w = Σ w_t x_t is an exact weighted sum of i.i.d. Exp(1) whatever the weights are.
- why: in low-entropy positions the race has nothing to choose (a one-token support gives
  x_t ~ Exp(1) watermarked or not) and only adds noise. In Aaronson's race the chosen token
  i's pivot is Beta(1/p_i, 1), so E_H1[x_t] = Σ_i p_i (ψ(1 + 1/p_i) + γ), which grows with
  the entropy; on the design generations at T = 0.7 / top-p 0.95 the mean term rises from
  1.12 (H < 0.05 nats, 18 % of the scored positions) to 2.0 (1-2 nats) and 2.6 (> 3 nats).
  If x_t were Exp with mean μ_t under H1, the likelihood ratio would be linear in x_t with
  weight 1 − 1/μ_t (Neyman–Pearson), so the best weights grow from 0 at zero entropy and
  level off; ``ENTROPY_WEIGHTING`` is the rule chosen on the design set.

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import digamma, gammaln

from detector.stats import LN10, PValue, PValueMethod, aaronson_log_sf
from keyed import SKIP_CODES

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
_SCORED: Final = SKIP_CODES.index(None)


def _check_levels(levels: object) -> None:
    """A weight rule's L: an int in [1, 64] (weights are multiples of 1/L). ValueError naming
    ``levels`` otherwise."""
    if isinstance(levels, bool) or not isinstance(levels, int):
        raise ValueError(f"expected levels an int in [1, 64], got {levels!r}")
    if not 1 <= levels <= 64:
        raise ValueError(f"expected levels in [1, 64], got {levels}")


@dataclass(frozen=True)
class EntropyWeighting:
    """The weight of a scored position as a function of the target's entropy there.

    w(H) = round(L · H / (H + h)) / L (``shape`` ``"ratio"``, the Exp-likelihood-ratio weight
    1 − 1/μ with μ = 1 + H/h) or round(L · min(1, H/h)) / L (``shape`` ``"clip"``), quantised
    to multiples of 1/L (L = ``levels``), so that the exact series stays cheap (ρ <= L).
    H in nats (natural-log entropy of the *processed* target law: temperature, top-k, top-p).

    Attributes:
        shape: ``"ratio"`` or ``"clip"``. scale: h > 0, nats. levels: L in [1, 64].
    Raises:
        ValueError: naming the field (unknown shape, scale not finite > 0, levels out of
            range).
    """

    shape: str = "ratio"
    scale: float = 1.0
    levels: int = 4

    def __post_init__(self) -> None:
        if self.shape not in ("ratio", "clip"):
            raise ValueError(f"expected shape 'ratio' or 'clip', got {self.shape!r}")
        if not (isinstance(self.scale, float | int) and math.isfinite(self.scale)):
            raise ValueError(f"expected scale a finite number > 0, got {self.scale!r}")
        if self.scale <= 0:
            raise ValueError(f"expected scale > 0, got {self.scale!r}")
        _check_levels(self.levels)

    def weights(self, entropy: ArrayLike) -> NDArray[np.float64]:
        """(T,) float64 entropies in nats (>= 0, finite) -> (T,) float64 weights in [0, 1].

        Raises:
            ValueError: entropies not 1-D, negative (beyond −1e-9, rounding) or not finite.
        """
        h = np.asarray(entropy, dtype=np.float64)
        if h.ndim != 1:
            raise ValueError(f"expected entropy of shape (T,), got {h.shape}")
        if not np.all(np.isfinite(h)) or np.any(h < -1e-9):
            raise ValueError("expected finite entropies >= 0 (nats)")
        h = np.maximum(h, 0.0)
        raw = h / (h + self.scale) if self.shape == "ratio" else np.minimum(1.0, h / self.scale)
        return np.asarray(np.rint(raw * self.levels) / self.levels, dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.shape, "scale": self.scale, "levels": self.levels}


ENTROPY_WEIGHTING: Final = EntropyWeighting("ratio", 0.25, 4)
"""The weighting the service and CLI use: w = round(4 H / (H + 0.25)) / 4, i.e. 0 below
H ≈ 0.036 nats, 1/4 to H ≈ 0.15, 1/2 to 0.42, 3/4 to 1.75, then 1. Chosen on the design
prompts only (ranks 0-9 of each task; ``bench/results/detector_entropy_design.json``) among
15 candidates (``docs/experiments/detector-entropy.md``): at T = 0.7 / top-p 0.95 nine tie on
the median tokens to α (9.0 against 9.5 plain); the tie-break — the median tokens after which
p stays below α (9.5, the others 10-14; plain 15), and no loss at T = 1 (3 = plain) — picks
this one. Frozen before the held-out run."""


@dataclass(frozen=True)
class ModelWeighting:
    """The weight of a scored position from the target's law of the text's *own* token there.

    w_t = round(L · (1 − 1/μ(p_t))) / L with μ(p) = ψ(1 + 1/p) + γ, where p_t is the processed
    probability of the token the text has at t (``sampler.entropy.PositionLaws.token_logp``).
    Why: in the race the chosen token's pivot is Beta(1/p, 1) (Aaronson & Kirchner 2023), so
    μ(p) = E_H1[x_t | the text's token had probability p] (1 at p = 1, H_n at p = 1/n), and an
    Exp(μ) alternative's likelihood ratio against Exp(1) is linear in x_t with weight 1 − 1/μ
    (Neyman–Pearson); the entropy weight (``EntropyWeighting``) is this weight's average over
    the law, this one conditions on the token the text has. Where p_t = 0 (outside the
    support the detector estimates) w_t = 1, the p -> 0 limit: the detector sees the text
    without its prompt, and on the design generations its support missed 6-9 % of the
    watermarked tokens (20 % of the first ten); giving them 0 doubled the tokens to α. With
    ``max_rank`` R, w_t = 0 where
    any token of t − m .. t (the label of t and its own token; m the key's context width) ranks
    R or lower in the target's *raw* law (``raw_rank`` >= R): a substituted or inserted token
    is rarely among the model's top R, and every label it enters is destroyed.

    All of it is a function of the text and the model, not of the key, so under H0 the terms
    stay i.i.d. Exp(1) given the weights and ``weighted_log_sf`` is exact.

    Attributes:
        levels: L in [1, 64] (weights are multiples of 1/L). max_rank: R >= 1, or None (no
        edit filter).
    Raises:
        ValueError: naming the field (levels out of range, max_rank < 1).
    """

    levels: int = 4
    max_rank: int | None = 1000

    def __post_init__(self) -> None:
        _check_levels(self.levels)
        if self.max_rank is not None and (
            isinstance(self.max_rank, bool) or not isinstance(self.max_rank, int)
        ):
            raise ValueError(f"expected max_rank an int >= 1 or None, got {self.max_rank!r}")
        if self.max_rank is not None and self.max_rank < 1:
            raise ValueError(f"expected max_rank >= 1, got {self.max_rank}")

    def weights(
        self, token_logp: ArrayLike, raw_rank: ArrayLike, context_width: int
    ) -> NDArray[np.float64]:
        """(T,) float64 ln p_t (<= 0, -inf allowed) and (T,) int64 raw ranks (>= 0) -> (T,)
        float64 weights in [0, 1].

        Raises:
            ValueError: shapes not (T,) alike, ln p_t > 0 (beyond 1e-9, rounding) or NaN,
                ranks negative, context_width < 0.
        """
        logp = np.asarray(token_logp, dtype=np.float64)
        rank = np.asarray(raw_rank, dtype=np.int64)
        if logp.ndim != 1 or logp.shape != rank.shape:
            raise ValueError(
                f"expected token_logp and raw_rank of one shape (T,), got {logp.shape}, "
                f"{rank.shape}"
            )
        if np.any(np.isnan(logp)) or np.any(logp > 1e-9):
            raise ValueError("expected token_logp <= 0 (natural log of a probability)")
        if np.any(rank < 0):
            raise ValueError("expected raw_rank >= 0")
        if context_width < 0:
            raise ValueError(f"expected context_width >= 0, got {context_width}")
        p = np.exp(np.minimum(logp, 0.0))
        mu = np.ones_like(p)
        live = p > 0.0
        mu[live] = digamma(1.0 + 1.0 / p[live]) + np.euler_gamma
        raw = np.where(live, 1.0 - 1.0 / np.maximum(mu, 1.0), 1.0)
        w = np.rint(raw * self.levels) / self.levels
        if self.max_rank is not None:
            w = np.where(label_windows_flagged(rank >= self.max_rank, context_width), 0.0, w)
        return np.asarray(w, dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        return {"rule": "token_probability", "levels": self.levels, "max_rank": self.max_rank}


def label_windows_flagged(flags: ArrayLike, context_width: int) -> NDArray[np.bool_]:
    """(T,) bool flags of tokens -> (T,) bool: a flagged token among t − m .. t, i.e. in the
    label of position t (its m predecessors) or at t itself (m = ``context_width``). So a
    flagged token at s marks positions s .. s + m: every label it enters (DESIGN, "labels":
    the label of t hashes the m tokens before it).

    Raises:
        ValueError: flags not 1-D, context_width not an int >= 0 (Python or numpy).
    """
    f = np.asarray(flags, dtype=bool)
    if f.ndim != 1:
        raise ValueError(f"expected flags of shape (T,), got {f.shape}")
    if isinstance(context_width, bool) or not isinstance(context_width, (int, np.integer)):
        raise ValueError(f"expected context_width an int >= 0, got {context_width!r}")
    context_width = int(context_width)
    if context_width < 0:
        raise ValueError(f"expected context_width an int >= 0, got {context_width!r}")
    csum = np.concatenate(([0], np.cumsum(f, dtype=np.int64)))  # a running window sum
    t = np.arange(f.size)
    return np.asarray(csum[t + 1] - csum[np.maximum(t - context_width, 0)] > 0, dtype=bool)


@dataclass(frozen=True)
class RankFilter:
    """The edit filter: leave out every position whose label or token holds a likely edit.

    w_t = 0 where a token of t − m .. t ranks ``max_rank`` or lower in the target's raw law at
    its position (``sampler.entropy.PositionLaws.raw_rank`` >= R), else 1. Why: a substituted
    or inserted token is rarely among the model's top R, and every label it enters is
    destroyed, so those positions only add H0 noise to the plain sum; the test scores the
    rest. The weights are a function of the text and the model, not of the key, so under H0
    the kept terms are i.i.d. Exp(1) and the p is the exact Gamma(K, 1) tail for K kept
    positions. R = 1000 is the middle of the grid measured on the design split
    (``detector_decision.md``, "Token-probability weights and a raw-rank edit filter": 0.92 at
    30 % edits for R = 1000 and 3000, diluted 0.95 against 0.925), not a rule frozen before the
    held-out split was read; on the held-out split (``docs/experiments/detector-edit-oracle.md``)
    it found 0.84 of the copies after 30 % mixed edits (R = 3000: 0.843) against the plain
    test's 0.79, and about 0.905 for a perfect detector of substituted and inserted tokens.

    Attributes:
        max_rank: R >= 1.
    Raises:
        ValueError: naming ``max_rank`` (not an int >= 1).
    """

    max_rank: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.max_rank, bool) or not isinstance(self.max_rank, int):
            raise ValueError(f"expected max_rank an int >= 1, got {self.max_rank!r}")
        if self.max_rank < 1:
            raise ValueError(f"expected max_rank >= 1, got {self.max_rank}")

    def weights(self, raw_rank: ArrayLike, context_width: int) -> NDArray[np.float64]:
        """(T,) int64 raw ranks (>= 0) -> (T,) float64 weights in {0, 1}.

        Raises:
            ValueError: ranks not (T,) or negative, context_width < 0.
        """
        rank = np.asarray(raw_rank, dtype=np.int64)
        if rank.ndim != 1:
            raise ValueError(f"expected raw_rank of shape (T,), got {rank.shape}")
        if np.any(rank < 0):
            raise ValueError("expected raw_rank >= 0")
        flagged = label_windows_flagged(rank >= self.max_rank, context_width)
        return np.where(flagged, 0.0, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"rule": "raw_rank_filter", "max_rank": self.max_rank}


RANK_FILTER: Final = RankFilter()
"""The edit filter the service runs (``edit_filter: true``)."""


GRIDS: Final = ("linear", "geometric")
"""The weight grids of ``LikelihoodRatioWeighting``: multiples of 1/L, or 1/L times powers of 2."""


@dataclass(frozen=True)
class LikelihoodRatioWeighting:
    """The likelihood-ratio test's weight of a scored position: the raw weight
    ω_t = 1/max(p_t, f) − 1, with p_t the processed probability of the text's own token there,
    put on a grid: ``"linear"``, w_t = round(L·ω_t)/L; ``"geometric"``, w_t = 2^round(log2(L·
    ω_t))/L where L·ω_t >= 2^−½, else 0 (1/L times powers of two, up to about 1/f: at most
    log2(L/f) + 2 levels, 7-8 for the rules measured, so the p is far more often the exact
    series of ``weighted_log_cdf`` than its Chernoff bound; on the design texts exact on every
    full text with the prompt and on 30-100 % without it, against 0-10 % for the linear grid).

    Why (Neyman–Pearson, per position): in the race the chosen token's pivot r_t is Beta(1/p,
    1) (Aaronson & Kirchner 2023), so y_t = −ln r_t is Exp with mean p_t under H1 and Exp(1)
    under H0, and the log-likelihood ratio is −ln p_t − (1/p_t − 1) y_t: the most powerful test
    for known p_t rejects for *small* Σ (1/p_t − 1) y_t. The gain over the Aaronson sum is
    largest at low temperature, where most positions have p_t near 1 (w near 0: no noise from
    them) and a few carry the evidence. Where p_t is misjudged (or rounded to a grid) the test
    only loses power: under H1 a term's mean w_t·p_t never exceeds its H0 mean w_t. The floor f
    bounds the weights and stands for tokens outside the support the detector estimates (p_t =
    0).

    It needs p_t at every position, so it pays only where the detector's law is close to the
    generation's (the prompt given: ``bench/results/detector_likelihood_ratio.md``). And it is no
    test for edited text: a destroyed label adds w_t·Exp(1), and the evidence of an intact one
    is at most w_t (S >= 0), so after 30 % mixed edits it found 8-10 % of the held-out T = 1
    texts against the plain test's 80 % (the linear grid).

    Attributes:
        floor: f in (0, 1). levels: L in [1, 64] (the smallest positive weight is 1/L).
        grid: one of ``GRIDS``.
    Raises:
        ValueError: naming the field (floor outside (0, 1), levels out of range, unknown grid).
    """

    floor: float = 0.05
    levels: int = 4
    grid: str = "linear"

    def __post_init__(self) -> None:
        if not (isinstance(self.floor, float | int) and 0.0 < self.floor < 1.0):
            raise ValueError(f"expected floor in (0, 1), got {self.floor!r}")
        _check_levels(self.levels)
        if self.grid not in GRIDS:
            raise ValueError(f"expected grid one of {GRIDS}, got {self.grid!r}")

    def weights(self, token_logp: ArrayLike) -> NDArray[np.float64]:
        """(T,) float64 ln p_t (<= 0, −inf allowed) -> (T,) float64 weights in [0, 2/f].

        Raises:
            ValueError: not 1-D, ln p_t > 0 (beyond 1e-9, rounding) or NaN.
        """
        logp = np.asarray(token_logp, dtype=np.float64)
        if logp.ndim != 1:
            raise ValueError(f"expected token_logp of shape (T,), got {logp.shape}")
        if np.any(np.isnan(logp)) or np.any(logp > 1e-9):
            raise ValueError("expected token_logp <= 0 (natural log of a probability)")
        p = np.maximum(np.exp(np.minimum(logp, 0.0)), self.floor)
        raw = 1.0 / p - 1.0
        if self.grid == "linear":
            return np.asarray(np.rint(raw * self.levels) / self.levels, dtype=np.float64)
        with np.errstate(divide="ignore"):
            octave = np.rint(np.log2(raw * self.levels))  # −inf at raw = 0 (p = 1)
        keep = octave >= 0.0  # L·ω >= 2^−½: the nearest octave is 1/L or above
        scaled = np.exp2(np.where(keep, octave, 0.0)) / self.levels
        return np.where(keep, scaled, 0.0).astype(np.float64)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": "likelihood_ratio",
            "floor": self.floor,
            "levels": self.levels,
            "grid": self.grid,
        }


LIKELIHOOD_RATIO: Final = LikelihoodRatioWeighting(0.05, 4)
"""The rule the service and CLI use. Chosen on the design prompts with the prompt given, in a
one-off sweep (``docs/experiments/detector-likelihood-ratio.md``; floor 0.02 and 0.05 tied at
6.5 scored tokens to α at T = 0.7, 0.1 gave 7.0, plain 9.5; 0.05 keeps the weights' spread
smaller); frozen before the held-out run. Its weights take up to 77 levels (multiples of 1/4 up
to 19), more than the exact series handles (``MAX_SERIES_LEVELS``), so on most texts past a
handful of scored tokens the p is the Chernoff bound: valid, and conservative (H0 rejection
rates a fifth of α on human passages, ``bench/results/detector_likelihood_ratio.md``). The
geometric grids, whose p was exact on far more of the design texts, did not beat it where the
test is meant to pay (``bench/results/detector_likelihood_ratio_design.json``: median tokens to
α at T = 0.7 with the prompt 7.0 for all nine against 6.5; the short prefixes that decide it
are exact on either grid), so it stays."""

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
    weights, model weights or the edit filter (``weighting`` says which; ``name`` names it).

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
    weighting: EntropyWeighting | ModelWeighting | RankFilter | None = None

    @property
    def p_value(self) -> PValue:
        return PValue.from_log(self.score, self.log_p, self.method)

    @property
    def name(self) -> str:
        """``"edit_filtered"`` (``RankFilter``), ``"model_weighted"`` (``ModelWeighting``),
        else ``"entropy_weighted"`` (``EntropyWeighting`` or caller-given weights)."""
        if isinstance(self.weighting, RankFilter):
            return "edit_filtered"
        if isinstance(self.weighting, ModelWeighting):
            return "model_weighted"
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


def weighted_test(
    weights: ArrayLike,
    terms: ArrayLike,
    weighting: EntropyWeighting | ModelWeighting | RankFilter | None = None,
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


def model_weighted_test(
    skip: Sequence[int] | NDArray[np.int8],
    aaronson_terms: ArrayLike,
    token_logp: ArrayLike,
    raw_rank: ArrayLike,
    context_width: int,
    weighting: ModelWeighting,
) -> WeightedTest:
    """The weighted test with ``ModelWeighting``'s weights (the text's own token's law).

    Args:
        skip: (T,) int8 skip codes of the text (``Detection.evidence.skip``: 0 scored).
        aaronson_terms: (M,) float64 the scored positions' Aaronson terms, in text order.
        token_logp, raw_rank: (T,) from ``sampler.entropy.position_laws`` on the same ids.
        context_width: m of the key the text is tested under.
        weighting: the rule.
    Raises:
        ValueError: lengths that do not match (naming them); as ``ModelWeighting.weights``.
    """
    codes = np.asarray(skip)
    logp = np.asarray(token_logp, dtype=np.float64)
    if logp.shape != codes.shape:
        raise ValueError(
            f"expected token_logp of shape ({codes.size},), one per token, got {logp.shape}"
        )
    weights = weighting.weights(logp, raw_rank, context_width)[codes == _SCORED]  # (M,)
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
