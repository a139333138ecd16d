"""Keys over HTTP, bearer tokens, scopes, tenant isolation (docs/design.md §5), on both Redis kinds.

Status codes as specified: no or bad token 401, a token without the scope 403, another
tenant's key 404 exactly like an absent one, a revoked key cannot generate (409).
"""

from __future__ import annotations

import pytest

from service.errors import PROBLEM_BASE
from service.keys.api_tokens import TokenStore
from tests.service.conftest import Service, ServiceFactory

GEN = {"prompt": "Hi", "max_new_tokens": 4, "method": "basic-uwm"}


def problem(response, status: int, slug: str) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["type"] == PROBLEM_BASE + slug
    assert body["status"] == status
    return body  # type: ignore[no-any-return]


def test_key_lifecycle(services: ServiceFactory) -> None:
    svc = services()
    h = svc.token("acme", ("keys",))
    key_id = svc.create_key(h, context_width=3, masking=False)
    shown = svc.client.get(f"/v1/keys/{key_id}", headers=h).json()
    assert shown["key_id"] == key_id
    assert (shown["context_width"], shown["masking"], shown["revoked"]) == (3, False, False)
    assert shown["tokenizer"] == svc.resources.fingerprint
    assert "secret" not in shown and "tenant" not in shown
    assert [k["key_id"] for k in svc.client.get("/v1/keys", headers=h).json()["keys"]] == [key_id]

    revoked = svc.client.post(f"/v1/keys/{key_id}/revoke", headers=h)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    again = svc.client.post(f"/v1/keys/{key_id}/revoke", headers=h)  # idempotent
    assert again.status_code == 200 and again.json()["revoked"] is True
    listed = svc.client.get("/v1/keys", params={"include_revoked": "false"}, headers=h).json()
    assert listed["keys"] == []
    # the key is still there (revoked, never deleted), with its secret intact
    assert svc.store.get(key_id).revoked


def test_tenants_never_see_each_others_keys(services: ServiceFactory) -> None:
    svc = services()
    acme, other = svc.token("acme"), svc.token("other")
    key_id = svc.create_key(acme)
    absent = "pmk_0123456789abcdef"
    for path in (f"/v1/keys/{key_id}", f"/v1/keys/{absent}"):
        body = problem(svc.client.get(path, headers=other), 404, "unknown-key")
        # the same answer for a foreign key as for an absent one (no existence oracle)
        assert body["title"] == "Unknown key"
    problem(svc.client.post(f"/v1/keys/{key_id}/revoke", headers=other), 404, "unknown-key")
    assert not svc.store.get(key_id).revoked  # untouched
    assert svc.client.get("/v1/keys", headers=other).json()["keys"] == []
    r = svc.client.post("/v1/generate", json={"key_id": key_id, **GEN}, headers=other)
    problem(r, 404, "unknown-key")
    r = svc.client.post("/v1/detect", json={"key_id": key_id, "text": "hello"}, headers=other)
    problem(r, 404, "unknown-key")
    # without a key id, detection tests only the caller's own keys
    problem(svc.client.post("/v1/detect", json={"text": "hello"}, headers=other), 409, "no-keys")
    r = svc.client.post("/v1/detect", json={"text": "hello"}, headers=acme)
    assert r.status_code == 200 and r.json()["best_key_id"] == key_id


