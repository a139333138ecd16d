"""What a detection computes and at which level: ``DetectOptions`` (docs/design.md §4).

One frozen value, validated once where it is made, shared by ``detect``, ``detect_multi`` and
``detect_many`` (and pickled once into each corpus worker).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from detector.combined import REFERENCE_MEAN_SCORE
from detector.scores import ScoreFamily, resolve_scores
from detector.spans import DEFAULT_MAX_SPANS, MAX_SPANS_LIMIT

DEFAULT_ALPHA: Final = 0.01
MAX_ALPHA: Final = 0.5
MIN_REFERENCE_MEAN_SCORE: Final = 1.2
"""The weakest watermark strength a caller may assume (per-token mean Aaronson term; H0's is
1): nearer 1 the tokens a text would need grow as 1/(μ − 1)², and at μ = 1 + 2e-16 past any
bound (the fuzzers' 500); at 1.2 the slowest case, α near 1e-300, takes ~0.15 s."""
DEFAULT_SCORES: tuple[str, ...] = ("aaronson",)
"""Scores computed by default: Aaronson alone (exact p, the most powerful of the four on real
SmolLM2 generations at 16-128 scored tokens: ``bench/results/detector.md``)."""


@dataclass(frozen=True)
class DetectOptions:
    """The options of a detection (the text and the key are its inputs, not options).

    Attributes:
        alpha: level in (0, 0.5] of the verdict (stored as a float).
        key_id: the key's public id, echoed in the result (``detect``, ``detect_many``);
            ``detect_multi`` takes the ids from its sources and wants None here.
        scores: score families to compute besides Aaronson (always computed: the verdict, the
            evidence ``score`` and the spans use its exact p-value): names from
            ``detector.scores.SCORE_NAMES`` (``"u"``, ``"li"``, ``"lattimore"``) or families
            with other parameters (``li_score(0.2)``, ``lattimore_score(1e-4)``); stored as a
            tuple.
        spans: also run the span search (``detector.spans``) and report the strongest windows.
        max_spans: at most this many spans, in [1, 100].
        realign: also run the edit-tolerant re-aligned test (``detector.realign``; ~5× the
            per-token key cost at m = 4), reported beside the verdict's test, not in it.
        reference_mean_score: the per-token mean Aaronson term of a typically watermarked
            text, in [``MIN_REFERENCE_MEAN_SCORE``, 100]: a text whose minimum detectable
            mean score at its M exceeds it is ``insufficient_evidence`` when not significant
            (``detector.combined``; default 1.5, docs/design.md §4).
        families: derived, not an argument: ``resolve_scores(scores)``, Aaronson first.
    Raises:
        ValueError: naming the field and the limit — alpha outside (0, 0.5], a key_id that is
            not a string, an unknown or repeated score, max_spans out of range, spans not a
            bool.
    """

    alpha: float = DEFAULT_ALPHA
    key_id: str | None = None
    scores: Sequence[str | ScoreFamily] = DEFAULT_SCORES
    spans: bool = False
    max_spans: int = DEFAULT_MAX_SPANS
    realign: bool = False
    reference_mean_score: float = REFERENCE_MEAN_SCORE
    families: tuple[ScoreFamily, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, float | int):
            raise ValueError(f"expected alpha to be a number in (0, {MAX_ALPHA}], got {alpha!r}")
        if not (math.isfinite(alpha) and 0.0 < alpha <= MAX_ALPHA):
            raise ValueError(f"expected alpha in (0, {MAX_ALPHA}], got {alpha!r}")
        if self.key_id is not None and not isinstance(self.key_id, str):
            raise ValueError(f"expected key_id to be a string, got {type(self.key_id).__name__}")
        families = resolve_scores(self.scores)
        if not isinstance(self.spans, bool):
            raise ValueError(f"expected spans to be a bool, got {self.spans!r}")
        if not isinstance(self.realign, bool):
            raise ValueError(f"expected realign to be a bool, got {self.realign!r}")
        ref = self.reference_mean_score
        if (
            isinstance(ref, bool)
            or not isinstance(ref, float | int)
            or not (math.isfinite(ref) and MIN_REFERENCE_MEAN_SCORE <= ref <= 100.0)
        ):
            raise ValueError(
                f"expected reference_mean_score a number in [{MIN_REFERENCE_MEAN_SCORE}, 100], "
                f"got {ref!r}"
            )
        max_spans = self.max_spans
        is_int = isinstance(max_spans, int) and not isinstance(max_spans, bool)
        if not (is_int and 1 <= max_spans <= MAX_SPANS_LIMIT):
            raise ValueError(
                f"expected max_spans an int in [1, {MAX_SPANS_LIMIT}], got {max_spans!r}"
            )
        # Normalised in place (the instance is not shared yet): a float level, immutable scores.
        object.__setattr__(self, "alpha", float(alpha))
        object.__setattr__(self, "reference_mean_score", float(ref))
        object.__setattr__(self, "scores", tuple(self.scores))
        object.__setattr__(self, "families", families)
