"""Errors and limits over HTTP: RFC 9457 problem+json with a stable type, 4xx naming the field
and the limit, 413 for oversized bodies, 503 + Retry-After for a full queue, 429 + Retry-After
for the detection rate limit; never a 500 for any input (the fuzz test covers the rest)."""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from sampler.decoder import SamplerConfig
from sampler.drafters import Drafter
from service.errors import PROBLEM_BASE, PROBLEMS, problem_for
from service.http.deps import get_limiter, get_worker
from service.jobs.detection_pool import DetectionPool
from service.jobs.worker import GenerationWorker, Job
from service.ratelimit import RateLimiter
from tests.service.conftest import Service, ServiceFactory
from tests.service.test_api_keys import GEN, problem

LIMITS = {
    "max_new_tokens": 16,
    "max_drafts": 4,
    "max_lookahead": 4,
    "max_prompt_chars": 50,
    "max_prompt_tokens": 40,
    "max_messages": 2,
    "max_text_chars": 100,
    "max_token_ids": 10,
    "max_batch": 2,
    "max_body_bytes": 4096,
}


@pytest.fixture(scope="module")
def svc(module_services: ServiceFactory) -> Service:
    """One app with small limits for the module (its tests add keys but change no limits)."""
    return module_services(**LIMITS)


@pytest.mark.parametrize(
    ("path", "body", "field", "limit"),
    [
        pytest.param("/v1/generate", {"max_new_tokens": 17}, "max_new_tokens", 16, id="max_new"),
        pytest.param("/v1/generate", {"drafts": 5}, "drafts", 4, id="drafts"),
        pytest.param("/v1/generate", {"lookahead": 5}, "lookahead", 4, id="lookahead"),
        pytest.param("/v1/generate", {"prompt": "p" * 51}, "prompt", 50, id="prompt_chars"),
        pytest.param(
            "/v1/generate",
            {"prompt": None, "messages": [{"role": "user", "content": "x"}] * 3},
            "messages",
            2,
            id="messages",
        ),
        pytest.param(
            "/v1/generate",
            {"prompt": " ".join(["hi"] * 12)},  # 35 chars, 12 tokens + the chat template > 40
            "prompt",
            40,
            id="prompt_tokens",
        ),
        pytest.param(
            "/v1/generate",
            {"prompt": None, "messages": [{"role": "user", "content": " ".join(["hi"] * 12)}]},
            "messages",
            40,
            id="messages_tokens",
        ),
        pytest.param("/v1/detect", {"text": "t" * 101}, "text", 100, id="text_chars"),
        pytest.param("/v1/detect", {"token_ids": [1] * 11}, "token_ids", 10, id="token_ids"),
        pytest.param(
            "/v1/detect/batch", {"items": [{"text": "a"}] * 3}, "items", 2, id="batch_size"
        ),
        pytest.param(
            "/v1/detect/batch",
            {"items": [{"text": "a"}, {"text": "t" * 101}]},
            "items[1].text",
            100,
            id="batch_item_text",
        ),
    ],
)
def test_over_a_limit_is_422_naming_field_and_limit(
    svc: Service, path: str, body: dict, field: str, limit: int
) -> None:
    key_id = svc.create_key()
    payload = {"key_id": key_id, **GEN, **body} if path == "/v1/generate" else body
    payload = {k: v for k, v in payload.items() if v is not None}
    found = problem(svc.client.post(path, json=payload, headers=svc.admin), 422, "limit-exceeded")
    assert (found["field"], found["limit"]) == (field, limit)
    assert field in found["detail"] and str(limit) in found["detail"]


