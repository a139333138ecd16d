"""Watermark detection: text -> token ids -> pivots -> scores -> p-values -> verdict, evidence.

In this package "the MPFR paper" is *Watermarkable Multi-Draft Speculative Sampling via
Poisson Processes* (Liu, Wan, Gao, Gündüz; arXiv:2609.21858), see docs/design.md.

Public API (docs/design.md §4):
- ``detect(tokenizer, source, *, text, token_ids, options) -> Detection``; ``DetectOptions``:
  the level, key id, score families and span search, one frozen validated value.
- ``detect_multi(tokenizer, sources, ...) -> MultiKeyDetection``: every candidate key, the best
  key's p corrected for their number (Bonferroni); its wire shape is the service's
  (``service.jobs.detect_response.detect_response``: one for the CLI and HTTP).
- ``detect_many(tokenizer, source, items, *, workers, ...) -> Iterator[CorpusResult]``: corpora.
- ``Detection``, ``TokenColumns`` (its per-token evidence in NumPy columns), ``TokenEvidence``
  (one row of it), ``Verdict``, ``Span``, ``SpanSearch``: results and their ``to_json()`` wire
  shapes.
- ``SCORES``, ``SCORE_NAMES``, ``ScoreFamily``, ``u_score``, ``li_score``, ``lattimore_score``,
  ``anlppt``: the score families (Aaronson, U, Li et al., Lattimore).
- ``PValue``, ``aaronson_log_sf``, ``aaronson_p_value``, ``min_scored_tokens``: null laws.
- ``canonical_reading``, ``readings``, ``Reading``, ``ReadingReport``, ``Changes``: the
  readings of a text (as submitted, and canonical: invisible characters, Unicode spaces,
  compatibility forms and cross-script confusables undone) that detection tests, corrected
  for their number (``detector.canonical``, ``detector.readings``).
- ``check_tokenizer``, ``TokenizerMismatch``, ``TextTokenIdsMismatch``, ``DetectorError``:
  diagnostics and domain errors.

Never imports ``sampler``: keyed randomness comes from ``keyed`` alone.
"""

from detector.canonical import Changes, Reading, ReadingReport, canonical_reading, readings
from detector.corpus import CorpusItem, CorpusResult, detect_many
from detector.detect import detect
from detector.errors import DetectorError, TextTokenIdsMismatch, TokenizerMismatch
from detector.evidence import Detection, TokenColumns, TokenEvidence, Verdict, verdict
from detector.multikey import MultiKeyDetection, detect_multi
from detector.options import DEFAULT_ALPHA, DEFAULT_SCORES, DetectOptions
from detector.scores import (
    AARONSON,
    SCORE_NAMES,
    SCORES,
    ScoreFamily,
    aaronson_terms,
    anlppt,
    lattimore_score,
    li_score,
    u_score,
)
from detector.spans import Span, SpanSearch
from detector.stats import (
    PValue,
    aaronson_log_sf,
    aaronson_log_sf_many,
    aaronson_p_value,
    min_scored_tokens,
)
from detector.tokens import TokenizedText, Tokenizer, check_tokenizer, tokenize

__all__ = [
    "AARONSON",
    "DEFAULT_ALPHA",
    "DEFAULT_SCORES",
    "SCORES",
    "SCORE_NAMES",
    "Changes",
    "CorpusItem",
    "CorpusResult",
    "DetectOptions",
    "Detection",
    "DetectorError",
    "MultiKeyDetection",
    "PValue",
    "Reading",
    "ReadingReport",
    "ScoreFamily",
    "Span",
    "SpanSearch",
    "TextTokenIdsMismatch",
    "TokenColumns",
    "TokenEvidence",
    "TokenizedText",
    "Tokenizer",
    "TokenizerMismatch",
    "Verdict",
    "aaronson_log_sf",
    "aaronson_log_sf_many",
    "aaronson_p_value",
    "aaronson_terms",
    "anlppt",
    "canonical_reading",
    "check_tokenizer",
    "detect",
    "detect_many",
    "detect_multi",
    "lattimore_score",
    "li_score",
    "min_scored_tokens",
    "readings",
    "tokenize",
    "u_score",
    "verdict",
]
