"""``POST /v1/detect``'s power-aware verdict with the caller's ``reference_mean_score``."""

from __future__ import annotations

import hashlib

from detector.combined import needed_tokens
from keyed.prf import Secret
from service.keys.record import KeyRecord, new_key_id
from tests.service.conftest import Service, ServiceFactory
from tests.service.test_api_keys import problem

SHORT = "A short note, twelve words or so, that no key has seen."


def fixed_key(svc: Service, label: bytes) -> str:
    """A key of the admin's tenant whose secret is ``sha256(label)``, written through the store
    (as tests/service/test_keystore_pages.py does): the verdicts on a fixed text under it are
    the same on every run. Under a new random key a human text is flagged one run in a hundred
    at alpha = 0.01 (the false-positive rate, tests/detector's), which is not what these tests
    are about."""
    record = KeyRecord(
        key_id=new_key_id(),
        secret=Secret(hashlib.sha256(label).digest()),
        tokenizer=svc.resources.fingerprint,
        tenant=svc.settings.admin_tenant,
    )
    assert svc.store._insert(record)
    return record.key_id


def test_the_reference_strength_sets_what_too_short_means(
    module_services: ServiceFactory,
) -> None:
    svc = module_services()
    key_id = fixed_key(svc, b"test_detect_power")
    plain = svc.client.post("/v1/detect", json={"key_id": key_id, "text": SHORT}, headers=svc.admin)
    assert plain.status_code == 200, plain.text
    default = plain.json()
    assert default["verdict"] == "insufficient_evidence"  # ~12 scored tokens < 28 at 1.5
    assert default["min_scored_tokens"] == needed_tokens(0.01)
    strong = {"key_id": key_id, "text": SHORT, "reference_mean_score": 8.0}
    found = svc.client.post("/v1/detect", json=strong, headers=svc.admin).json()
    # a watermark of mean 8 per token would show within a few tokens: this one did not
    assert found["min_scored_tokens"] == needed_tokens(0.01, 8.0) < default["min_scored_tokens"]
    assert found["verdict"] == "not_detected"
    assert found["power"]["reference_mean_score"] == 8.0
    assert found["log10_p_value"] == default["log10_p_value"]  # the test itself is unchanged
    for bad in (1.0, 1.0000000000000002, 1.19, 101.0, "high"):  # 1 + 2e-16: the fuzzers' 500
        body = {"key_id": key_id, "text": SHORT, "reference_mean_score": bad}
        r = svc.client.post("/v1/detect", json=body, headers=svc.admin)
        assert problem(r, 422, "invalid-request")["field"] == "body.reference_mean_score"


def test_a_text_of_invisible_characters_is_insufficient_evidence(
    module_services: ServiceFactory,
) -> None:
    """Nothing but zero-width and format characters: a verdict, not an error, and the reading
    says what was removed; with a readable text around them the tokens index the text sent."""
    svc = module_services()
    key_id = fixed_key(svc, b"test_detect_power")
    hidden = "\u200b\u200c\u200d\u2060\ufeff" * 40
    found = svc.client.post(
        "/v1/detect", json={"key_id": key_id, "text": hidden}, headers=svc.admin
    )
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["verdict"] == "insufficient_evidence"
    assert body["reading"]["changes"]["invisible"] == 200
    assert body["reading"]["changes"]["summary"] == ["200 invisible characters removed"]
    text = SHORT.replace(" ", "\u00a0\u200b")
    shown = svc.client.post(
        "/v1/detect", json={"key_id": key_id, "text": text, "evidence": True}, headers=svc.admin
    ).json()
    assert shown["reading"]["readings_tried"] == 2
    tokens = shown["results"][0]["tokens"]
    assert "".join(t["text"] for t in tokens) == text
    assert tokens[0]["start"] == 0 and tokens[-1]["end"] == len(text)
    by_ids = svc.client.post(
        "/v1/detect", json={"key_id": key_id, "token_ids": [504, 3003]}, headers=svc.admin
    ).json()
    assert by_ids["reading"] is None
