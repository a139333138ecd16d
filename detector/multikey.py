"""Detection without a key id: test every candidate key, correct for the count (docs/design.md §4).

Glossary:
- K: the number of candidate keys tested; p_k: key k's verdict p-value, the combined test of
  its whole-text Aaronson p and its best window (``detector.combined``; valid under H0).
- best key: the key with the smallest p_k (ties: the first in the caller's order).
- corrected p: min(1, K·min_k p_k), the Bonferroni bound. Under H0 (the text carries none of
  the keys' watermarks) P(min_k p_k <= α/K) <= Σ_k P(p_k <= α/K) = α whatever the dependence
  between keys, so the corrected p is a valid p-value for "one of these keys marked the text".
  (Šidák's 1 − (1 − p)^K would be exact for independent keys; it differs from K·p by less than
  (Kp)²/2, nothing at the levels a verdict uses, and Bonferroni needs no independence.)
- reported beside it, each corrected for K the same way: the plain whole-text p
  min(1, K·min_k p0_k) and the span p min(1, K·min_k W·scan_k) — the best window of any key,
  corrected for the W windows and the K keys (the span p of the best key
  alone, corrected for W only, rejected in 5 % of human texts at α = 1 % with 20 keys).
- detailed keys: the best ``detailed`` keys, whose full ``Detection`` (every requested score,
  evidence, spans) is returned; every key's Aaronson p-value is computed either way.

How it scales (``bench/multikey_cost.py``): the tokenization and the repeated-context plan do
not depend on the key (only on its context width m), so they run once per text and width. The
per-key work is the context keys, the pivots and the Aaronson sum: ``keyed.pivot_matrix``
computes the (K, M) pivots in one compiled pass (keyed BLAKE2b + Philox per (key, label)), in
chunks of keys that bound memory, then the sums and the K p-values are array operations. Row k
is bit for bit what ``detect`` computes for key k (``tests/detector/test_multikey.py``).

Which keys are candidates is the caller's business: the service passes the caller's tenant's
active keys, and revoked keys only when asked (a revoked key can no longer generate, but text
it watermarked earlier still carries its mark). Every extra key costs a factor in the
corrected p, so pass no more keys than the question needs.

Shapes: K keys, T tokens of the text, M scored tokens (one context width: the same M for every
key). Token ids (T,) int64; pivots and Aaronson terms (K, M) float64; per key ln p,
combined-test ln p (K,) float64 and scored tokens (K,) int64.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from detector.canonical import ReadingReport
from detector.combined import (
    REFERENCE_MEAN_SCORE,
    combine,
    min_detectable_mean_score,
    needed_tokens,
    scan_min_log_p_rows,
    whole_text_log_level,
    windows_scanned,
)
from detector.detect import (
    DEFAULT_OPTIONS,
    check_options,
    detect_tokenized,
    read_input,
)
from detector.evidence import Detection, Verdict, verdict
from detector.options import DetectOptions
from detector.readings import ReadText, corrected, report_for
from detector.scores import aaronson_terms
from detector.spans import bonferroni_log
from detector.stats import LN10, PValue, aaronson_log_sf_many
from detector.tokens import TokenizedText, Tokenizer
from keyed import KeyedSource, detection_plan_arrays, pivot_matrix

MAX_KEYS: Final = 10_000
CHUNK_ELEMENTS: Final = 1 << 20
"""Pivots computed per ``pivot_matrix`` call (keys × scored tokens): 8 MB of float64 at most."""


@dataclass(frozen=True, eq=False)
class MultiKeyDetection:
    """The result of testing one text against K candidate keys.

    Attributes:
        results: the full ``Detection`` of each detailed key by key id, best first (ties in
            the caller's order). Their verdicts and p-values are per key, *uncorrected* for
            the K keys (corrected for the R readings, as ``detect``'s).
        key_ids: (K,) every key tested, in the caller's order.
        log_p_values: (K,) float64 each key's own Aaronson natural-log p-value on its reading
            (the one with its smallest verdict p), uncorrected, in ``key_ids`` order (``/ LN10``
            is bit for bit ``detect``'s ``log10_p_value`` before the R correction).
        verdict_log_p_values: (K,) float64 each key's own combined-test ln p on its reading
            (bit for bit ``detect``'s ``test.log_p`` before the R correction), uncorrected.
        num_scored: (K,) int64 each key's scored tokens on its reading.
        best_key_id: the key with the smallest verdict p-value.
        num_keys: K.
        p_value, log10_p_value: the best key's verdict p-value corrected for K keys and R
            readings (Bonferroni over the K·R pairs), min(1, K·R·p_best); log10 always finite.
        whole_text_log10_p_value: log10 min(1, K·R·min p0), the plain whole-text test.
        span_log10_p_value: log10 min(1, K·R·min W·scan), the best window of any key and
            reading corrected for windows, keys and readings; None when no key has a window
            (M < 16).
        min_detectable_mean_score: μ* of the best key at its M and the level α/K share of the
            whole text (``detector.combined``); None when it scored nothing.
        reference_mean_score: the strength μ* is compared to.
        verdict: at ``alpha`` on the corrected p (``insufficient_evidence`` when it is not
            significant and the best key scored fewer than ``min_scored_tokens`` tokens).
        alpha: the level.
        min_scored_tokens: the tokens a typical watermarked text needs to reach α/(K·R), the
            level the best key's own p must reach (``needed_tokens``; α's for K·R = 1).
        reading: which reading carried the best key's evidence and what the canonical
            reading changed (``detector.readings``); None for exact token ids. Each key is read
            as ``detect`` reads it alone: its own reading is the one with its smallest verdict
            p, and its ``results`` entry carries that reading's report with every p-value
            corrected for R (as ``detect``'s), not K.
        num_readings: R, the readings tried (1 or 2).
    """

    results: dict[str, Detection]
    key_ids: tuple[str, ...]
    log_p_values: NDArray[np.float64]
    num_scored: NDArray[np.int64]
    best_key_id: str
    num_keys: int
    p_value: float
    log10_p_value: float
    verdict: Verdict
    alpha: float
    min_scored_tokens: int
    verdict_log_p_values: NDArray[np.float64] | None = None
    whole_text_log10_p_value: float = 0.0
    span_log10_p_value: float | None = None
    min_detectable_mean_score: float | None = None
    reference_mean_score: float = REFERENCE_MEAN_SCORE
    reading: ReadingReport | None = None
    num_readings: int = 1

    def __post_init__(self) -> None:
        k = len(self.key_ids)
        if self.num_keys != k or self.log_p_values.shape != (k,) or self.num_scored.shape != (k,):
            raise ValueError(f"expected num_keys = {k} keys, p-values and counts")
        if self.best_key_id not in self.results:
            raise ValueError("expected the best key among the detailed results")
        if not (math.isfinite(self.log10_p_value) and self.log10_p_value <= 0.0):
            raise ValueError(f"expected a finite log10 p <= 0, got {self.log10_p_value}")

    @property
    def best(self) -> Detection:
        """The best key's own detection (uncorrected)."""
        return self.results[self.best_key_id]


def best_key_corrected(log_p: ArrayLike, tests: int | None = None) -> tuple[int, float]:
    """Index of the smallest p and its Bonferroni-corrected natural-log p-value.

    Args:
        log_p: (K,) float64 natural-log p-values of the K keys, K >= 1.
    Returns:
        (argmin, ln min(1, n·p_min)) with n = ``tests``, or K when None (the keys are the
        tests; with R readings per key, K·R); ties go to the first index.
    """
    values = np.asarray(log_p, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"expected log_p of shape (K,) with K >= 1, got {values.shape}")
    best = int(np.argmin(values))
    return best, bonferroni_log(float(values[best]), int(values.size) if tests is None else tests)


def detect_multi(
    tokenizer: Tokenizer,
    sources: Mapping[str, KeyedSource],
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    options: DetectOptions = DEFAULT_OPTIONS,
    detailed: int | None = None,
    tokenized: TokenizedText | None = None,
    read: Sequence[ReadText] | None = None,
) -> MultiKeyDetection:
    """Test a text against every candidate key and correct the best p-value for their number.

    Args:
        tokenizer: the keys' tokenizer (all candidates must share it: check each key's
            fingerprint with ``check_tokenizer`` first).
        sources: key id -> keyed source, 1..``MAX_KEYS`` keys (the caller chooses them: active
            keys of the tenant; revoked ones only when asked).
        text, token_ids: as ``detect``; each reading of the text is tokenized once.
        tokenized: the input already tokenized as submitted (one reading), instead of
            ``text`` and ``token_ids``.
        read: the input's readings already tokenized (``detect.read_input``: a caller that
            bounds their length first), instead of ``text``, ``token_ids`` and ``tokenized``.
        options: as ``detect``, for the detailed keys, with ``key_id`` None (each result
            carries its key's id from ``sources``). The best-key search and the correction
            use the Aaronson p-value, the one a verdict uses.
        detailed: how many of the best keys get a full ``Detection`` (>= 1); None for all.
            With ``options.realign``, only the best key's carries the re-aligned test.
    Returns:
        a ``MultiKeyDetection``: every key's Aaronson p-value, the detailed keys' results and
        the corrected verdict.
    Raises:
        ValueError: no keys or more than ``MAX_KEYS``, a key id that is not a string, a source
            that is not a ``KeyedSource``, ``options.key_id`` set, ``detailed`` < 1, or any
            ``detect`` input error.
    """
    check_options(options)
    if options.key_id is not None:
        raise ValueError(
            f"expected options.key_id None (ids come from sources), got {options.key_id!r}"
        )
    if not isinstance(sources, Mapping) or not 1 <= len(sources) <= MAX_KEYS:
        size = len(sources) if isinstance(sources, Mapping) else type(sources).__name__
        raise ValueError(f"expected a mapping of 1..{MAX_KEYS} key ids to sources, got {size}")
    for key_id, source in sources.items():
        if not isinstance(key_id, str):
            raise ValueError(f"expected key ids to be strings, got {key_id!r}")
        if not isinstance(source, KeyedSource):
            raise ValueError(
                f"expected sources[{key_id!r}] to be a KeyedSource, got {type(source).__name__}"
            )
    if detailed is not None and (isinstance(detailed, bool) or detailed < 1):
        raise ValueError(f"expected detailed >= 1 or None, got {detailed!r}")
    given = sum(x is not None for x in (tokenized, read))
    if given > 1 or (given and (text is not None or token_ids is not None)):
        raise ValueError("expected read or tokenized alone, or text and/or token_ids, got more")
    if read is None:
        if tokenized is not None:
            read = (ReadText(None, tokenized),)
        else:
            read = read_input(tokenizer, text, token_ids)
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    ids = list(sources)
    tests = [_key_tests(r.tokenized, special, [sources[k] for k in ids]) for r in read]
    # each key's reading: its smallest verdict log10 p, the first (raw) on ties: ``detect``'s
    # rule on the same numbers (``best_of`` over ``verdict_log10_p_value``)
    by_reading = np.stack([t.combined for t in tests])  # (R, K)
    own = np.argmin(by_reading / LN10, axis=0)  # (K,) first index of the minimum
    keys = np.arange(len(ids))
    combined = by_reading[own, keys]  # (K,)
    log_p = np.stack([t.log_p for t in tests])[own, keys]  # (K,)
    num_scored = np.stack([t.num_scored for t in tests])[own, keys]  # (K,)
    pairs = len(ids) * len(read)
    best, corrected_log = best_key_corrected(combined, pairs)
    whole_corrected = bonferroni_log(min(float(np.min(t.log_p)) for t in tests), pairs)
    scans = [
        float(s) + math.log(n) for t in tests for s, n in zip(t.scan, t.windows, strict=True) if n
    ]
    span = bonferroni_log(min(scans), pairs) / LN10 if scans else None
    report = report_for(read, int(own[best]))
    order = np.argsort(combined, kind="stable")[: len(ids) if detailed is None else detailed]
    # Each key's own result carries its reading's report and its p-values times R, as
    # detect's: a detailed key's result is what testing that key alone gives. The re-aligned
    # test (seconds per key on long texts with wide contexts) runs for the best key alone: its
    # p is the one reported, corrected for K; running it for every detailed key let one
    # request cost up to ``detailed`` times that.
    results = {
        ids[i]: corrected(
            detect_tokenized(
                read[own[i]].tokenized,
                special,
                sources[ids[i]],
                dataclasses.replace(options, key_id=ids[i], realign=options.realign and i == best),
            ),
            report_for(read, int(own[i])),
        )
        for i in order.tolist()
    }
    best_result = results[ids[best]]
    corrected_p = PValue.from_log(best_result.p_value.score, corrected_log, "exact")
    needed = _needed(options.alpha, pairs, best_result.min_scored_tokens, options)
    m_best = best_result.num_scored
    mu = min_detectable_mean_score(m_best, whole_text_log_level(options.alpha, m_best, pairs))
    return MultiKeyDetection(
        results=results,
        key_ids=tuple(ids),
        log_p_values=log_p,
        num_scored=num_scored,
        best_key_id=ids[best],
        num_keys=len(ids),
        p_value=corrected_p.p_value,
        log10_p_value=corrected_log / LN10,
        verdict=verdict(corrected_p, best_result.num_scored, options.alpha, needed),
        alpha=options.alpha,
        min_scored_tokens=needed,
        verdict_log_p_values=combined,
        whole_text_log10_p_value=whole_corrected / LN10,
        span_log10_p_value=span,
        min_detectable_mean_score=mu,
        reference_mean_score=options.reference_mean_score,
        reading=report,
        num_readings=len(read),
    )


@dataclass(frozen=True, eq=False)
class _KeyTests:
    """Every key's tests on one reading: (K,) ln p, best-window ln p, M, windows W, and the
    verdict's combined ln p."""

    log_p: NDArray[np.float64]
    scan: NDArray[np.float64]
    num_scored: NDArray[np.int64]
    windows: list[int]
    combined: NDArray[np.float64]


def _key_tests(
    tokenized: TokenizedText, special: frozenset[int], sources: Sequence[KeyedSource]
) -> _KeyTests:
    log_p, scan, num_scored = _aaronson_all(tokenized.ids, special, sources)
    windows = [windows_scanned(int(m)) for m in num_scored.tolist()]
    combined = np.array(
        [combine(float(w), float(s), n) for w, s, n in zip(log_p, scan, windows, strict=True)]
    )  # (K,)
    return _KeyTests(log_p, scan, num_scored, windows, combined)


def _aaronson_all(
    ids: NDArray[np.int64], special: frozenset[int], sources: Sequence[KeyedSource]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]:
    """Every key's Aaronson ln p, best-window ln p and scored count: one plan per context
    width, the pivots of a chunk of keys in one ``pivot_matrix`` call.

    Args:
        ids: (T,) int64 the text. sources: K keyed sources.
    Returns:
        ((K,) float64 ln p, (K,) float64 ln min_w p_w (``scan_min_log_p_rows``), (K,) int64 M),
        in ``sources`` order.
    """
    log_p = np.zeros(len(sources), dtype=np.float64)  # (K,)
    scan = np.zeros(len(sources), dtype=np.float64)  # (K,)
    num_scored = np.zeros(len(sources), dtype=np.int64)  # (K,)
    by_width: dict[int, list[int]] = {}
    for k, source in enumerate(sources):
        by_width.setdefault(source.context_width, []).append(k)
    for width, members in by_width.items():
        # The plan skips repeated labels whatever the masking flag (detect_tokenized's rule).
        plan = detection_plan_arrays(ids, width, special)
        m = int(plan.scored.shape[0])
        num_scored[members] = m
        if m == 0:
            continue  # ln p = 0: no tokens, no evidence
        tokens = ids[plan.scored]  # (M,)
        chunk = max(1, CHUNK_ELEMENTS // m)
        for start in range(0, len(members), chunk):
            rows = members[start : start + chunk]
            pivots = pivot_matrix([sources[k].secret for k in rows], plan.labels, tokens)
            terms = aaronson_terms(pivots)  # (k, M)
            sums = terms.sum(axis=1)  # (k,) as detect's np.sum per row
            log_p[rows] = aaronson_log_sf_many(m, sums)
            scan[rows] = scan_min_log_p_rows(terms)
    return log_p, scan, num_scored


def _needed(alpha: float, keys: int, at_alpha: int, options: DetectOptions) -> int:
    """``needed_tokens(α/K)``; ``at_alpha`` (α's) for K = 1 or a level beyond its table."""
    if keys == 1:
        return at_alpha
    try:
        return needed_tokens(alpha / keys, options.reference_mean_score)
    except ValueError:  # α/K underflows or needs more than the table holds
        return at_alpha
