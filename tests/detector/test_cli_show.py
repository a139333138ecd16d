"""``poissonmark detect``'s human-readable output (service/cli/detect_output.py ``show`` and
``show_multi_key``): the verdict's p, the whole-text p, what the text could have shown, the
re-aligned test and the spans corrected for the keys."""

from __future__ import annotations

import re

from detector import DetectOptions, detect
from detector.multikey import detect_multi
from keyed import KeyedSource
from service.cli.common import out
from service.cli.detect_output import show, show_multi_key
from tests.detector.helpers import fixed_secret, fixed_source, keyed_race_ids


def test_short_text_says_too_short_to_tell(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    detection = detect(real_tokenizer, fixed_source("cli-short"), token_ids=list(range(90, 110)))
    assert detection.verdict == "insufficient_evidence"
    with out.capture() as captured:
        show(detection)
    text = " ".join(captured.get().split())  # rich wraps at the console width
    mu = detection.min_detectable_mean_score
    assert mu is not None
    assert "too short to tell" in text and f"score were >= {mu:.2f}" in text


def test_multi_key_output_corrects_spans_for_the_keys(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    secret = fixed_secret("cli-multi")
    ids = keyed_race_ids(secret, num_new=100, seed=8)
    sources = {"pmk_right": KeyedSource(secret), "pmk_other": fixed_source("cli-multi-2")}
    options = DetectOptions(spans=True, realign=True)
    found = detect_multi(real_tokenizer, sources, token_ids=ids, options=options)
    with out.capture() as captured:
        show_multi_key(found, "default")
    text = " ".join(captured.get().split())  # rich wraps at the console width
    assert "whole text, corrected for the keys" in text and "best span of any key" in text
    best = found.best
    assert best.realigned is not None  # the best key's own re-aligned p is selected: K x p
    realigned = re.search(r"edit-tolerant \(re-aligned\) test: log10 p (-?\d+\.\d\d)", text)
    assert realigned is not None and "positions, corrected for 2 keys" in text
    expected_realigned = min(0.0, best.realigned.log10_p_value + 0.30103)
    assert abs(float(realigned.group(1)) - expected_realigned) <= 0.006
    assert best.spans is not None
    span = best.spans.spans[0]
    shown = re.search(r"windows and 2 keys (-?\d+\.\d\d)", text)
    assert shown is not None
    expected = min(0.0, span.corrected_log10_p_value + 0.30103)
    assert abs(float(shown.group(1)) - expected) <= 0.006
