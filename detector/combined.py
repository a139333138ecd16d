"""The verdict's test: whole text and spans in one valid p-value, and what it could detect.

Glossary (M scored tokens, Aaronson terms x_t = −ln(1 − r_t)):

- whole-text p: p_0 = Q(M, Σ x_t), exact (``detector.stats``).
- windows: the span search's windows (``detector.spans``: dyadic lengths L >= 16, stride L/4,
  plus the window ending the text), W of them; window w's p_w = Q(L_w, S_w) is exact.
  ``scan`` = min_w p_w; only the largest sum of each length needs a tail (Q is decreasing in
  S), so the scan costs one ``gammaincc`` per length, not per window.
- combined p (weighted Bonferroni, Holm 1979 / Genovese et al. 2006 weights): with weights
  a = ``WHOLE_TEXT_WEIGHT`` = 0.9 on the whole text and 1 − a spread evenly over the W windows,

      p = min(1, p_0 / a, W · scan / (1 − a))        (W >= 1; p = p_0 when W = 0, M < 16).

  Under H0 each p_w and p_0 is exact, so P(p <= α) <= a·α + W·(1 − a)·α/W = α whatever the
  overlap of the windows: a valid p-value for "the whole text or some window is watermarked".
  The weight is fixed before looking at the held-out data (bench/results/detector.md): a
  diluted answer has a scan p many orders below α (a 128-token answer in 2,000 human tokens:
  log10 scan ≈ −29…−41 against W ≈ 900), so 10 % of the level is plenty there, while a
  whole-text detection keeps 90 % of it.
- power (item 4): the *minimum detectable mean score* μ*(M) is the smallest per-token mean
  Aaronson term that reaches the whole-text level ℓ(M) (a·α for M >= 16, α below; α/K more
  for K keys) at this M: Q(M, μ*·M) = ℓ. A text with p >= α and μ*(M) above the reference
  strength (``REFERENCE_MEAN_SCORE`` = 1.5, docs/design.md §4; SmolLM2 at T = 1 averages ≈ 2.6, at
  T = 0.7 1.4-1.9) is ``insufficient_evidence``: even a typically watermarked text of this
  length would not have been detected. ``needed_tokens`` is the smallest M where μ*(M) <=
  the reference (28 at α = 0.01 for the whole text alone, 29 with the windows' share).

Sources: Aaronson & Kirchner (2023) for the Gamma tail; the union bound for the weights.

Shapes: K keys, M scored tokens, W windows. Aaronson terms (M,) float64, or (K, M) float64 for
the keys of one text; window starts and ends (W,) int64; ln p per key (K,) float64; scalars
float (natural-log p-values).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from detector.spans import MIN_WINDOW, window_lengths, window_starts
from detector.stats import LN10, aaronson_log_sf, aaronson_log_sf_many, min_scored_tokens

WHOLE_TEXT_WEIGHT: Final = 0.9
"""a: the share of the level the whole-text p gets; the windows share 1 − a."""
REFERENCE_MEAN_SCORE: Final = 1.5
"""The per-token mean Aaronson term of a typically watermarked text (docs/design.md §4)."""
TEST_NAME: Final = "whole_text+spans"


@dataclass(frozen=True)
class CombinedTest:
    """The verdict's p-value and its parts (natural logs inside, log10 on the wire).

    Attributes:
        log_p: ln of the combined p (module docstring), <= 0, finite.
        whole_text_log_p: ln p_0, the plain whole-text Aaronson p (also ``scores``).
        windows_scanned: W (0 when M < 16: the test is the whole text alone).
        scan_log_p: ln min(1, W · min_w p_w), the best window Bonferroni-corrected for W
            (0.0 when W = 0).
    """

    log_p: float
    whole_text_log_p: float
    windows_scanned: int
    scan_log_p: float

    @property
    def p_value(self) -> float:
        return math.exp(self.log_p)

    @property
    def log10_p_value(self) -> float:
        return self.log_p / LN10

    def to_json(self) -> dict[str, Any]:
        """``{"name", "whole_text_weight", "windows_scanned", "p_value", "log10_p_value",
        "whole_text_log10_p_value", "scan_log10_p_value"}``."""
        return {
            "name": TEST_NAME if self.windows_scanned else "whole_text",
            "whole_text_weight": WHOLE_TEXT_WEIGHT if self.windows_scanned else 1.0,
            "windows_scanned": self.windows_scanned,
            "p_value": self.p_value,
            "log10_p_value": self.log10_p_value,
            "whole_text_log10_p_value": self.whole_text_log_p / LN10,
            "scan_log10_p_value": self.scan_log_p / LN10,
        }


def combine(whole_log_p: float, scan_min_log_p: float, windows: int) -> float:
    """ln of the combined p from ln p_0, ln min_w p_w (uncorrected) and W (module docstring)."""
    if windows == 0:
        return min(0.0, whole_log_p)
    whole = whole_log_p - math.log(WHOLE_TEXT_WEIGHT)
    scan = scan_min_log_p + math.log(windows) - math.log1p(-WHOLE_TEXT_WEIGHT)
    return min(0.0, whole, scan)


@functools.lru_cache(maxsize=1024)
def _window_index(
    m: int,
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], tuple[int, ...]]:
    """Every window of M scored tokens as read-only index arrays, cached per M: (starts (W,),
    ends (W,), the first window of each length (n_L,), the lengths), grouped by length in
    ``scan_windows``'s order."""
    lengths = tuple(window_lengths(m))
    starts = [window_starts(m, length) for length in lengths]
    begin = np.cumsum([0] + [s.size for s in starts[:-1]], dtype=np.int64)
    first = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    ends = first + np.repeat(np.array(lengths, dtype=np.int64), [s.size for s in starts])
    for array in (first, ends, begin):
        array.flags.writeable = False
    return first, ends, begin, lengths


