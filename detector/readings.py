"""Detection over the readings of a text: the raw one and the canonical one, corrected.

A submitted text is tested as written and, when it differs, as its canonical reading
(``detector.canonical``); the reading whose verdict p is smallest carries the evidence and
every p-value of the result is multiplied by R, the number of readings tried (Bonferroni;
docs/design.md §4, "Readings"). Exact token ids are scored as they are: one reading.

The canonical reading's token offsets are mapped back to the submitted text, so evidence and
spans always index the characters the user sent.

Shapes: T tokens of a reading; offsets (T,) int64 into the submitted text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from detector.canonical import RAW, Changes, Reading, ReadingReport, readings
from detector.combined import min_detectable_mean_score, needed_tokens, whole_text_log_level
from detector.evidence import Detection, verdict
from detector.spans import SpanSearch, bonferroni_log
from detector.stats import PValue
from detector.tokens import TokenizedText, Tokenizer, tokenize

LN10 = math.log(10.0)
T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class ReadText:
    """One reading tokenized: its ids and their spans in the submitted text.

    Attributes:
        reading: the reading; None for exact token ids (scored as given).
        tokenized: (T,) ids with offsets into the submitted text (``TokenizedText``).
    """

    reading: Reading | None
    tokenized: TokenizedText


def tokenize_readings(
    tokenizer: Tokenizer, text: str | None, token_ids: Sequence[int] | None
) -> tuple[ReadText, ...]:
    """The input's readings, each tokenized once.

    Args:
        tokenizer, text, token_ids: as ``detector.detect`` (already validated by
            ``detect.tokenize_input``'s checks; ``tokenize`` raises the same errors).
    Returns:
        one ``ReadText`` for token ids (with or without text); for text alone, the raw
        reading and, when it differs, the canonical one, offsets into ``text``.
    """
    if token_ids is not None or text is None:
        return (ReadText(None, tokenize(tokenizer, text, token_ids)),)
    return tuple(ReadText(r, _tokenize_reading(tokenizer, r, text)) for r in readings(text))


def _tokenize_reading(tokenizer: Tokenizer, reading: Reading, submitted: str) -> TokenizedText:
    tokenized = tokenize(tokenizer, reading.text, None)
    if reading.name == RAW:
        return tokenized
    n = int(tokenized.ids.shape[0])
    starts = reading.source_boundaries(tokenized.starts, len(submitted))  # (T,)
    if n:
        starts[0] = 0  # a partition of the submitted text: leading removed characters too
    ends = np.append(starts[1:], np.int64(len(submitted))) if n else starts.copy()
    return TokenizedText(tokenized.ids, submitted, starts, ends, None)


def report_for(read: Sequence[ReadText], best: int) -> ReadingReport | None:
    """The report of reading ``best`` of ``read`` (None for exact token ids)."""
    chosen = read[best].reading
    if chosen is None:
        return None
    changes = read[-1].reading.changes if read[-1].reading is not None else Changes()
    return ReadingReport(chosen.name, len(read), changes)


def best_of(values: Sequence[T], log_p: Callable[[T], float]) -> int:
    """Index of the smallest ``log_p`` (the first on ties: the raw reading wins a tie)."""
    return min(range(len(values)), key=lambda i: (log_p(values[i]), i))


def corrected(detection: Detection, report: ReadingReport | None) -> Detection:
    """``detection`` with its reading report and every p-value multiplied by R (capped at 1):
    the scores, the verdict's test and its parts, the re-aligned test, the spans; what the text
    could show (``min_scored_tokens``, ``min_detectable_mean_score``) at the level α/R; the
    verdict taken again on the corrected p."""
    if report is None:
        return detection
    factor = report.readings_tried
    if factor == 1:
        return dataclasses.replace(detection, reading=report)
    scores = {
        name: PValue.from_log(p.score, bonferroni_log(p.log10_p_value * LN10, factor), p.method)
        for name, p in detection.scores.items()
    }
    test = detection.test
    if test is not None:
        test = dataclasses.replace(
            test,
            log_p=bonferroni_log(test.log_p, factor),
            whole_text_log_p=bonferroni_log(test.whole_text_log_p, factor),
            scan_log_p=bonferroni_log(test.scan_log_p, factor),
        )
    realigned = detection.realigned
    if realigned is not None:
        realigned = dataclasses.replace(realigned, log_p=bonferroni_log(realigned.log_p, factor))
    spans = detection.spans
    if spans is not None:
        spans = _corrected_spans(spans, factor)
    try:  # what a typical watermarked text needs to reach α/R, the level the reading's p must
        needed = needed_tokens(detection.alpha / factor, detection.reference_mean_score)
    except ValueError:  # beyond the table: α's
        needed = detection.min_scored_tokens
    m = detection.num_scored
    mu = min_detectable_mean_score(m, whole_text_log_level(detection.alpha, m, factor))
    out = dataclasses.replace(
        detection,
        scores=scores,
        test=test,
        realigned=realigned,
        spans=spans,
        reading=report,
        min_scored_tokens=needed,
        min_detectable_mean_score=mu,
    )
    log_p = out.verdict_log10_p_value * LN10
    p = PValue.from_log(out.p_value.score, log_p, "exact")
    return dataclasses.replace(
        out, verdict=verdict(p, out.num_scored, out.alpha, out.min_scored_tokens)
    )


def _corrected_spans(search: SpanSearch, factor: int) -> SpanSearch:
    spans = []
    for span in search.spans:
        log10 = bonferroni_log(span.corrected_log10_p_value * LN10, factor) / LN10
        spans.append(
            dataclasses.replace(span, corrected_log10_p_value=log10, corrected_p_value=10**log10)
        )
    return dataclasses.replace(search, spans=tuple(spans))
