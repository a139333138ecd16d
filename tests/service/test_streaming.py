"""Streaming and cancellation: incremental decoding never splits a character, the deltas
concatenate to the non-streamed text for the same key and nonce, and a client that goes away
stops its generation (the worker is free again within a step)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx
import pytest

from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig
from service.errors import GenerationCancelled
from service.http.streaming import IncrementalDecoder, decode_text
from service.jobs.worker import Failed, Finished, GenerationWorker, Tokens
from tests.service.conftest import Service, ServiceFactory, slowed

SAMPLES = [
    "héllo wörld 😀 ok , you ' re",
    "日本語のテキストと絵文字 👩‍👩‍👧‍👦 family",
    "math: ∑ᵢ xᵢ² ≤ ∞ — and ‘quotes’ “too”",
    "  leading spaces\n\n\ttabs and trailing   ",
    "<|im_start|>special tokens stay<|im_end|> ok",
]


def parse_sse(body: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


@pytest.mark.parametrize("text", [pytest.param(t, id=f"sample{i}") for i, t in enumerate(SAMPLES)])
def test_incremental_decoding_never_splits_and_concatenates(real_tokenizer, text: str) -> None:  # type: ignore[no-untyped-def]
    ids = real_tokenizer.encode(text, add_special_tokens=False)
    final = decode_text(real_tokenizer, ids)
    rng = random.Random(0)
    for _ in range(20):
        decoder = IncrementalDecoder(real_tokenizer)
        deltas, i = [], 0
        while i < len(ids):
            step = rng.randint(1, 4)
            deltas.append(decoder.push(ids[i : i + step]))
            i += step
        deltas.append(decoder.finish())
        assert "".join(deltas) == final
        if "\ufffd" not in final:
            assert not any("\ufffd" in d for d in deltas)  # no half character was ever shown


def test_incremental_decoding_of_arbitrary_ids(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Random ids (byte tokens that never complete a character included): the stream still
    concatenates to the full decode, whatever the tokenizer makes of them."""
    rng = random.Random(1)
    vocab = len(real_tokenizer)
    for _ in range(50):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        decoder = IncrementalDecoder(real_tokenizer)
        deltas = [decoder.push([t]) for t in ids] + [decoder.finish()]
        assert "".join(deltas) == decode_text(real_tokenizer, ids)


def test_stream_equals_non_stream(embedded_services: ServiceFactory) -> None:
    svc = embedded_services()
    key_id = svc.create_key()
    for method in ("mpfr", "basic-uwm"):
        body = {
            "key_id": key_id,
            "prompt": "Write a poem.",
            "max_new_tokens": 24,
            "nonce": 1234,
            "method": method,
            "drafter": "self:1",
        }
        plain = svc.client.post("/v1/generate", json=body, headers=svc.admin)
        assert plain.status_code == 200, plain.text
        streamed = svc.client.post("/v1/generate", json={**body, "stream": True}, headers=svc.admin)
        assert streamed.status_code == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(streamed.text)
        assert events[0] == ("start", {"key_id": key_id, "nonce": 1234, "method": method})
        assert events[-1][0] == "done"
        deltas = [data for name, data in events if name == "delta"]
        expected = plain.json()
        assert "".join(d["text"] for d in deltas) == expected["text"]
        assert [t for d in deltas for t in d["token_ids"]] == expected["token_ids"]
        done = events[-1][1]
        for field in ("text", "token_ids", "nonce", "finish_reason", "watermark_applied"):
            assert done[field] == expected[field]


def test_stream_reports_errors_before_it_starts(embedded_services: ServiceFactory) -> None:
    svc = embedded_services()
    r = svc.client.post(
        "/v1/generate",
        json={"key_id": "pmk_0123456789abcdef", "prompt": "x", "stream": True},
        headers=svc.admin,
    )
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/problem+json")


