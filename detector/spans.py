"""Span localisation: where in a text the Aaronson evidence concentrates (docs/design.md §4).

A watermarked passage inside human text (an edited answer, a pasted paragraph, case C3) can be
diluted below significance over the whole text. The span search scans windows of consecutive
scored tokens and tests each with the exact Aaronson law, then corrects for the scan.

Glossary:
- scored index i = 0..M−1: the i-th scored position of the text (skipped positions are not
  counted; a window's character range covers any skipped tokens inside it).
- window (i, L): scored indices i..i+L−1. Lengths are dyadic, L = 16, 32, 64, … <= M; for
  each L the starts are 0, L/4, 2L/4, … (stride a quarter of the length), plus M − L so the
  end of the text is covered at every length.
- W: the number of windows scanned. Under H0 each window's p-value is exact (S ~ Gamma(L, 1)),
  so by the union (Bonferroni) bound P(min over windows of p <= α/W) <= α whatever the
  overlap: the corrected p-value min(1, W·p) is a valid p-value for "some window is
  watermarked".
- spans: the windows with the smallest p, chosen greedily (smallest p first) so that no two
  overlap; at most ``max_spans``.

Shapes: M scored tokens; terms (M,) float64; W windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from detector.stats import LN10, PValue, aaronson_log_sf_many

MIN_WINDOW: Final = 16
DEFAULT_MAX_SPANS: Final = 3
MAX_SPANS_LIMIT: Final = 100


@dataclass(frozen=True)
class Span:
    """One window of scored tokens with strong evidence.

    Attributes:
        start, end: character offsets of the window in the text the evidence indexes, from the
            first scored token's start to the last scored token's end.
        token_start, token_end: token indices [token_start, token_end) of the same range.
        num_scored: L, scored tokens in the window (a power of two, >= 16).
        p_value: the window's exact Aaronson p-value (its ``score`` is the window's S).
        corrected_p_value, corrected_log10_p_value: min(1, W·p), Bonferroni over the W windows
            scanned; the corrected log10 is always finite.
    """

    start: int
    end: int
    token_start: int
    token_end: int
    num_scored: int
    p_value: PValue
    corrected_p_value: float
    corrected_log10_p_value: float

    def __post_init__(self) -> None:
        if not (0 <= self.start <= self.end and 0 <= self.token_start < self.token_end):
            raise ValueError(f"expected ordered offsets, got {self}")
        if not (math.isfinite(self.corrected_log10_p_value) and self.corrected_log10_p_value <= 0):
            raise ValueError(f"expected a finite corrected log10 p <= 0, got {self}")

    def to_json(self) -> dict[str, Any]:
        """``{"start", "end", "token_start", "token_end", "num_scored", "score", "p_value",
        "log10_p_value", "corrected_p_value", "corrected_log10_p_value"}``."""
        return {
            "start": self.start,
            "end": self.end,
            "token_start": self.token_start,
            "token_end": self.token_end,
            "num_scored": self.num_scored,
            "score": self.p_value.score,
            "p_value": self.p_value.p_value,
            "log10_p_value": self.p_value.log10_p_value,
            "corrected_p_value": self.corrected_p_value,
            "corrected_log10_p_value": self.corrected_log10_p_value,
        }


@dataclass(frozen=True)
class SpanSearch:
    """The result of a span scan.

    Attributes:
        windows_scanned: W, the Bonferroni factor (0 when M < 16: nothing to scan).
        lengths: the window lengths scanned, increasing.
        spans: the strongest non-overlapping windows, smallest p first.
    """

    windows_scanned: int
    lengths: tuple[int, ...]
    spans: tuple[Span, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"windows_scanned", "lengths", "spans": [...]}``."""
        return {
            "windows_scanned": self.windows_scanned,
            "lengths": list(self.lengths),
            "spans": [span.to_json() for span in self.spans],
        }


def window_lengths(m: int) -> list[int]:
    """Dyadic window lengths 16, 32, 64, … <= M (empty when M < 16)."""
    lengths: list[int] = []
    length = MIN_WINDOW
    while length <= m:
        lengths.append(length)
        length *= 2
    return lengths


def window_starts(m: int, length: int) -> NDArray[np.int64]:
    """Starts 0, L/4, 2L/4, … <= M − L, plus M − L; (W_L,) int64, increasing, unique."""
    stride = length // 4
    starts = np.arange(0, m - length + 1, stride, dtype=np.int64)
    if starts[-1] != m - length:
        starts = np.append(starts, np.int64(m - length))
    return starts