@pytest.mark.parametrize(
    ("body", "field", "limit"),
    [
        pytest.param({"drafts": 65}, "body.drafts", 64, id="hard_drafts"),
        pytest.param({"lookahead": 0}, "body.lookahead", 1, id="hard_lookahead"),
        pytest.param({"temperature": 101}, "body.temperature", 100.0, id="temperature"),
        pytest.param({"top_p": 0}, "body.top_p", 0.0, id="top_p"),
        pytest.param({"nonce": -1}, "body.nonce", 0, id="nonce"),
    ],
)
def test_schema_limits_name_field_and_limit(
    svc: Service, body: dict, field: str, limit: float
) -> None:
    payload = {"key_id": "pmk_0123456789abcdef", **GEN, **body}
    r = svc.client.post("/v1/generate", json=payload, headers=svc.admin)
    found = problem(r, 422, "invalid-request")
    assert found["field"] == field and found["limit"] == limit


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        pytest.param("/v1/detect", {"text": "\ud800"}, "body.text", id="lone_surrogate"),
        pytest.param("/v1/detect", {}, "body", id="no_text"),
        pytest.param("/v1/detect", {"text": "x", "alpha": 0}, "body.alpha", id="alpha"),
        pytest.param("/v1/detect", {"text": "x", "extra": 1}, "body.extra", id="unknown_field"),
        pytest.param("/v1/detect", {"text": "x", "key_id": "secret"}, "body.key_id", id="key_id"),
        pytest.param("/v1/detect", {"token_ids": [-1]}, "body.token_ids.0", id="negative_id"),
        pytest.param(
            "/v1/detect", {"text": "x", "scores": ["nope"]}, "body.scores.0", id="unknown_score"
        ),
        pytest.param(
            "/v1/detect", {"text": "x", "scores": ["u", "u"]}, "body.scores", id="score_twice"
        ),
        # in the schema's range but outside the served tokenizer's vocabulary (49,152 ids)
        pytest.param("/v1/detect", {"token_ids": [1, 49152]}, "token_ids[1]", id="id_past_vocab"),
        pytest.param(
            "/v1/detect/batch",
            {"items": [{"text": "x"}, {"token_ids": [2**31 - 1]}]},
            "items[1].token_ids[0]",
            id="batch_id_past_vocab",
        ),
        pytest.param(
            "/v1/generate",
            {"key_id": "pmk_0123456789abcdef", "messages": []},
            "body.messages",
            id="no_messages",
        ),
        pytest.param("/v1/generate", {"key_id": "pmk_0123456789abcdef"}, "body", id="no_prompt"),
        pytest.param(
            "/v1/generate",
            {"key_id": "pmk_0123456789abcdef", "prompt": "x", "drafter": "model:/etc"},
            "body.drafter",
            id="drafter_path",
        ),
        pytest.param(
            "/v1/generate",
            {"key_id": "pmk_0123456789abcdef", "prompt": "x", "temperature": 1e-300},
            "body.temperature",
            id="tiny_temperature",
        ),
        pytest.param("/v1/keys", {"context_width": 65}, "body.context_width", id="width"),
        pytest.param("/v1/keys", [], "body", id="not_an_object"),
    ],
)
def test_invalid_input_is_422(svc: Service, path: str, body: object, field: str | None) -> None:
    svc.create_key()
    # json.dumps escapes the lone surrogate as \ud800, which is valid JSON text
    raw = json.dumps(body).encode()
    headers = {**svc.admin, "Content-Type": "application/json"}
    found = problem(svc.client.post(path, content=raw, headers=headers), 422, "invalid-request")
    if field is not None:
        assert found["field"] == field
    assert "secret" not in found.get("detail", "")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/generate", {"key_id": "pmk_0123456789abcdef", "prompt": "x"}),
        ("/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "x"}]}),
    ],
)
def test_an_unknown_drafter_is_named_in_words_not_a_pattern(
    svc: Service, path: str, body: dict
) -> None:
    r = svc.client.post(path, json={**body, "drafter": "bogus-drafter"}, headers=svc.admin)
    assert r.status_code in (400, 422), r.text
    assert "expected eagle, ngram, heads or self:N" in r.text, r.text
    assert "bogus-drafter" not in r.text and "pattern" not in r.text and "Value error" not in r.text


def test_the_input_is_never_echoed(svc: Service) -> None:
    pasted = "pmk_" + "zz" * 20  # a malformed id that could be anything the client pasted
    for path, body in [
        ("/v1/detect", {"text": "x", "key_id": pasted}),
        ("/v1/generate", {"key_id": pasted, "prompt": "x"}),
        ("/v1/detect", {"text": 123, "alpha": pasted}),
    ]:
        r = svc.client.post(path, json=body, headers=svc.admin)
        assert r.status_code == 422 and pasted not in r.text
    r = svc.client.get(f"/v1/keys/{pasted}", headers=svc.admin)
    assert r.status_code == 422 and pasted not in r.text


