"""Keys at scale over HTTP (docs/design.md §5): pages of ``GET /v1/keys``, ``DELETE /v1/keys/{id}``,
and detection without a key id against 2,000 keys of one tenant.

Keys are created through the store (the HTTP path is tested in ``test_api_keys.py``): 2,000
creates take about a second there.
"""

from __future__ import annotations

import logging

import pytest

from tests.service.conftest import Service, ServiceFactory
from tests.service.test_api_keys import GEN, problem


def _make_keys(svc: Service, tenant: str, count: int) -> list[str]:
    fingerprint = svc.resources.fingerprint
    return [svc.store.create(fingerprint, tenant=tenant).key_id for _ in range(count)]


def _list_all(svc: Service, headers: dict[str, str], **params: object) -> list[list[dict]]:  # type: ignore[type-arg]
    pages, cursor = [], None
    while True:
        query = dict(params) | ({"cursor": cursor} if cursor else {})
        r = svc.client.get("/v1/keys", params=query, headers=headers)
        assert r.status_code == 200, r.text
        pages.append(r.json()["keys"])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return pages


def test_keys_come_in_pages_with_revoked_ones_marked(services: ServiceFactory) -> None:
    svc = services()
    h = svc.token("acme", ("keys",))
    made = _make_keys(svc, "acme", 230)
    _make_keys(svc, "other", 3)
    svc.client.post(f"/v1/keys/{made[5]}/revoke", headers=h)
    pages = _list_all(svc, h)
    assert [len(p) for p in pages] == [100, 100, 30]  # default limit 100
    keys = [k for page in pages for k in page]
    assert [k["key_id"] for k in keys] == made  # creation order, each key once
    assert [k["key_id"] for k in keys if k["revoked"]] == [made[5]]
    active = _list_all(svc, h, limit=1000, include_revoked="false")
    assert [k["key_id"] for k in active[0]] == made[:5] + made[6:]
    found = _list_all(svc, h, prefix=made[0][:6], limit=7)
    assert [k["key_id"] for page in found for k in page] == sorted(
        k for k in made if k.startswith(made[0][:6])
    )


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor"),
        ({"cursor": "12-pmk_0123"}, "cursor"),
        ({"prefix": "PMK"}, "prefix"),
    ],
    ids=["limit0", "limit1001", "not_a_cursor", "short_id", "prefix_case"],
)
def test_bad_page_parameters_are_422_naming_the_field(
    embedded_services: ServiceFactory,
    params: dict,
    field: str,  # type: ignore[type-arg]
) -> None:
    svc = embedded_services()
    r = svc.client.get("/v1/keys", params=params, headers=svc.admin)
    assert r.status_code == 422, r.text
    assert field in r.text


def test_a_deleted_key_is_gone_for_listing_generation_and_detection(
    services: ServiceFactory, caplog: pytest.LogCaptureFixture
) -> None:
    svc = services()
    h, other = svc.token("acme"), svc.token("other")
    keep, gone = svc.create_key(h), svc.create_key(h)
    by_id = {"key_id": gone, "text": "some text to test"}
    assert svc.client.post("/v1/detect", json=by_id, headers=h).status_code == 200  # cached
    problem(svc.client.delete(f"/v1/keys/{gone}", headers=other), 404, "unknown-key")
    with caplog.at_level(logging.INFO, logger="poissonmark.audit"):
        r = svc.client.delete(f"/v1/keys/{gone}", headers=h)
    assert r.status_code == 204 and r.content == b""
    (line,) = [rec.getMessage() for rec in caplog.records if rec.name == "poissonmark.audit"]
    assert gone in line and "acme" in line
    problem(svc.client.get(f"/v1/keys/{gone}", headers=h), 404, "unknown-key")
    problem(svc.client.delete(f"/v1/keys/{gone}", headers=h), 404, "unknown-key")
    problem(svc.client.post("/v1/detect", json=by_id, headers=h), 404, "unknown-key")
    r = svc.client.post("/v1/generate", json={"key_id": gone, **GEN}, headers=h)
    problem(r, 404, "unknown-key")
    assert [k["key_id"] for k in svc.client.get("/v1/keys", headers=h).json()["keys"]] == [keep]
    multi = svc.client.post("/v1/detect", json={"text": "some text"}, headers=h).json()
    assert multi["num_keys"] == 1 and multi["best_key_id"] == keep
    scope = svc.client.delete(f"/v1/keys/{keep}", headers=svc.token("acme", ("detect",)))
    problem(scope, 403, "insufficient-scope")


def test_detection_without_a_key_id_at_2000_keys(embedded_services: ServiceFactory) -> None:
    svc = embedded_services()
    h = svc.token("acme")
    keys = _make_keys(svc, "acme", 2000)
    right = keys[1234]
    gen = svc.client.post(
        "/v1/generate",
        json={**GEN, "key_id": right, "max_new_tokens": 80, "prompt": "Tell me a story."},
        headers=h,
    )
    assert gen.status_code == 200, gen.text
    text = gen.json()["text"]
    for _ in range(2):  # the first decrypts 2,000 records, the second finds them cached
        r = svc.client.post("/v1/detect", json={"text": text}, headers=h)
        assert r.status_code == 200, r.text
    found = r.json()
    assert found["num_keys"] == 2000 and found["best_key_id"] == right
    assert found["verdict"] == "watermarked"
    assert len(found["results"]) == 10 and found["results"][0]["key_id"] == right
    # best first by each key's verdict p (whole text and spans, detector.combined)
    logs = [res["log10_p_value"] for res in found["results"]]
    assert logs == sorted(logs)
    # Each key's result equals testing that key alone (the detailed best ten and the best).
    for result in found["results"][:3]:
        alone = svc.client.post(
            "/v1/detect", json={"text": text, "key_id": result["key_id"]}, headers=h
        ).json()
        assert alone["results"][0] == result
    best = found["results"][0]["log10_p_value"]
    assert found["log10_p_value"] == pytest.approx(best + 3.30103, abs=1e-5)  # × 2,000
    whole = found["results"][0]["scores"]["aaronson"]["log10_p_value"]
    assert found["whole_text_log10_p_value"] == pytest.approx(whole + 3.30103, abs=1e-5)
