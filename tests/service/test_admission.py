"""Admission (``service.admission``): a request over any one limit is refused before any model
work starts.

For each route a request that breaks exactly one limit — a cap of the settings, the drafter,
the key, the rate limit's remaining budget, a whole window's budget, the deadline — gets its
problem, and the job's entry point is never called: the generation worker's ``submit`` and
the target's forward (a hook on the served model) for ``POST /v1/generate``, the detection
pool's ``run_plan`` (the key records read and the detector run) for ``POST /v1/detect``. The
spies only count; the app, its Redis (embedded and the server at 127.0.0.1:6379) and its pool
are the real ones. A request within every limit reaches the job, so each spy can fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sampler.completion import prompt_ids
from service.http.deps import get_generate_limiter, get_limiter, get_settings
from service.ratelimit import RateLimiter
from tests.service.conftest import (
    SERVER_URL,
    Service,
    ServiceFactory,
    server_listening,
)
from tests.service.test_api_keys import problem

LIMITS = {
    "max_new_tokens": 16,
    "max_drafts": 4,
    "max_lookahead": 4,
    "max_prompt_chars": 200,
    "max_prompt_tokens": 60,
    "max_messages": 2,
    "max_text_chars": 100,
    "max_token_ids": 10,
    "max_tokens": 40,
    "max_evidence_tokens": 30,
    "max_batch": 2,
    "detect_work_unit": 1,  # a detection costs its tokens × keys: small texts reach a window
    "detect_rate_limit": 1_000_000,  # the app's own budget; the budget's cases set theirs
}
GEN = {"prompt": "Hi", "max_new_tokens": 4, "method": "basic-uwm"}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(None, id="embedded"),
        pytest.param(SERVER_URL, id="server", marks=pytest.mark.redis_server),
    ],
)
def svc(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_loaded: Any
) -> Iterator[Service]:
    """One app with small limits on each Redis backend (the tests add keys, change no limit)."""
    if request.param and not server_listening():
        pytest.skip("no Redis server at 127.0.0.1:6379")
    factory = ServiceFactory(tmp_path_factory.mktemp("admission"), tiny_loaded, request.param)
    with factory.stack:
        yield factory(**LIMITS)


@pytest.fixture(scope="module")
def key_id(svc: Service) -> str:
    return svc.create_key()


class Calls:
    """How many times each spied entry point was called."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            return real(*args, **kwargs)

        return spy

    def total(self) -> int:
        return sum(self.counts.values())