def metric(svc: Service, name: str) -> float:
    for line in svc.client.get("/metrics", headers=svc.admin).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_client_disconnect_cancels_generation(live, tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    svc: Service = live(slowed(tiny_loaded, 0.02))  # 512 steps take over 10 s
    key_id = svc.create_key()
    long = {"key_id": key_id, "prompt": "Go on.", "max_new_tokens": 512, "method": "basic-uwm"}
    worker = svc.resources.worker

    # streamed: read the first delta, then hang up
    with svc.client.stream(
        "POST", "/v1/generate", json={**long, "stream": True}, headers=svc.admin
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: delta"):
                break
    deadline = time.monotonic() + 10
    while metric(svc, "poissonmark_generations_cancelled_total") < 1:
        assert time.monotonic() < deadline, "the server did not notice the disconnect"
        time.sleep(0.05)

    # not streamed: the client times out and closes the connection
    impatient = httpx.Client(base_url=str(svc.client.base_url), timeout=0.5)
    with impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post("/v1/generate", json=long, headers=svc.admin)
    while metric(svc, "poissonmark_generations_cancelled_total") < 2:
        assert time.monotonic() < deadline + 10, "the server did not notice the disconnect"
        time.sleep(0.05)

    # neither job ran to its 512 tokens: nothing finished, and the worker is free at once
    start = time.monotonic()
    short = svc.client.post("/v1/generate", json={**long, "max_new_tokens": 2}, headers=svc.admin)
    assert short.status_code == 200
    assert time.monotonic() - start < 5
    assert metric(svc, "poissonmark_tokens_generated_total") == 2
    assert worker.waiting == 0


def test_worker_cancels_queued_and_running_jobs(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    config = SamplerConfig("basic-uwm", max_new_tokens=10_000)
    source = KeyedSource(Secret(bytes(range(32))), 4, True, 1)

    async def scenario() -> None:
        worker = GenerationWorker(tiny_loaded, 2, 1)
        try:
            running = worker.submit([1, 2, 3], config, source, None)
            queued = worker.submit([1, 2, 3], config, source, None)
            queued.cancel()
            first = await running.events.get()  # the first step arrived: it is running
            assert isinstance(first, Tokens)
            running.cancel()
            for job in (running, queued):
                with pytest.raises(GenerationCancelled):
                    await asyncio.wait_for(job.result(), 30)
            ok = worker.submit([1, 2], SamplerConfig("basic-uwm", max_new_tokens=3), source, None)
            assert isinstance(await asyncio.wait_for(ok.result(), 30), Finished)
        finally:
            worker.close()

    asyncio.run(scenario())


def test_worker_reports_generation_errors(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        worker = GenerationWorker(tiny_loaded, 1, 1)
        try:
            bad = worker.submit(
                [10**9],
                SamplerConfig("basic-uwm", max_new_tokens=1),
                KeyedSource(Secret(bytes(32))),
                None,
            )
            event = await asyncio.wait_for(bad.events.get(), 30)
            assert isinstance(event, Failed) and isinstance(event.error, ValueError)
        finally:
            worker.close()

    asyncio.run(scenario())


def test_tree_auto_is_the_default_and_changes_no_token(embedded_services: ServiceFactory) -> None:
    """``tree`` (default ``auto``): the same tokens as ``fixed`` and as basic-uwm for the same
    key and nonce (Thm. 5.1). The served tiny model is float32, where ``auto`` drafts as
    ``fixed`` (no timing-driven trees: ``sampler.autotree.tree_invariant``), so no tree
    choices are reported; the stats split the decoding seconds by part; another value is a
    422 naming the field."""
    svc = embedded_services()
    key_id = svc.create_key()
    body = {"key_id": key_id, "prompt": "Write a poem.", "max_new_tokens": 30, "nonce": 99}
    answers = {}
    for name, extra in {
        "default": {},
        "fixed": {"tree": "fixed"},
        "basic": {"method": "basic-uwm"},
    }.items():
        r = svc.client.post("/v1/generate", json=body | extra, headers=svc.admin)
        assert r.status_code == 200, r.text
        answers[name] = r.json()
    assert answers["default"]["token_ids"] == answers["fixed"]["token_ids"]
    assert answers["default"]["token_ids"] == answers["basic"]["token_ids"]
    assert answers["default"]["stats"]["tree_choices"] == []
    assert answers["fixed"]["stats"]["tree_choices"] == []
    for answer in answers.values():  # the decoding seconds by part, within the total
        parts = answer["stats"]["step_seconds"]
        assert parts["forward"] > 0 and parts["walk"] > 0
        assert sum(parts.values()) <= answer["stats"]["seconds"]
    assert answers["basic"]["stats"]["step_seconds"]["draft"] == 0
    bad = svc.client.post("/v1/generate", json=body | {"tree": "deep"}, headers=svc.admin)
    assert bad.status_code == 422 and "tree" in bad.text