def windows_scanned(m: int) -> int:
    """W, the number of windows of M scored tokens (``detector.spans.scan_windows``'s count)."""
    return int(_window_index(m)[0].size)


def scan_min_log_p_rows(terms: NDArray[np.float64]) -> NDArray[np.float64]:
    """ln min_w p_w per row: (K, M) float64 Aaronson terms -> (K,) float64 (0.0 when M < 16).

    Row k is bit for bit ``scan_min_log_p(terms[k])`` (the same cumulative sums, window sums
    and tails; a single row takes ``aaronson_log_sf_many``'s scalar path, the same bits).
    Cost: one cumulative sum, one gather and one ``maximum.reduceat`` per call, then one tail
    per length (~5-8 for 100-1,000 tokens).
    """
    if terms.ndim != 2:
        raise ValueError(f"expected terms of shape (K, M), got {terms.shape}")
    k, m = terms.shape
    out = np.zeros(k, dtype=np.float64)
    if m < MIN_WINDOW or k == 0:
        return out
    starts, ends, begin, lengths = _window_index(m)
    prefix = np.zeros((k, m + 1), dtype=np.float64)  # (K, M + 1)
    np.cumsum(terms, axis=1, out=prefix[:, 1:])
    sums = np.maximum(prefix[:, ends] - prefix[:, starts], 0.0)  # (K, W)
    best = np.maximum.reduceat(sums, begin, axis=1)  # (K, n_L) the largest sum per length
    for i, length in enumerate(lengths):
        out = np.minimum(out, aaronson_log_sf_many(length, best[:, i]))
    return out


def scan_min_log_p(terms: NDArray[np.float64]) -> float:
    """ln min_w p_w over the windows of (M,) float64 Aaronson terms (0.0 when M < 16)."""
    if terms.ndim != 1:
        raise ValueError(f"expected terms of shape (M,), got {terms.shape}")
    return float(scan_min_log_p_rows(terms[None, :])[0])


def combined_test(terms: NDArray[np.float64], whole_log_p: float) -> CombinedTest:
    """The verdict's test of one text: (M,) float64 Aaronson terms and their whole-text ln p."""
    m = int(terms.size)
    windows = windows_scanned(m)
    scan = scan_min_log_p(terms) if windows else 0.0
    scan_corrected = min(0.0, scan + math.log(windows)) if windows else 0.0
    return CombinedTest(combine(whole_log_p, scan, windows), whole_log_p, windows, scan_corrected)


def whole_text_log_level(alpha: float, m: int, keys: int = 1) -> float:
    """ln ℓ(M): the level the whole-text p must reach alone, a·α/K for M >= 16, else α/K
    (in logs: α/K may underflow)."""
    log_level = math.log(alpha) - math.log(keys)
    return log_level + math.log(WHOLE_TEXT_WEIGHT) if m >= MIN_WINDOW else log_level


@functools.lru_cache(maxsize=4096)
def min_detectable_mean_score(m: int, log_level: float) -> float | None:
    """μ*(M): the per-token mean Aaronson term at which ln Q(M, μ·M) = ``log_level`` (None for
    M = 0).

    Solved by bisection on the exact log-space tail (Q is decreasing in S), to 1e-9
    relative; > 1 for levels below 1/2 (the H0 mean is 1).

    Args:
        m: M >= 0 scored tokens. log_level: ln of the level, < 0 (any depth: no underflow).
    Raises:
        ValueError: log_level not a negative finite number, or m < 0.
    """
    if not (math.isfinite(log_level) and log_level < 0.0):
        raise ValueError(f"expected a log level < 0, got {log_level!r}")
    if m < 0:
        raise ValueError(f"expected m >= 0, got {m}")
    if m == 0:
        return None
    target = log_level
    low, high = 0.0, 2.0
    while aaronson_log_sf(m, high * m) > target:
        low, high = high, high * 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if aaronson_log_sf(m, mid * m) > target:
            low = mid
        else:
            high = mid
        if high - low <= 1e-9 * high:
            break
    return high


@functools.lru_cache(maxsize=256)
def needed_tokens(alpha: float, mean_score: float = REFERENCE_MEAN_SCORE) -> int:
    """The smallest M at which a text of mean term ``mean_score`` reaches ℓ(M) (the
    ``min_scored_tokens`` of the combined test): min_scored_tokens(α) when that is below 16
    (the whole text alone), else max(16, min_scored_tokens(a·α)).

    Raises:
        ValueError: as ``min_scored_tokens``.
    """
    alone = min_scored_tokens(alpha, mean_score)
    if alone < MIN_WINDOW:
        return alone
    # a·α rounds to 0 for the smallest subnormal α: keep the smallest positive float there
    level = max(alpha * WHOLE_TEXT_WEIGHT, 5e-324)
    return max(MIN_WINDOW, min_scored_tokens(level, mean_score))
