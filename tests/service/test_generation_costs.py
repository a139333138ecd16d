"""No single request can exhaust the generation side (docs/threat-model.md, under load), over
HTTP: every generation route charges the token's budget by tokens (prompt + new tokens asked
for), a tenant's burst does not keep another tenant's request out of the worker, and a
generation or a detection past its deadline answers 504 and frees its slot."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest

from sampler.completion import prompt_ids
from service.http.deps import get_generate_limiter
from service.ratelimit import RateLimiter
from tests.service.conftest import Service, ServiceFactory, slowed
from tests.service.test_request_costs import problem

PROMPT = "Write one sentence about the sea."
NEW = 20

ROUTES = [  # (route, stream)
    pytest.param("generate", False, id="generate"),
    pytest.param("generate", True, id="generate_stream"),
    pytest.param("chat", False, id="chat"),
    pytest.param("chat", True, id="chat_stream"),
    pytest.param("completions", False, id="completions"),
    pytest.param("completions", True, id="completions_stream"),
]


def _request(route: str, key_id: str, stream: bool, new: int = NEW) -> tuple[str, dict[str, Any]]:
    if route == "generate":
        body = {"key_id": key_id, "prompt": PROMPT, "max_new_tokens": new, "stream": stream}
        return "/v1/generate", body
    common = {"model": "tiny", "key_id": key_id, "max_tokens": new, "stream": stream}
    if route == "chat":
        return "/v1/chat/completions", {
            **common,
            "messages": [{"role": "user", "content": PROMPT}],
        }
    return "/v1/completions", {**common, "prompt": PROMPT}


def _prompt_tokens(svc: Service, route: str) -> int:
    """The prompt's tokens as the route counts them (chat template, or raw for completions)."""
    loaded = svc.resources.loaded
    if route == "completions":
        return len(loaded.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    if route == "chat":
        return len(prompt_ids(loaded, None, [{"role": "user", "content": PROMPT}]))
    return len(prompt_ids(loaded, PROMPT))


def frozen_generate_limiter(svc: Service, limit: int) -> RateLimiter:
    """The app's generation budget with ``limit`` tokens per window on a frozen clock."""
    limiter = RateLimiter(
        svc.resources.aredis,
        svc.settings.redis_prefix,
        limit,
        60,
        clock=lambda: 1_000_010.0,
        kind="generate",
        unit="tokens (prompt + new tokens requested)",
    )
    svc.app.dependency_overrides[get_generate_limiter] = lambda: limiter
    return limiter


@pytest.mark.parametrize(("route", "stream"), ROUTES)
def test_generation_is_charged_prompt_plus_new_tokens(
    embedded_services: ServiceFactory, route: str, stream: bool
) -> None:
    """A budget of 3.5 requests' tokens: three pass, the fourth is 429 with Retry-After naming
    ``generate_rate_limit`` (one unit per request would let hundreds pass); another token has
    its own budget."""
    svc = embedded_services()
    try:
        key_id = svc.create_key()
        cost = _prompt_tokens(svc, route) + NEW
        assert cost > NEW + 5  # the prompt counts
        frozen_generate_limiter(svc, 3 * cost + cost // 2)
        caller = svc.token("default", ("generate",))
        path, body = _request(route, key_id, stream)
        statuses = [svc.client.post(path, json=body, headers=caller) for _ in range(4)]
        assert [r.status_code for r in statuses] == [200, 200, 200, 429], statuses[-1].text
        refused = statuses[-1]
        assert refused.headers["retry-after"] == "10"  # 1_000_010 s: 10 s to the next window
        if route == "generate":
            found = problem(refused, 429, "rate-limited")
            assert (found["field"], found["limit"]) == ("generate_rate_limit", 3 * cost + cost // 2)
            assert "tokens (prompt + new tokens requested)" in found["detail"]
        else:
            error = refused.json()["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limited")
            assert "generate_rate_limit" in error["message"]
        other = svc.token("default", ("generate",))
        assert svc.client.post(path, json=body, headers=other).status_code == 200
    finally:
        svc.app.dependency_overrides.clear()


@pytest.mark.parametrize("route", ["generate", "chat"])
def test_a_generation_costing_more_than_a_window_is_refused(
    embedded_services: ServiceFactory, route: str
) -> None:
    """max_new_tokens alone over the window's budget, or with the prompt's tokens: a 4xx
    naming the new-tokens field and the limit (never a wait for a window that cannot come)."""
    svc = embedded_services()
    try:
        key_id = svc.create_key()
        cost = _prompt_tokens(svc, route) + NEW
        for limit in (NEW - 1, cost - 1):  # the new tokens alone, then with the prompt's
            frozen_generate_limiter(svc, limit)
            caller = svc.token("default", ("generate",))
            path, body = _request(route, key_id, False)
            r = svc.client.post(path, json=body, headers=caller)
            if route == "generate":
                found = problem(r, 422, "limit-exceeded")
                assert (found["field"], found["limit"]) == ("max_new_tokens", limit)
                assert "generate_rate_limit" in found["detail"]
            else:
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert (error["param"], error["code"]) == ("max_tokens", "limit_exceeded")
    finally:
        svc.app.dependency_overrides.clear()


def test_a_tenants_burst_does_not_keep_anothers_request_out(live: Any, tiny_loaded: Any) -> None:
    """One slot, two queue entries; tenant A's three requests take the slot and the queue. B's
    request still gets in (A's newest waiting one is refused 503 ``queue-full``, as if it had
    come later) and runs as soon as A's first finishes, before A's second: the tenant of the
    token reaches the worker's fair share. With one tenant B would have got the 503."""
    svc = live(slowed(tiny_loaded, 0.03), generation_batch=1, queue_size=2)
    key_a = svc.create_key(a := svc.token("A", ("generate", "keys")))
    key_b = svc.create_key(b := svc.token("B", ("generate", "keys")))
    worker = svc.resources.worker
    done: list[tuple[str, int, dict[str, Any]]] = []
    lock = threading.Lock()

    def call(name: str, headers: dict[str, str], key_id: str) -> None:
        body = {"key_id": key_id, "prompt": PROMPT, "max_new_tokens": 30}
        with httpx.Client(base_url=str(svc.client.base_url), timeout=120) as client:
            r = client.post("/v1/generate", json=body, headers=headers)
        with lock:
            done.append((name, r.status_code, {**r.json(), **dict(r.headers)}))

    threads = []

    def start(name: str, headers: dict[str, str], key_id: str, until: Any) -> None:
        thread = threading.Thread(target=call, args=(name, headers, key_id))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 30
        while not until():
            assert time.monotonic() < deadline, (worker.active, worker.waiting)
            time.sleep(0.005)

    start("A1", a, key_a, lambda: worker.active == 1)
    start("A2", a, key_a, lambda: worker.waiting == 1)
    start("A3", a, key_a, lambda: worker.waiting == 2)
    start("B", b, key_b, lambda: any(name == "A3" for name, _, _ in done))
    for thread in threads:
        thread.join(120)
    order = [(name, status) for name, status, _ in done]
    assert order == [("A3", 503), ("A1", 200), ("B", 200), ("A2", 200)], order
    refused = done[0][2]
    assert refused["type"] == "urn:poissonmark:problem:queue-full"
    assert refused["retry-after"] == str(svc.settings.retry_after_s)


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


@pytest.mark.parametrize(("route", "stream"), ROUTES)
def test_a_generation_past_its_deadline_is_504_and_frees_its_slot(
    embedded_services: ServiceFactory, tiny_loaded: Any, route: str, stream: bool
) -> None:
    """Each forward sleeps 20 ms, a 500-token generation would take over 10 s; the deadline
    is 1 s: 504 ``deadline-exceeded`` naming ``generation_deadline_s`` (streaming: the last
    event / chunk is that error), the worker's slot frees within a few steps, and the next
    request runs."""
    svc = embedded_services(slowed(tiny_loaded, 0.02), generation_deadline_s=1)
    key_id = svc.create_key()
    path, body = _request(route, key_id, stream, new=500)
    began = time.monotonic()
    r = svc.client.post(path, json=body, headers=svc.admin)
    assert 1 <= time.monotonic() - began < 8
    if not stream:
        assert r.status_code == 504, r.text
        if route == "generate":
            found = problem(r, 504, "deadline-exceeded")
            assert (found["field"], found["limit"]) == ("generation_deadline_s", 1)
        else:
            error = r.json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "deadline_exceeded")
            assert "generation_deadline_s" in error["message"]
    elif route == "generate":
        events = _events(r.text)
        assert events[0][0] == "start" and events[-1][0] == "error"
        assert events[-1][1]["status"] == 504 and events[-1][1]["field"] == "generation_deadline_s"
        assert any(name == "delta" for name, _ in events)  # it had been running
    else:
        lines = [line for line in r.text.split("\n") if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["error"]["code"] == "deadline_exceeded"
    worker = svc.resources.worker
    while worker.active:
        assert time.monotonic() - began < 10
        time.sleep(0.01)
    path, body = _request(route, key_id, False, new=3)
    assert svc.client.post(path, json=body, headers=svc.admin).status_code == 200


def test_a_detection_past_its_deadline_is_504(embedded_services: ServiceFactory) -> None:
    """One detection thread, held by other work: a detect request waits for it past its
    0.5 s deadline and gets 504 ``deadline-exceeded`` naming ``detect_deadline_s``; once the
    thread is free, detection answers again."""
    svc = embedded_services(detect_threads=1, detect_deadline_s=0.5)
    svc.create_key()
    held, busy = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        held.wait(30)

    holder = threading.Thread(target=lambda: asyncio.run(svc.resources.pool.run(hold)))
    holder.start()
    try:
        assert busy.wait(10)
        began = time.monotonic()
        r = svc.client.post("/v1/detect", json={"text": "hello there"}, headers=svc.admin)
        assert 0.5 <= time.monotonic() - began < 5
        found = problem(r, 504, "deadline-exceeded")
        assert (found["field"], found["limit"]) == ("detect_deadline_s", 0.5)
    finally:
        held.set()
        holder.join(30)
    r = svc.client.post("/v1/detect", json={"text": "hello there"}, headers=svc.admin)
    assert r.status_code == 200, r.text
