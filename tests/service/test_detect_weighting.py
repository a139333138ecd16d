"""``POST /v1/detect`` with ``entropy_weighting``: the weighted test beside the plain one,
computed with the served model, and 4xx naming the field for bad input."""

from __future__ import annotations

import math

import pytest

from detector import DetectOptions, detect
from detector.weighted import entropy_weighted_test
from sampler.entropy import processed_entropy
from sampler.models import LoadedModel
from sampler.processing import Processing
from tests.service.conftest import Service, ServiceFactory
from tests.service.test_api_keys import problem

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."


@pytest.fixture(scope="module")
def svc(module_services: ServiceFactory) -> Service:
    return module_services(max_token_ids=2_000)


def test_the_weighted_test_is_reported_beside_the_verdict(
    svc: Service, tiny_loaded: LoadedModel
) -> None:
    key_id = svc.create_key()
    processing = {"temperature": 0.7, "top_k": 0, "top_p": 0.95}
    body = {"key_id": key_id, "text": TEXT, "entropy_weighting": True, "processing": processing}
    r = svc.client.post("/v1/detect", json=body, headers=svc.admin)
    assert r.status_code == 200, r.text
    found = r.json()
    plain = svc.client.post("/v1/detect", json={"key_id": key_id, "text": TEXT}, headers=svc.admin)
    assert plain.json()["entropy_weighted_p_value"] is None
    assert plain.json()["results"][0]["entropy_weighted"] is None
    # the verdict is the plain one's
    assert found["verdict"] == plain.json()["verdict"]
    assert found["log10_p_value"] == plain.json()["log10_p_value"]
    # the weighted test equals the detector's on the served model's entropies
    result = found["results"][0]
    weighted = result["entropy_weighted"]
    ids = [t["id"] for t in svc.client.post(
        "/v1/detect", json={"key_id": key_id, "text": TEXT, "evidence": True}, headers=svc.admin
    ).json()["results"][0]["tokens"]]  # fmt: skip
    bos = tiny_loaded.tokenizer.bos_token_id
    entropy = processed_entropy(
        tiny_loaded.model, ids, Processing(0.7, 0, 0.95), prefix=[bos]
    ).numpy()
    source = svc.store.get(key_id, None).source(0)
    direct = detect(tiny_loaded.tokenizer, source, token_ids=ids, options=DetectOptions())
    expected = entropy_weighted_test(
        direct.evidence.skip, direct.evidence.terms["aaronson"], entropy
    )
    assert weighted["name"] == "entropy_weighted"
    assert weighted["num_scored"] == result["num_scored"]
    assert weighted["method"] in ("exact", "chernoff_bound")
    assert weighted["log10_p_value"] == pytest.approx(expected.log_p / math.log(10), abs=1e-12)
    assert weighted["keys_corrected_log10_p_value"] == pytest.approx(weighted["log10_p_value"])
    assert found["entropy_weighted_log10_p_value"] == pytest.approx(weighted["log10_p_value"])


def test_multi_key_and_batch(svc: Service) -> None:
    svc.create_key()
    svc.create_key()
    body = {"text": TEXT, "entropy_weighting": True}
    found = svc.client.post("/v1/detect", json=body, headers=svc.admin).json()
    keys = found["num_keys"]
    assert keys >= 2
    smallest = min(r["entropy_weighted"]["log10_p_value"] for r in found["results"])
    assert found["entropy_weighted_log10_p_value"] == pytest.approx(
        min(0.0, smallest + math.log10(keys))
    )
    batch = {"items": [{"text": TEXT}, {"text": "short"}], "entropy_weighting": True}
    r = svc.client.post("/v1/detect/batch", json=batch, headers=svc.admin)
    assert r.status_code == 200, r.text
    assert all(item["entropy_weighted_p_value"] is not None for item in r.json()["results"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(
            {"entropy_weighting": True, "processing": {"top_p": 0.0}},
            "body.processing.top_p",
            id="top_p",
        ),
        pytest.param(
            {"entropy_weighting": True, "processing": {"temperature": 0.0}},
            "body.processing.temperature",
            id="temperature",
        ),
        pytest.param({"entropy_weighting": "yes"}, "body.entropy_weighting", id="not_bool"),
    ],
)
def test_bad_input_is_422_naming_the_field(svc: Service, body: dict, field: str) -> None:  # type: ignore[type-arg]
    found = problem(
        svc.client.post("/v1/detect", json={"text": TEXT, **body}, headers=svc.admin),
        422,
        "invalid-request",
    )
    assert found["field"] == field


def test_a_text_longer_than_the_model_is_422(svc: Service) -> None:
    key_id = svc.create_key()
    body = {"key_id": key_id, "token_ids": [100] * 1_500, "entropy_weighting": True}
    found = problem(
        svc.client.post("/v1/detect", json=body, headers=svc.admin), 422, "invalid-request"
    )
    assert found["field"] == "entropy_weighting"


def test_processing_without_weighting_is_ignored(svc: Service) -> None:
    """A schema-valid body is never refused: ``processing`` alone changes nothing."""
    key_id = svc.create_key()
    plain = svc.client.post("/v1/detect", json={"key_id": key_id, "text": TEXT}, headers=svc.admin)
    body = {"key_id": key_id, "text": TEXT, "processing": {"temperature": 0.7}}
    with_processing = svc.client.post("/v1/detect", json=body, headers=svc.admin)
    assert with_processing.status_code == plain.status_code == 200
    assert with_processing.json() == plain.json()
    assert with_processing.json()["entropy_weighted_p_value"] is None
