"""No single request can exhaust the service (DESIGN §5): a text is bounded in tokens after
tokenizing, evidence rows per response are capped, a tenant's keys are counted before any
record is read and capped at creation, and the rate limit charges tokens × keys."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.http.deps import get_limiter
from service.ratelimit import RateLimiter
from tests.service.conftest import Service, ServiceFactory


def problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = dict(r.json())
    assert body["type"] == f"urn:poissonmark:problem:{slug}"
    return body


def post_raw(svc: Service, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """POST ``body`` as UTF-8 JSON (no \\u escapes: 4 bytes per emoji, not 12)."""
    return svc.client.post(
        path,
        content=json.dumps(body, ensure_ascii=False).encode(),
        headers={**headers, "content-type": "application/json"},
    )


def frozen_limiter(svc: Service, limit: int) -> RateLimiter:
    """The app's Redis with ``limit`` units per window on a frozen clock (no roll-over)."""
    limiter = RateLimiter(
        svc.resources.aredis, svc.settings.redis_prefix, limit, 60, clock=lambda: 1_000_010.0
    )
    svc.app.dependency_overrides[get_limiter] = lambda: limiter
    return limiter


def test_a_text_of_99999_emoji_is_refused_naming_the_token_limit(
    embedded_services: ServiceFactory,
) -> None:
    """99,999 emoji are under the character and body limits (400 KB) but 299,997 tokens (each
    refusal is charged its tokenizing: a budget for three)."""
    svc = embedded_services(detect_rate_limit=1000)
    key_id = svc.create_key()
    text = "\U0001f600" * 99_999
    assert len(text) <= svc.settings.max_text_chars
    assert (
        len(json.dumps({"text": text}, ensure_ascii=False).encode()) < svc.settings.max_body_bytes
    )
    for body in ({"text": text, "key_id": key_id, "evidence": True}, {"text": text}):
        r = post_raw(svc, "/v1/detect", body, svc.admin)
        found = problem(r, 422, "limit-exceeded")
        assert (found["field"], found["limit"]) == ("text", svc.settings.max_tokens)
        assert "tokens after tokenizing" in found["detail"]
    batch = post_raw(svc, "/v1/detect/batch", {"items": [{"text": "a"}, {"text": text}]}, svc.admin)
    assert problem(batch, 422, "limit-exceeded")["field"] == "items[1].text"


def test_a_refused_text_is_charged_its_tokenizing(embedded_services: ServiceFactory) -> None:
    """Tokenizing 99,999 emoji (299,997 tokens) is work the request made the service do: it
    is charged as planned (299,997 × (1 + 8) / 10,000: 270 units) before the 422, so a client
    cannot make the service tokenize such texts at one unit each."""
    svc = embedded_services()
    frozen_limiter(svc, 275)
    try:
        key_id = svc.create_key()
        reader = svc.token("default", ("detect",))
        body = {"text": "\U0001f600" * 99_999, "key_id": key_id}
        problem(post_raw(svc, "/v1/detect", body, reader), 422, "limit-exceeded")
        short = {"text": "x", "key_id": key_id}
        statuses = [
            svc.client.post("/v1/detect", json=short, headers=reader).status_code for _ in range(6)
        ]
        assert statuses == [200] * 5 + [429]
    finally:
        svc.app.dependency_overrides.clear()


def test_max_tokens_counts_tokens_not_characters(embedded_services: ServiceFactory) -> None:
    svc = embedded_services(max_tokens=50)
    key_id = svc.create_key()
    ok = svc.client.post(
        "/v1/detect", json={"text": "a b " * 12, "key_id": key_id}, headers=svc.admin
    )
    assert ok.status_code == 200 and ok.json()["results"][0]["num_tokens"] <= 50
    # 30 characters, 4 bytes and several tokens each
    r = post_raw(svc, "/v1/detect", {"text": "\U0001f600" * 30, "key_id": key_id}, svc.admin)
    found = problem(r, 422, "limit-exceeded")
    assert (found["field"], found["limit"]) == ("text", 50)
    ids = svc.client.post(
        "/v1/detect", json={"token_ids": list(range(100, 151)), "key_id": key_id}, headers=svc.admin
    )
    assert problem(ids, 422, "limit-exceeded")["field"] == "token_ids"


def test_evidence_rows_per_response_are_capped(embedded_services: ServiceFactory) -> None:
    svc = embedded_services(max_evidence_tokens=40)
    key_id = svc.create_key()
    items = [{"text": "one two three four five six seven eight nine ten " * 2}] * 3
    fine = svc.client.post(
        "/v1/detect/batch", json={"items": items, "key_id": key_id}, headers=svc.admin
    )
    assert fine.status_code == 200, fine.text  # no evidence asked: no rows
    r = svc.client.post(
        "/v1/detect/batch",
        json={"items": items, "key_id": key_id, "evidence": True},
        headers=svc.admin,
    )
    found = problem(r, 422, "limit-exceeded")
    assert (found["field"], found["limit"]) == ("evidence", 40)


