"""Watermarked answers that legitimately hold what the canonical reading rewrites — code with
runs of spaces, a Russian answer — are still found (the raw reading is always tested)."""

from __future__ import annotations

import hashlib

import pytest

from detector import detect
from detector.canonical import canonical_reading
from detector.evidence import Verdict
from keyed import KeyedSource, Secret
from sampler.completion import complete, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.models import LoadedModel

pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(900)]

KEY = KeyedSource(Secret(hashlib.sha256(b"readings-e2e").digest()), 4, True, nonce=11)


def _answer(model: LoadedModel, question: str, tokens: int = 128) -> str:
    ids = prompt_ids(model, messages=[{"role": "user", "content": question}])
    done = complete(model, ids, SamplerConfig("basic-uwm", max_new_tokens=tokens), KEY)
    return done.text


@pytest.mark.parametrize(
    ("question", "holds"),
    [
        (
            "Write a Python class with two methods that each contain an if statement.",
            lambda text: "    " in text,  # indentation: runs of spaces
        ),
        (
            "Ответь по-русски: почему небо голубое?",
            lambda text: any("\u0400" <= c <= "\u04ff" for c in text),  # Cyrillic letters
        ),
    ],
)
def test_legitimate_characters_are_still_found(
    real_model: LoadedModel, real_tokenizer, question, holds
) -> None:  # type: ignore[no-untyped-def]
    text = _answer(real_model, question)
    assert holds(text), text[:200]
    found = detect(real_tokenizer, KEY, text=text)
    assert found.verdict == Verdict.WATERMARKED, (found.verdict_log10_p_value, text[:200])
    assert found.reading is not None
    tried = 1 if canonical_reading(text).text == text else 2
    assert found.reading.readings_tried == tried
