"""Every 4xx for a bad request names the field, and a full queue is the
callers' load, logged as a warning rather than an error."""

from __future__ import annotations

import logging

import pytest

from service.errors import QueueFull
from service.http.deps import get_worker
from tests.service.conftest import Service, ServiceFactory
from tests.service.test_api_keys import problem

KEY = "pmk_0123456789abcdef"


@pytest.fixture(scope="module")
def svc(module_services: ServiceFactory) -> Service:
    return module_services()


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        pytest.param(b'{"text": "x"', "not valid JSON", id="truncated"),
        pytest.param(b'{"text": "\xff\xfe"}', "UTF-8", id="not_utf8"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, "", id="nested_too_deep"),
    ],
)
def test_a_body_that_is_not_json_is_malformed_request(
    svc: Service, raw: bytes, detail: str
) -> None:
    headers = {**svc.admin, "Content-Type": "application/json"}
    for path in ("/v1/detect", "/v1/generate", "/v1/keys"):
        found = problem(
            svc.client.post(path, content=raw, headers=headers), 400, "malformed-request"
        )
        assert found["field"] == "body" and detail in found["detail"], found


@pytest.mark.parametrize(
    ("path", "body", "field", "limit"),
    [
        pytest.param(
            "/v1/generate",
            {"key_id": KEY, "messages": [{"role": "user", "content": "x"}] * 65},
            "messages",
            64,  # max_messages, not the chat prompt's own bound (256)
            id="messages_over_the_limit",
        ),
        pytest.param(
            "/v1/generate",
            {"key_id": KEY, "messages": []},
            "body.messages",
            1,
            id="no_messages",
        ),
        pytest.param(
            "/v1/generate",
            {"key_id": KEY, "prompt": "x", "drafter": "self:30"},
            "drafter",  # the tiny model has 2 layers
            None,
            id="drafter_too_deep",
        ),
        pytest.param(
            "/v1/detect", {"text": "x", "scores": ["nope"]}, "body.scores.0", None, id="score"
        ),
        pytest.param("/v1/detect", {"token_ids": [49152]}, "token_ids[0]", None, id="past_vocab"),
    ],
)
def test_invalid_fields_are_named(
    svc: Service, path: str, body: dict, field: str, limit: int | None
) -> None:
    r = svc.client.post(path, json=body, headers=svc.admin)
    assert r.status_code == 422, r.text
    found = r.json()
    assert found["field"] == field, found
    assert found.get("limit") == limit, found
    if limit is not None:
        assert str(limit) in found["detail"] and "256" not in found["detail"], found


class FullWorker:
    def submit(self, *args: object, **kwargs: object) -> None:
        raise QueueFull(8, 2)


def test_a_full_queue_is_logged_as_a_warning(
    embedded_services: ServiceFactory, caplog: pytest.LogCaptureFixture
) -> None:
    svc = embedded_services()
    key = svc.create_key()
    svc.app.dependency_overrides[get_worker] = FullWorker
    try:
        with caplog.at_level(logging.INFO, logger="poissonmark"):
            r = svc.client.post(
                "/v1/generate",
                json={"key_id": key, "prompt": "Hi", "max_new_tokens": 4},
                headers=svc.admin,
            )
        problem(r, 503, "queue-full")
        mine = [rec for rec in caplog.records if "queue-full" in rec.getMessage()]
        assert [rec.levelno for rec in mine] == [logging.WARNING]
    finally:
        svc.app.dependency_overrides.clear()
