"""No secret or token anywhere: capture every log record and every response of a full run
(keys, tokens, generation streamed and not, detection, errors, revocation, metrics) and look
for each key's secret (hex and base64), the KEK and every bearer token. Also at rest: Redis
holds the secrets only sealed and the tokens only as digests."""

from __future__ import annotations

import base64
import logging

import pytest

from service.keys.api_tokens import TOKEN_PATTERN
from tests.service.conftest import ServiceFactory


def encodings(raw: bytes) -> list[str]:
    return [
        raw.hex(),
        raw.hex().upper(),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode(),
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
    ]


def test_no_secret_or_token_in_logs_responses_or_redis(
    services: ServiceFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level
    svc = services()
    seen: list[str] = []

    def call(method: str, path: str, headers: dict[str, str], body: object = None) -> dict:  # type: ignore[type-arg]
        r = svc.client.request(method, path, json=body, headers=headers)
        seen.append(f"{r.status_code} {dict(r.headers)} {r.text}")
        return r.json() if r.headers.get("content-type", "").endswith("json") else {}

    user = svc.token("acme")
    reader = svc.token("acme", ("detect",))
    key_id = call("POST", "/v1/keys", user, {})["key_id"]
    other_key = call("POST", "/v1/keys", svc.admin, {"context_width": 2})["key_id"]
    gen = {"key_id": key_id, "prompt": "Tell me a story.", "max_new_tokens": 12, "nonce": 7}
    text = call("POST", "/v1/generate", user, gen)["text"]
    call("POST", "/v1/generate", user, {**gen, "stream": True})
    call("POST", "/v1/detect", reader, {"key_id": key_id, "text": text, "evidence": True})
    call("POST", "/v1/detect", reader, {"text": text, "spans": True})
    call("POST", "/v1/detect/batch", reader, {"items": [{"text": text}, {"token_ids": [1, 2]}]})
    call("GET", "/v1/keys", user)
    call("GET", f"/v1/keys/{key_id}", user)
    call("GET", f"/v1/keys/{other_key}", user)  # another tenant's: 404
    call("POST", "/v1/generate", reader, gen)  # no scope: 403
    call("GET", "/v1/keys", {"Authorization": user["Authorization"] + "x"})  # 401
    call("POST", "/v1/detect", reader, {"text": "\ud7ff", "alpha": 2})  # 422
    call("POST", f"/v1/keys/{key_id}/revoke", user)
    call("POST", "/v1/generate", user, gen)  # revoked: 409
    call("GET", "/readyz", {})
    call("GET", "/metrics", svc.admin)

    secrets_: list[str] = []
    for kid in (key_id, other_key):
        secrets_ += encodings(svc.store.get(kid).secret.reveal())
    kek = svc.settings.kek_bytes()
    assert kek is not None
    secrets_ += encodings(kek)
    tokens = [h["Authorization"].removeprefix("Bearer ") for h in (user, reader, svc.admin)]
    secrets_ += tokens + [m.group(2) for t in tokens if (m := TOKEN_PATTERN.fullmatch(t))]

    logs = "\n".join(
        f"{r.name} {r.levelname} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records
    )
    assert "poissonmark.access" in logs and "POST /v1/generate 200" in logs  # logs were captured
    assert len(seen) == 17
    everything = logs + "\n".join(seen)
    leaked = [s for s in secrets_ if s in everything]
    assert leaked == []

    raw_redis = svc.resources.redis
    dump = []
    for name in raw_redis.scan_iter(match=f"{svc.settings.redis_prefix}*"):
        if raw_redis.type(name) == b"hash":
            dump.append(str(raw_redis.hgetall(name)))
    at_rest = "\n".join(dump)
    assert key_id in at_rest  # the dump holds the records
    assert [s for s in secrets_ if s in at_rest] == []