def test_key_creation_over_the_quota_is_refused_naming_it(
    embedded_services: ServiceFactory,
) -> None:
    svc = embedded_services(max_keys_per_tenant=2)
    acme = svc.token("acme", ("keys",))
    first = svc.create_key(acme)
    svc.create_key(acme)
    svc.client.post(f"/v1/keys/{first}/revoke", headers=acme)  # revoked keys still count
    r = svc.client.post("/v1/keys", json={}, headers=acme)
    found = problem(r, 403, "quota-exceeded")
    assert (found["field"], found["limit"]) == ("max_keys_per_tenant", 2)
    assert "key quota" in found["detail"] and "2 keys" in found["detail"]
    svc.create_key(svc.token("other", ("keys",)))  # the quota is per tenant
    assert svc.client.delete(f"/v1/keys/{first}", headers=acme).status_code in (200, 204)
    svc.create_key(acme)  # a deleted key frees its place


def allowed(units: int, budget: int) -> list[int]:
    """The statuses of requests costing ``units`` each until one is refused."""
    return [200] * (budget // units) + [429]


def test_the_rate_limit_charges_tokens_times_keys(embedded_services: ServiceFactory) -> None:
    """20 units a window, 1,000 token·keys a unit. A text of T tokens against one key costs
    ceil(T·(1 + 8)/1000) units (its pivots and its full result: DETAILED_KEY_WEIGHT), against
    two keys ceil(T·(2 + 2·8)/1000); one unit per text would let every request pass."""
    svc = embedded_services(detect_work_unit=1000)
    frozen_limiter(svc, 20)
    try:
        key_id = svc.create_key()
        text = "one two three four five six seven eight nine ten " * 25
        tokens = svc.client.post(
            "/v1/detect", json={"text": text, "key_id": key_id}, headers=svc.admin
        ).json()["results"][0]["num_tokens"]
        assert 223 <= tokens <= 333  # 3 units with one key, 5 or 6 with two
        one, two = -(-tokens * 9 // 1000), -(-tokens * 18 // 1000)
        assert (one, two) in ((3, 5), (3, 6))
        reader = svc.token("default", ("detect",))
        statuses = []
        while not statuses or statuses[-1] == 200:
            body = {"text": text, "key_id": key_id}
            statuses.append(svc.client.post("/v1/detect", json=body, headers=reader).status_code)
        assert statuses == allowed(one, 20)
        # another token's budget: both keys of the tenant tested
        svc.create_key()
        other = svc.token("default", ("detect",))
        statuses = []
        while not statuses or statuses[-1] == 200:
            statuses.append(
                svc.client.post("/v1/detect", json={"text": text}, headers=other).status_code
            )
        assert statuses == allowed(two, 20)
        # fewer detailed keys cost less: max_results 1 is T·(2 + 8)
        third = svc.token("default", ("detect",))
        statuses = []
        while not statuses or statuses[-1] == 200:
            body = {"text": text, "max_results": 1}
            statuses.append(svc.client.post("/v1/detect", json=body, headers=third).status_code)
        assert statuses == allowed(-(-tokens * 10 // 1000), 20)
        # a request costing more than a whole window is refused outright, naming the limit
        fourth = svc.token("default", ("detect",))
        batch = {"items": [{"text": text}] * 5}  # 25 or 30 units
        found = problem(
            svc.client.post("/v1/detect/batch", json=batch, headers=fourth), 422, "limit-exceeded"
        )
        assert (found["field"], found["limit"]) == ("items", 20)
        assert "work units per request" in found["detail"]
    finally:
        svc.app.dependency_overrides.clear()


@pytest.mark.parametrize("batch", [False, True], ids=["detect", "batch"])
def test_a_short_text_still_costs_one_unit(embedded_services: ServiceFactory, batch: bool) -> None:
    svc = embedded_services()
    frozen_limiter(svc, 2)
    try:
        svc.create_key()
        reader = svc.token("default", ("detect",))
        path, body = (
            ("/v1/detect/batch", {"items": [{"text": "x"}]})
            if batch
            else ("/v1/detect", {"text": "x"})
        )
        assert [svc.client.post(path, json=body, headers=reader).status_code for _ in range(3)] == [
            200,
            200,
            429,
        ]
    finally:
        svc.app.dependency_overrides.clear()