def scan_windows(
    terms: NDArray[np.float64],
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    """Every window's exact Aaronson log p-value.

    Args:
        terms: (M,) float64 Aaronson terms −ln(1 − r_t) of the scored tokens, in text order.
    Returns:
        (starts (W,) int64, lengths (W,) int64, sums (W,) float64, log_p (W,) float64):
        window i covers scored indices starts[i] .. starts[i] + lengths[i] − 1.
    """
    if terms.ndim != 1:
        raise ValueError(f"expected terms of shape (M,), got {terms.shape}")
    m = int(terms.size)
    prefix = np.concatenate([[0.0], np.cumsum(terms)])  # (M + 1,)
    all_starts, all_lengths, all_sums, all_log_p = [], [], [], []
    for length in window_lengths(m):
        starts = window_starts(m, length)  # (W_L,)
        sums = np.maximum(prefix[starts + length] - prefix[starts], 0.0)  # (W_L,)
        all_starts.append(starts)
        all_lengths.append(np.full(starts.size, length, dtype=np.int64))
        all_sums.append(sums)
        all_log_p.append(aaronson_log_sf_many(length, sums))
    if not all_starts:
        empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return empty_i, empty_i, empty_f, empty_f
    return (
        np.concatenate(all_starts),
        np.concatenate(all_lengths),
        np.concatenate(all_sums),
        np.concatenate(all_log_p),
    )


def bonferroni_log(log_p: float, tests: int) -> float:
    """ln min(1, tests·p): the Bonferroni-corrected log p-value (tests >= 1)."""
    if tests < 1:
        raise ValueError(f"expected tests >= 1, got {tests}")
    return min(0.0, log_p + math.log(tests))


def min_corrected_log_p(terms: NDArray[np.float64]) -> float:
    """ln of the smallest corrected window p-value (0.0 when no window): the family-wise test
    "some window is watermarked" in one number, for simulations."""
    _, _, _, log_p = scan_windows(terms)
    if log_p.size == 0:
        return 0.0
    return bonferroni_log(float(log_p.min()), int(log_p.size))


def find_spans(
    terms: NDArray[np.float64],
    scored_tokens: Sequence[int],
    token_starts: Sequence[int] | NDArray[np.int64],
    token_ends: Sequence[int] | NDArray[np.int64],
    max_spans: int = DEFAULT_MAX_SPANS,
) -> SpanSearch:
    """Scan the windows and keep the strongest non-overlapping ones.

    Args:
        terms: (M,) float64 Aaronson terms of the scored tokens, in text order.
        scored_tokens: (M,) token index of each scored token in the text.
        token_starts, token_ends: (T,) character offsets of every token of the text.
        max_spans: at most this many spans, 1..``MAX_SPANS_LIMIT``.
    Returns:
        a ``SpanSearch``; spans sorted by p (smallest first; ties: earlier, then shorter).
    Raises:
        ValueError: mismatched lengths or max_spans out of range.
    """
    if isinstance(max_spans, bool) or not isinstance(max_spans, int):
        raise ValueError(f"expected max_spans an int in [1, {MAX_SPANS_LIMIT}], got {max_spans!r}")
    if not 1 <= max_spans <= MAX_SPANS_LIMIT:
        raise ValueError(f"expected max_spans in [1, {MAX_SPANS_LIMIT}], got {max_spans}")
    if len(scored_tokens) != terms.size:
        raise ValueError(f"expected {terms.size} scored token indices, got {len(scored_tokens)}")
    starts, lengths, sums, log_p = scan_windows(terms)
    scanned = int(log_p.size)
    chosen: list[Span] = []
    taken = np.zeros(terms.size, dtype=bool)  # (M,) scored indices inside a chosen span
    for w in np.lexsort((lengths, starts, log_p)).tolist():  # smallest p first
        first, length = int(starts[w]), int(lengths[w])
        if taken[first : first + length].any():
            continue
        taken[first : first + length] = True
        token_start, last = scored_tokens[first], scored_tokens[first + length - 1]
        corrected = bonferroni_log(float(log_p[w]), scanned)
        chosen.append(
            Span(
                start=int(token_starts[token_start]),
                end=int(token_ends[last]),
                token_start=token_start,
                token_end=last + 1,
                num_scored=length,
                p_value=PValue.from_log(float(sums[w]), float(log_p[w]), "exact"),
                corrected_p_value=math.exp(corrected),
                corrected_log10_p_value=corrected / LN10,
            )
        )
        if len(chosen) == max_spans:
            break
    return SpanSearch(scanned, tuple(window_lengths(int(terms.size))), tuple(chosen))
