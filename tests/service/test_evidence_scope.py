"""The detector is no oracle (DESIGN §5): raw per-token evidence — pivots r_t, Aaronson terms,
per-family terms, all outputs of the keyed PRF — only for a token with the ``evidence`` scope
and a request with text (never caller-chosen ``token_ids``); everyone else gets coarse bands.
The OpenAI-compatible routes return no per-token evidence at all."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from detector.bands import BAND_BLOCK, NUM_BANDS, evidence_bands
from tests.service.conftest import Service, ServiceFactory

RAW = ("pivot", "score", "terms")


@pytest.fixture(scope="module")
def svc(module_services: ServiceFactory) -> Service:
    return module_services()


@pytest.fixture(scope="module")
def answer(svc: Service) -> dict[str, Any]:
    """A watermarked answer of the tiny model (near-uniform: strong per-token evidence), under a
    fixed key secret so that the answer, and so its bands, are the same every run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("service.keys.store.secrets.token_bytes", lambda n: bytes(range(7, 7 + n)))
        key_id = svc.create_key()
    r = svc.client.post(
        "/v1/generate",
        json={
            "key_id": key_id,
            "prompt": "Tell me a story.",
            "max_new_tokens": 80,
            "method": "basic-uwm",
            "nonce": 7,
        },
        headers=svc.admin,
    )
    assert r.status_code == 200, r.text
    return {"key_id": key_id, **r.json()}


def detect(svc: Service, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    r = svc.client.post(
        "/v1/detect", json={"evidence": True, "scores": ["u"], **body}, headers=headers
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def scored(tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in tokens if t["status"] == "scored"]


def test_a_detect_token_gets_bands_and_no_pivot_score_or_term(
    svc: Service, answer: dict[str, Any]
) -> None:
    reader = svc.token("default", ("detect",))
    body = detect(svc, reader, text=answer["text"], key_id=answer["key_id"])
    tokens = body["results"][0]["tokens"]
    assert len(scored(tokens)) >= 2 * BAND_BLOCK
    for token in tokens:
        assert all(token[name] is None for name in RAW), token
        if token["status"] == "scored":
            assert 0 <= token["band"] < NUM_BANDS
        else:
            assert token["band"] is None
    # the watermark shows in the bands: without it a block reaches band 1 with probability 0.22
    # (detector.bands), a mean band of ~0.25; this fixed answer's blocks average 2.7
    assert np.mean([t["band"] for t in scored(tokens)]) >= 1
    # nothing in the whole response is a per-token pivot
    assert '"pivot": 0' not in json.dumps(body) and '"pivot":0' not in json.dumps(body)


def test_bands_are_constant_over_each_block_of_scored_tokens(
    svc: Service, answer: dict[str, Any]
) -> None:
    """A band is a block's, never one token's: the raw terms a holder of the scope sees give
    exactly the bands a reader sees."""
    reader = svc.token("default", ("detect",))
    holder = svc.token("default", ("detect", "evidence"))
    banded = scored(
        detect(svc, reader, text=answer["text"], key_id=answer["key_id"])["results"][0]["tokens"]
    )
    raw = detect(svc, holder, text=answer["text"], key_id=answer["key_id"])["results"][0]["tokens"]
    bands = [t["band"] for t in banded]
    m = len(bands)
    for start in range(0, m - m % BAND_BLOCK, BAND_BLOCK):
        end = m if start + 2 * BAND_BLOCK > m else start + BAND_BLOCK
        assert len(set(bands[start:end])) == 1, (start, bands[start:end])
    skip = np.array([0 if t["status"] == "scored" else 1 for t in raw], dtype=np.int8)
    terms = np.array([t["score"] for t in scored(raw)], dtype=np.float64)
    assert bands == [b for b in evidence_bands(skip, terms).tolist() if b >= 0]


def test_an_evidence_token_gets_pivots_and_terms_for_text(
    svc: Service, answer: dict[str, Any]
) -> None:
    holder = svc.token("default", ("detect", "evidence"))
    tokens = detect(svc, holder, text=answer["text"], key_id=answer["key_id"])["results"][0][
        "tokens"
    ]
    for token in scored(tokens):
        assert 0.0 < token["pivot"] < 1.0
        assert token["score"] == pytest.approx(-np.log1p(-token["pivot"]), rel=1e-9)
        assert set(token["terms"]) == {"aaronson", "u"} and token["band"] is not None
    # the admin token holds every scope
    admin = detect(svc, svc.admin, text=answer["text"], key_id=answer["key_id"])
    assert all(t["pivot"] is not None for t in scored(admin["results"][0]["tokens"]))


@pytest.mark.parametrize("with_text", [False, True], ids=["ids", "ids_and_text"])
def test_caller_chosen_token_ids_never_get_raw_evidence(
    svc: Service, answer: dict[str, Any], with_text: bool
) -> None:
    holder = svc.token("default", ("detect", "evidence"))
    body: dict[str, Any] = {"token_ids": answer["token_ids"], "key_id": answer["key_id"]}
    if with_text:
        body["text"] = answer["text"]
    tokens = detect(svc, holder, **body)["results"][0]["tokens"]
    assert scored(tokens) and all(t[name] is None for t in tokens for name in RAW)
    assert all(t["band"] is not None for t in scored(tokens))
    batch = svc.client.post(
        "/v1/detect/batch",
        json={
            "items": [{"text": answer["text"]}, {k: v for k, v in body.items() if k != "key_id"}],
            "key_id": answer["key_id"],
            "evidence": True,
        },
        headers=holder,
    )
    assert batch.status_code == 200, batch.text
    by_text, by_ids = (r["results"][0]["tokens"] for r in batch.json()["results"])
    assert all(t["pivot"] is not None for t in scored(by_text))
    assert all(t[name] is None for t in by_ids for name in RAW)


def test_evidence_is_for_the_best_key_only(svc: Service, answer: dict[str, Any]) -> None:
    for _ in range(2):
        svc.create_key()
    body = detect(svc, svc.admin, text=answer["text"], max_results=3)
    assert body["num_keys"] >= 3 and len(body["results"]) == 3
    assert body["results"][0]["key_id"] == body["best_key_id"] == answer["key_id"]
    assert body["results"][0]["tokens"] is not None
    assert [r["tokens"] for r in body["results"][1:]] == [None, None]


def test_openai_routes_return_no_per_token_evidence(svc: Service, answer: dict[str, Any]) -> None:
    reader = svc.token("default", ("generate",))
    for path, extra in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi."}]}),
        ("/v1/completions", {"prompt": "Hi."}),
    ):
        r = svc.client.post(
            path,
            json={"model": "tiny", "max_tokens": 8, "key_id": answer["key_id"], **extra},
            headers=reader,
        )
        assert r.status_code == 200, r.text
        text = r.text
        assert all(f'"{name}"' not in text for name in ("pivot", "terms", "tokens")), text
