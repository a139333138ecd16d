"""A detection's response: the one ``DetectResponse`` the HTTP routes return and
``poissonmark detect`` prints (docs/design.md §5).

``detect_response`` builds it once from the detector's ``MultiKeyDetection``: the verdict on the
best key's corrected p-value, the plain whole-text and span p-values corrected for the keys,
what the text could have shown (``power``), then the detailed keys' own results (best first),
each with its p-values corrected for the K keys tested and the R readings of the text (the
text as submitted and its canonical reading, ``detector.readings``) where a key's own p would
be selected,
and the tests that read the model (``service.jobs.model_tests``) when they ran. ``detection_json``
is one key's result as plain JSON: the line of a corpus run.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

from detector.bands import NO_BAND, evidence_bands
from detector.evidence import Detection
from detector.multikey import MultiKeyDetection
from service.schemas.detect_result import (
    DetectResponse,
    KeyDetectionOut,
    PowerOut,
    ReadingOut,
)

if TYPE_CHECKING:
    from service.jobs.model_tests import ModelTests

_RAW_FIELDS: Final = ("pivot", "score", "terms")
"""Per-token fields that are outputs of the keyed PRF (only with raw evidence)."""


def evidence_rows(detection: Detection, *, raw: bool) -> list[dict[str, Any]]:
    """One key's per-token evidence (``TokenEvidenceOut``): every token's id, piece, offsets,
    status and coarse ``band`` (``detector.bands``: one per block of scored tokens, null when
    skipped); with ``raw`` also its pivot, Aaronson term and per-family terms, else those are
    null (they are the keyed PRF's outputs: docs/threat-model.md: the detector is no oracle)."""
    columns = detection.evidence
    bands = evidence_bands(columns.skip, columns.terms["aaronson"]).tolist()
    rows = []
    for token, band in zip(detection.tokens, bands, strict=True):
        row = token.to_json()
        row["band"] = None if band == NO_BAND else band
        if not raw:
            for name in _RAW_FIELDS:
                row[name] = None
        rows.append(row)
    return rows


def detection_json(detection: Detection, *, tokens: bool, raw: bool = True) -> dict[str, Any]:
    """One key's result, uncorrected (the fields of ``KeyDetectionOut``): the detector's wire
    shape and the scored tokens a verdict needs; ``tokens`` null unless asked for, raw
    per-token evidence only with ``raw`` (``evidence_rows``)."""
    shaped = detection.to_json(tokens=False) | {"min_scored_tokens": detection.min_scored_tokens}
    shaped["tokens"] = evidence_rows(detection, raw=raw) if tokens else None
    return shaped


def _corrected(log10_p: float, keys: float) -> dict[str, float]:
    """``keys_corrected_(log10_)p_value``: min(1, K·p) with ``keys`` = log10 K (each key's p
    is already R times its reading's)."""
    log10 = min(0.0, log10_p + keys)
    return {"keys_corrected_log10_p_value": log10, "keys_corrected_p_value": 10.0**log10}


def detect_response(
    found: MultiKeyDetection,
    *,
    tokens: bool,
    raw: bool = True,
    model_tests: ModelTests | None = None,
) -> DetectResponse:
    """The whole detection as ``DetectResponse`` (module docstring).

    Args:
        found: the detector's result over the K keys tested
        (``service.jobs.detection.detect_keys``). tokens: per-token evidence in the best key's
        result (``evidence``). raw: that evidence with pivots and terms (the ``evidence`` scope),
        else coarse bands. model_tests: the tests that read the model, one result per detailed key
        in
            ``found.results`` order (``service.jobs.model_tests.run_model_tests``); None: not run.
    Each detailed key's p-values are already R times its reading's (``detector.readings``);
    its spans, its ``edit_tolerant`` test and the tests that read the model also carry their
    p times K (capped at 1): the keys are ranked by the verdict's p, which shares the plain
    labels' pivots, so a key's own p is selected, not valid for "one of these keys". No key
    material.
    """
    # a key's own results carry the readings' correction already (``detector.readings``)
    keys = math.log10(found.num_keys)
    results = []
    for index, (key_id, detection) in enumerate(found.results.items()):
        shaped = detection_json(detection, tokens=tokens and key_id == found.best_key_id, raw=raw)
        if shaped["spans"] is not None:
            for span in shaped["spans"]["spans"]:
                span |= _corrected(span["corrected_log10_p_value"], keys)
        if shaped["edit_tolerant"] is not None:
            shaped["edit_tolerant"] |= _corrected(shaped["edit_tolerant"]["log10_p_value"], keys)
        if model_tests is not None:
            for name, per_key in model_tests.results.items():
                shaped[name] = per_key[index] | _corrected(per_key[index]["log10_p_value"], keys)
        results.append(KeyDetectionOut.model_validate(shaped))
    best: dict[str, float | None] = {}
    for name in ("entropy_weighted", "likelihood_ratio", "edit_filtered"):
        runs = [getattr(r, name) for r in results if getattr(r, name) is not None]
        # K times the smallest p of the detailed keys: a subset of the keys, still valid
        log10 = min((t.keys_corrected_log10_p_value for t in runs), default=None)
        best[f"{name}_log10_p_value"] = log10
        best[f"{name}_p_value"] = None if log10 is None else 10.0**log10
    mu = found.min_detectable_mean_score
    span = found.span_log10_p_value
    reading = found.reading
    return DetectResponse(
        verdict=found.verdict.value,
        alpha=found.alpha,
        best_key_id=found.best_key_id,
        num_keys=found.num_keys,
        reading=None if reading is None else ReadingOut.model_validate(reading.to_json()),
        p_value=found.p_value,
        log10_p_value=found.log10_p_value,
        whole_text_p_value=10.0**found.whole_text_log10_p_value,
        whole_text_log10_p_value=found.whole_text_log10_p_value,
        span_p_value=None if span is None else 10.0**span,
        span_log10_p_value=span,
        power=PowerOut(
            min_detectable_mean_score=mu,
            reference_mean_score=found.reference_mean_score,
            detectable=mu is not None and mu <= found.reference_mean_score,
        ),
        min_scored_tokens=found.min_scored_tokens,
        results=results,
        **best,
    )