def test_text_and_token_ids_that_disagree_are_422_naming_both(
    embedded_services: ServiceFactory,
) -> None:
    """The ids of a watermarked answer beside another text: refused (a verdict would be about
    the ids and read as one about the text), in a batch naming the item; the answer's own text
    beside its ids agrees and is detected."""
    svc = embedded_services()  # the module's limits are too small for a 30-token answer
    key = svc.create_key()
    answer = svc.client.post(
        "/v1/generate", json={"key_id": key, **GEN, "max_new_tokens": 30}, headers=svc.admin
    ).json()
    unrelated = "The quick brown fox jumps over the lazy dog."
    body = {"key_id": key, "text": unrelated, "token_ids": answer["token_ids"]}
    r = svc.client.post("/v1/detect", json=body, headers=svc.admin)
    found = problem(r, 422, "invalid-request")
    assert found["field"] == "token_ids"
    assert "text and token_ids disagree" in found["detail"]
    assert "at character 0" in found["detail"]  # where they part: the first character here
    assert unrelated not in found["detail"]  # the input is never echoed
    items = [
        {"text": answer["text"]},
        {"text": answer["text"] + " ", "token_ids": answer["token_ids"]},
    ]
    batch = {"key_id": key, "items": items}
    r = svc.client.post("/v1/detect/batch", json=batch, headers=svc.admin)
    found = problem(r, 422, "invalid-request")
    assert found["field"] == "items[1].token_ids"
    assert f"at character {len(answer['text'])}" in found["detail"]  # one is the other's prefix
    agreeing = {"key_id": key, "text": answer["text"], "token_ids": answer["token_ids"]}
    r = svc.client.post("/v1/detect", json=agreeing, headers=svc.admin)
    assert r.status_code == 200, r.text
    assert r.json()["verdict"] == "watermarked"