@pytest.fixture
def calls(svc: Service, monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Spies on the jobs' entry points and the target's forward; overrides cleared after."""
    found = Calls()
    resources = svc.resources
    monkeypatch.setattr(resources.worker, "submit", found.wrap("submit", resources.worker.submit))
    monkeypatch.setattr(resources.pool, "run_plan", found.wrap("run_plan", resources.pool.run_plan))
    hook = resources.loaded.model.register_forward_pre_hook(
        lambda *_: found.counts.__setitem__("forward", found.counts.get("forward", 0) + 1)
    )
    try:
        yield found
    finally:
        hook.remove()
        svc.app.dependency_overrides.clear()


def frozen(svc: Service, limit: int, kind: str) -> RateLimiter:
    """The app's Redis with ``limit`` units of ``kind``'s budget on a frozen clock."""
    limiter = RateLimiter(
        svc.resources.aredis,
        f"{svc.settings.redis_prefix}{time.monotonic_ns()}:",  # a fresh budget per test
        limit,
        60,
        clock=lambda: 1_000_010.0,
        kind=kind,
    )
    dependency = get_generate_limiter if kind == "generate" else get_limiter
    svc.app.dependency_overrides[dependency] = lambda: limiter
    return limiter


def _generate(svc: Service, body: dict[str, Any]) -> Any:
    return svc.client.post("/v1/generate", json=body, headers=svc.admin)


def test_a_generation_within_every_limit_reaches_the_worker_and_the_model(
    svc: Service, key_id: str, calls: Calls
) -> None:
    assert _generate(svc, {"key_id": key_id, **GEN}).status_code == 200
    assert calls.counts["submit"] == 1 and calls.counts["forward"] >= 1


EMOJI = "\U0001f600"


@pytest.mark.parametrize(
    ("change", "status", "slug", "field"),
    [
        pytest.param({"max_new_tokens": 17}, 422, "limit-exceeded", "max_new_tokens", id="new"),
        pytest.param({"drafts": 5, "method": "mpfr"}, 422, "limit-exceeded", "drafts", id="B"),
        pytest.param(
            {"lookahead": 5, "method": "mpfr"}, 422, "limit-exceeded", "lookahead", id="L"
        ),
        pytest.param({"prompt": "x" * 201}, 422, "limit-exceeded", "prompt", id="prompt_chars"),
        pytest.param(
            {"prompt": None, "messages": [{"role": "user", "content": "a"}] * 3},
            422,
            "limit-exceeded",
            "messages",
            id="messages",
        ),
        pytest.param(
            {"prompt": None, "messages": [{"role": "user", "content": "a" * 201}]},
            422,
            "limit-exceeded",
            "messages[].content",
            id="message_chars",
        ),
        pytest.param({"prompt": EMOJI * 60}, 422, "limit-exceeded", "prompt", id="prompt_tokens"),
        pytest.param({"drafter": "self:5"}, 422, "invalid-request", "drafter", id="drafter"),
        pytest.param({"key_id": "pmk_0000000000000000"}, 404, "unknown-key", None, id="key"),
    ],
)
def test_a_generation_over_one_limit_is_refused_before_any_model_work(
    svc: Service,
    key_id: str,
    calls: Calls,
    change: dict[str, Any],
    status: int,
    slug: str,
    field: str | None,
) -> None:
    body = {k: v for k, v in {"key_id": key_id, **GEN, **change}.items() if v is not None}
    found = problem(_generate(svc, body), status, slug)
    if field is not None:
        assert found["field"] == field
    assert calls.total() == 0


def test_a_generation_without_budget_left_is_refused_before_any_model_work(
    svc: Service, key_id: str, calls: Calls
) -> None:
    """The first request spends the window's budget exactly (its prompt + 4 new tokens); the
    second is refused at its first charge, before its prompt is tokenized."""
    prompt = len(prompt_ids(svc.resources.loaded, GEN["prompt"], None))
    frozen(svc, prompt + 4, "generate")
    assert _generate(svc, {"key_id": key_id, **GEN}).status_code == 200
    spent = calls.total()
    r = _generate(svc, {"key_id": key_id, **GEN})
    problem(r, 429, "rate-limited")
    assert "retry-after" in r.headers
    assert calls.total() == spent


def test_a_generation_costing_more_than_a_window_is_refused_before_any_model_work(
    svc: Service, key_id: str, calls: Calls
) -> None:
    frozen(svc, 3, "generate")
    found = problem(_generate(svc, {"key_id": key_id, **GEN}), 422, "limit-exceeded")
    assert (found["field"], found["limit"]) == ("max_new_tokens", 3)
    assert calls.total() == 0


def _detect(svc: Service, body: dict[str, Any], path: str = "/v1/detect") -> Any:
    return svc.client.post(path, json=body, headers=svc.admin)


TEXT = "The quick brown fox jumps over the lazy dog."


def test_a_detection_within_every_limit_reaches_the_detector(
    svc: Service, key_id: str, calls: Calls
) -> None:
    assert _detect(svc, {"text": TEXT, "key_id": key_id}).status_code == 200
    assert calls.counts["run_plan"] == 1


@pytest.mark.parametrize(
    ("path", "body", "status", "slug", "field"),
    [
        pytest.param("", {"text": "x" * 101}, 422, "limit-exceeded", "text", id="text_chars"),
        pytest.param(
            "", {"token_ids": [1] * 11}, 422, "limit-exceeded", "token_ids", id="token_ids"
        ),
        pytest.param(
            "", {"token_ids": [10**8]}, 422, "invalid-request", "token_ids[0]", id="vocabulary"
        ),
        pytest.param("", {"text": EMOJI * 20}, 422, "limit-exceeded", "text", id="tokens"),
        pytest.param(
            "",
            {"text": TEXT, "prompt": "x" * 201},
            422,
            "limit-exceeded",
            "prompt",
            id="prompt_chars",
        ),
        pytest.param(
            "/batch",
            {"items": [{"text": "a"}] * 3},
            422,
            "limit-exceeded",
            "items",
            id="batch_items",
        ),
        pytest.param(
            "/batch",
            {"items": [{"text": "a"}, {"text": "x" * 101}]},
            422,
            "limit-exceeded",
            "items[1].text",
            id="batch_item_text",
        ),
    ],
)
def test_a_detection_over_one_limit_is_refused_before_any_model_work(
    svc: Service,
    key_id: str,
    calls: Calls,
    path: str,
    body: dict[str, Any],
    status: int,
    slug: str,
    field: str,
) -> None:
    payload = {k: v for k, v in {"key_id": key_id, **body}.items() if v is not None}
    r = _detect(svc, payload, "/v1/detect" + path)
    assert problem(r, status, slug)["field"] == field
    assert calls.total() == 0


def test_evidence_rows_over_the_limit_are_refused_before_any_model_work(
    svc: Service, key_id: str, calls: Calls
) -> None:
    """31 tokens are within ``max_tokens`` (40) but ask for 31 evidence rows, over
    ``max_evidence_tokens`` (30)."""
    body = {"text": "ab " * 30, "key_id": key_id, "evidence": True}
    found = problem(_detect(svc, body), 422, "limit-exceeded")
    assert found["limit"] == svc.settings.max_evidence_tokens
    assert calls.total() == 0


def test_a_detection_without_budget_left_is_refused_before_any_model_work(
    svc: Service, key_id: str, calls: Calls
) -> None:
    """Short texts (9 units each: 1 token × 1 key × (1 + 8)) until the window's budget (20) is
    spent: the request that finds it spent is refused, and the detector never runs for it."""
    frozen(svc, 20, "detect")
    for _ in range(4):
        spent = calls.total()
        r = _detect(svc, {"text": "x", "key_id": key_id})
        if r.status_code != 200:
            break
    problem(r, 429, "rate-limited")
    assert "retry-after" in r.headers
    assert calls.counts["run_plan"] >= 1  # the ones within the budget ran
    assert calls.total() == spent


def test_a_detection_costing_more_than_a_window_is_refused_before_any_model_work(
    svc: Service, key_id: str, calls: Calls
) -> None:
    """``TEXT`` is 10 tokens against one key: 90 units, over a window of 5."""
    frozen(svc, 5, "detect")
    found = problem(_detect(svc, {"text": TEXT, "key_id": key_id}), 422, "limit-exceeded")
    assert (found["field"], found["limit"]) == ("text", 5)
    assert calls.total() == 0


def test_a_detection_past_its_deadline_is_refused_before_any_model_work(
    svc: Service, key_id: str, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning (keys counted, items tokenized) outlasts ``detect_deadline_s``: 504, and the
    detector never starts."""
    pool = svc.resources.pool
    real_plan = pool.plan

    def slow_plan(*args: Any) -> Any:
        time.sleep(0.5)
        return real_plan(*args)

    monkeypatch.setattr(pool, "plan", slow_plan)
    hurried = svc.settings.model_copy(update={"detect_deadline_s": 0.1})
    svc.app.dependency_overrides[get_settings] = lambda: hurried
    found = problem(_detect(svc, {"text": TEXT, "key_id": key_id}), 504, "deadline-exceeded")
    assert "detect_deadline_s" in found["detail"]
    time.sleep(0.5)  # the plan under way finishes; nothing runs after it
    assert calls.total() == 0