def test_revoked_key_cannot_generate_but_still_detects(services: ServiceFactory) -> None:
    svc = services()
    key_id = svc.create_key()
    ok = svc.client.post("/v1/generate", json={"key_id": key_id, **GEN}, headers=svc.admin)
    assert ok.status_code == 200, ok.text
    svc.client.post(f"/v1/keys/{key_id}/revoke", headers=svc.admin)
    r = svc.client.post("/v1/generate", json={"key_id": key_id, **GEN}, headers=svc.admin)
    problem(r, 409, "key-revoked")
    r = svc.client.post("/v1/detect", json={"key_id": key_id, "text": "x"}, headers=svc.admin)
    assert r.status_code == 200
    # multi-key detection skips revoked keys unless asked
    problem(svc.client.post("/v1/detect", json={"text": "x"}, headers=svc.admin), 409, "no-keys")
    r = svc.client.post(
        "/v1/detect", json={"text": "x", "include_revoked": True}, headers=svc.admin
    )
    assert r.status_code == 200 and r.json()["num_keys"] == 1


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="missing"),
        pytest.param("Bearer", id="empty"),
        pytest.param("Basic dXNlcjpwYXNz", id="basic_scheme"),
        pytest.param("Bearer not-a-token", id="malformed"),
        pytest.param("Bearer pmt_0123456789abcdef_" + "A" * 43, id="unknown"),
    ],
)
def test_missing_or_wrong_token_is_401(
    embedded_services: ServiceFactory, authorization: str | None
) -> None:
    svc = embedded_services()
    headers = {} if authorization is None else {"Authorization": authorization}
    calls = [
        ("GET", "/v1/keys", None),
        ("POST", "/v1/keys", {}),
        ("POST", "/v1/detect", {"text": "x"}),
        ("POST", "/v1/detect/batch", {"items": [{"text": "x"}]}),
        ("POST", "/v1/generate", {"key_id": "pmk_0123456789abcdef", **GEN}),
    ]
    for method, path, body in calls:
        r = svc.client.request(method, path, json=body, headers=headers)
        problem(r, 401, "unauthenticated")
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "pmt_" not in r.text


def test_wrong_secret_of_a_real_token_id_is_401(embedded_services: ServiceFactory) -> None:
    svc = embedded_services()
    good = svc.token()["Authorization"].removeprefix("Bearer ")
    forged = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    r = svc.client.get("/v1/keys", headers={"Authorization": f"Bearer {forged}"})
    problem(r, 401, "unauthenticated")


def test_revoked_token_is_401(embedded_services: ServiceFactory) -> None:
    svc = embedded_services()
    store = TokenStore(svc.resources.redis, svc.resources.token_key, svc.settings.redis_prefix)
    token, record = store.create("acme", ["keys"])
    h = {"Authorization": f"Bearer {token}"}
    assert svc.client.get("/v1/keys", headers=h).status_code == 200
    store.revoke(record.token_id)
    problem(svc.client.get("/v1/keys", headers=h), 401, "unauthenticated")


@pytest.mark.parametrize(
    ("scopes", "method", "path", "body"),
    [
        pytest.param(("detect",), "GET", "/v1/keys", None, id="keys_needs_keys"),
        pytest.param(("generate",), "POST", "/v1/detect", {"text": "x"}, id="detect_needs_detect"),
        pytest.param(
            ("detect", "keys"),
            "POST",
            "/v1/generate",
            {"key_id": "pmk_0123456789abcdef", **GEN},
            id="generate_needs_generate",
        ),
    ],
)
def test_scopes_are_enforced(
    embedded_services: ServiceFactory, scopes: tuple[str, ...], method: str, path: str, body: dict
) -> None:
    svc = embedded_services()
    r = svc.client.request(method, path, json=body, headers=svc.token("acme", scopes))
    problem(r, 403, "insufficient-scope")


def test_admin_token_acts_for_the_admin_tenant(embedded_services: ServiceFactory) -> None:
    svc = embedded_services(admin_tenant="ops")
    key_id = svc.create_key()
    assert svc.store.get(key_id).tenant == "ops"
    problem(svc.client.get(f"/v1/keys/{key_id}", headers=svc.token("default")), 404, "unknown-key")


def test_keys_created_by_the_cli_store_are_visible_to_their_tenant(svc_default: Service) -> None:
    """The CLI's key store (tenant ``default``) and the service share records."""
    record = svc_default.store.create(svc_default.resources.fingerprint)
    r = svc_default.client.get(f"/v1/keys/{record.key_id}", headers=svc_default.admin)
    assert r.status_code == 200 and r.json()["key_id"] == record.key_id


@pytest.fixture
def svc_default(embedded_services: ServiceFactory) -> Service:
    return embedded_services()