@pytest.mark.parametrize(
    ("content_type", "named"),
    [
        pytest.param("text/plain", "text/plain", id="text_plain"),
        pytest.param("text/plain; charset=utf-8", "text/plain", id="with_parameters"),
        pytest.param(
            "application/x-www-form-urlencoded", "application/x-www-form-urlencoded", id="form"
        ),
        pytest.param(None, "none", id="missing"),
    ],
)
def test_a_body_that_is_not_json_is_415_naming_its_content_type(
    svc: Service, content_type: str | None, named: str
) -> None:
    svc.create_key()
    headers = dict(svc.admin)
    if content_type is not None:
        headers["Content-Type"] = content_type
    for path in ("/v1/detect", "/v1/generate", "/v1/keys"):
        raw = json.dumps({"text": "x", **GEN}).encode()
        r = svc.client.post(path, content=raw, headers=headers)
        found = problem(r, 415, "unsupported-media-type")
        assert found["field"] == "Content-Type"
        assert f"got {named}" in found["detail"] and "application/json" in found["detail"]
        assert r.headers["accept-post"] == "application/json"
    r = svc.client.post(  # a JSON type with parameters, or +json, is JSON
        "/v1/detect",
        content=b'{"text": "x"}',
        headers={**svc.admin, "Content-Type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200, r.text


def test_a_content_type_is_named_only_when_it_is_a_plain_media_type(svc: Service) -> None:
    pasted = "pmk_" + "zz" * 20
    headers = {**svc.admin, "Content-Type": f"text/{pasted}{'x' * 80}"}
    r = svc.client.post("/v1/detect", content=b'{"text": "x"}', headers=headers)
    found = problem(r, 415, "unsupported-media-type")
    assert pasted not in r.text and "got an unreadable media type" in found["detail"]


def test_malformed_json_is_400(svc: Service) -> None:
    r = svc.client.post(
        "/v1/detect",
        content=b'{"text": ',
        headers={**svc.admin, "Content-Type": "application/json"},
    )
    problem(r, 400, "malformed-request")


def test_oversized_body_is_413(svc: Service) -> None:
    big = {"text": "x" * 5000}
    found = problem(
        svc.client.post("/v1/detect", json=big, headers=svc.admin), 413, "body-too-large"
    )
    assert (found["field"], found["limit"]) == ("body", 4096)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the stream itself is counted
        yield b'{"text": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    r = svc.client.post(
        "/v1/detect", content=chunks(), headers={**svc.admin, "Content-Type": "application/json"}
    )
    problem(r, 413, "body-too-large")
    # just under the limit is fine
    ok = svc.client.post("/v1/detect", json={"token_ids": [1, 2]}, headers=svc.admin)
    assert ok.status_code in (200, 409)


def test_unknown_route_method_and_query_parameter(svc: Service) -> None:
    problem(svc.client.get("/v1/nothing"), 404, "not-found")
    r = svc.client.delete("/v1/keys", headers=svc.admin)
    problem(r, 405, "method-not-allowed")
    assert r.headers["allow"] == "GET, HEAD, POST"  # every route at the path, not just one
    r = svc.client.get("/v1/keys", params={"include_revokd": "true"}, headers=svc.admin)
    found = problem(r, 422, "invalid-request")
    assert "include_revoked" in found["detail"] and "include_revokd" not in r.text


class BlockingWorker(GenerationWorker):
    """A worker whose jobs wait for ``release`` (to fill the queue deterministically)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.release = threading.Event()
        self.running = threading.Event()
        super().__init__(*args, **kwargs)

    def _join(self, joining: list[tuple[Job, Drafter | None]]) -> None:
        if joining:
            self.running.set()
            self.release.wait(30)
        super()._join(joining)


def test_full_queue_is_503_with_retry_after(embedded_services: ServiceFactory) -> None:
    svc = embedded_services(queue_size=1, retry_after_s=7)
    key_id = svc.create_key()
    waiting: list[int] = []  # what the queue gauge is told (service.metrics)
    worker = BlockingWorker(svc.resources.loaded, 1, 7, on_waiting=waiting.append)
    svc.app.dependency_overrides[get_worker] = lambda: worker
    try:
        body = {"key_id": key_id, **GEN}
        results: list[int] = []

        def call() -> None:
            results.append(
                svc.client.post("/v1/generate", json=body, headers=svc.admin).status_code
            )

        first = threading.Thread(target=call)
        first.start()
        assert worker.running.wait(30)  # job 1 runs
        second = threading.Thread(target=call)
        second.start()
        while worker.waiting < 1:  # job 2 waits in the queue
            second.join(0.01)
        r = svc.client.post("/v1/generate", json=body, headers=svc.admin)
        found = problem(r, 503, "queue-full")
        assert r.headers["retry-after"] == "7"
        assert "queue" in found["detail"]
        assert waiting[-1] == 1  # job 2 waits
        worker.release.set()
        first.join(60)
        second.join(60)
        assert results == [200, 200]
        assert waiting[-1] == 0 and max(waiting) == 1
    finally:
        worker.release.set()
        worker.close()
        svc.app.dependency_overrides.clear()


def test_detect_rate_limit_is_429_with_retry_after(embedded_services: ServiceFactory) -> None:
    svc = embedded_services()
    # the app's Redis, a frozen clock (the fixed window must not roll over mid-test)
    limiter = RateLimiter(
        svc.resources.aredis, svc.settings.redis_prefix, 3, 60, clock=lambda: 1_000_010.0
    )
    svc.app.dependency_overrides[get_limiter] = lambda: limiter
    try:
        svc.create_key()
        h = svc.token("default", ("detect",))
        statuses = [
            svc.client.post("/v1/detect", json={"text": "x"}, headers=h).status_code
            for _ in range(3)
        ]
        assert statuses == [200, 200, 200]
        r = svc.client.post("/v1/detect", json={"text": "x"}, headers=h)
        problem(r, 429, "rate-limited")
        assert r.headers["retry-after"] == "10"  # 1_000_010 s: 10 s to the next 60 s window
        # the budget is per token: another token of the same tenant is unaffected
        other = svc.token("default", ("detect",))
        assert svc.client.post("/v1/detect", json={"text": "x"}, headers=other).status_code == 200
        # batch items count one each
        r = svc.client.post("/v1/detect/batch", json={"items": [{"text": "x"}] * 3}, headers=other)
        problem(r, 429, "rate-limited")
    finally:
        svc.app.dependency_overrides.clear()


def test_every_problem_type_is_stable_and_distinct() -> None:
    by_slug = {p.slug: p for p in PROBLEMS.values()}
    assert all(by_slug[p.slug] is p for p in PROBLEMS.values())  # one meaning per type
    assert all(p.type == PROBLEM_BASE + p.slug for p in PROBLEMS.values())
    assert problem_for(KeyError("x")).status == 500  # not in the table: internal, never exposed
    assert not problem_for(KeyError("x")).expose


def test_worker_refuses_when_closed(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from keyed import KeyedSource, Secret
    from service.errors import NotReady

    worker = GenerationWorker(tiny_loaded, 1, 1)
    worker.close()

    async def submit() -> None:
        worker.submit(
            [1], SamplerConfig("basic-uwm", max_new_tokens=1), KeyedSource(Secret(bytes(32))), None
        )

    with pytest.raises(NotReady):
        asyncio.run(submit())


def test_a_key_of_another_tokenizer_is_409_and_skipped_by_multi_key(svc: Service) -> None:
    """A key bound to another tokenizer cannot score this model's ids (every pivot would be
    unrelated to the key): asked by id, 409 ``tokenizer-mismatch``; multi-key leaves it out."""
    foreign = svc.store.create("sha256:" + "0" * 64)
    body = problem(
        svc.client.post(
            "/v1/detect",
            json={"text": "hello there", "key_id": foreign.key_id},
            headers=svc.admin,
        ),
        409,
        "tokenizer-mismatch",
    )
    assert foreign.key_id in body["detail"]
    svc.create_key()
    body = {"text": "hello there " * 8, "max_results": 100}
    r = svc.client.post("/v1/detect", json=body, headers=svc.admin)
    assert r.status_code == 200, r.text
    tested = {result["key_id"] for result in r.json()["results"]}
    own = {
        k.key_id
        for k in svc.store.list_keys(include_revoked=False)
        if k.tokenizer == svc.resources.fingerprint
    }
    assert foreign.key_id not in tested and r.json()["num_keys"] == len(own) <= 100
    assert tested == own  # every key of this tokenizer, none other


def test_a_drafter_deeper_than_the_model_is_422(svc: Service) -> None:
    """``self:N`` passes the schema for N < 100; the served model (2 layers) has the last word."""
    key_id = svc.create_key()
    body = {**GEN, "key_id": key_id, "prompt": "x", "method": "mpfr", "drafter": "self:5"}
    found = problem(
        svc.client.post("/v1/generate", json=body, headers=svc.admin), 422, "invalid-request"
    )
    assert found["field"] == "drafter"


def test_an_internal_bug_is_a_logged_500_without_detail(
    svc: Service, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ValueError that is no domain exception is a bug, never the caller's fault: 500
    ``internal-error`` problem+json with a generic detail, the traceback in the log only, and no
    key material in either."""
    key_id = svc.create_key()
    secret = svc.store.get(key_id).secret.reveal()

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("internal bug 7f3a: an invariant broke")

    monkeypatch.setattr(DetectionPool, "detect", broken)
    # Starlette's test transport re-raises what reached the server error handler; let the
    # response through instead (the app's own client: its resources live on that event loop).
    monkeypatch.setattr(svc.client._transport, "raise_server_exceptions", False)
    with caplog.at_level(logging.ERROR, logger="poissonmark.service"):
        r = svc.client.post("/v1/detect", json={"text": "x", "key_id": key_id}, headers=svc.admin)
    found = problem(r, 500, "internal-error")
    assert r.headers["content-type"] == "application/problem+json"
    assert found["detail"] == "the server could not complete the request; the error was logged"
    assert "7f3a" not in r.text and "Traceback" not in r.text and "ValueError" not in r.text
    logged = [rec for rec in caplog.records if rec.name == "poissonmark.service"]
    assert any(
        rec.levelno == logging.ERROR and rec.exc_info and "7f3a" in str(rec.exc_info[1])
        for rec in logged
    ), "the bug was not logged with its traceback"
    for text in (r.text, caplog.text):
        for shown in (secret.hex(), base64.b64encode(secret).decode(), repr(secret)):
            assert shown not in text
