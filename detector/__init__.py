"""Watermark detection: text -> token ids -> pivots -> scores -> p-values -> verdict, evidence.

Public API (DESIGN §4):
- ``detect(tokenizer, source, *, text, token_ids, alpha, key_id) -> Detection``
- ``Detection``, ``TokenEvidence``, ``Verdict``: the result and its ``to_json()`` wire shape.
- ``PValue``, ``aaronson_log_sf``, ``aaronson_p_value``, ``min_scored_tokens``: null laws.
- ``SCORES``, ``ScoreFamily``, ``anlppt``: score families (Aaronson for now).

Never imports ``sampler``: keyed randomness comes from ``keyed`` alone.
"""

from detector.detect import DEFAULT_ALPHA, detect, verdict
from detector.evidence import Detection, TokenEvidence, Verdict
from detector.scores import AARONSON, SCORES, ScoreFamily, aaronson_terms, anlppt
from detector.stats import (
    PValue,
    aaronson_log_sf,
    aaronson_log_sf_many,
    aaronson_p_value,
    min_scored_tokens,
)
from detector.tokens import TokenizedText, Tokenizer, tokenize

__all__ = [
    "AARONSON",
    "DEFAULT_ALPHA",
    "SCORES",
    "Detection",
    "PValue",
    "ScoreFamily",
    "TokenEvidence",
    "TokenizedText",
    "Tokenizer",
    "Verdict",
    "aaronson_log_sf",
    "aaronson_log_sf_many",
    "aaronson_p_value",
    "aaronson_terms",
    "anlppt",
    "detect",
    "min_scored_tokens",
    "tokenize",
    "verdict",
]
