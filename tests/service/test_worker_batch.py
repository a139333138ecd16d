"""The generation worker's continuous batching, on a tiny random Llama behind the
real tokenizer: concurrent jobs step together and each gets exactly its solo output and only
its own tokens; a cancelled job frees its slot for a waiting one; the worker keeps its torch
threads after the detection pool's initializer set 1."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from keyed import KeyedSource, Secret
from sampler.completion import eos_ids
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import make_drafter
from sampler.processing import Processing
from service.errors import GenerationCancelled, InvalidInput, QueueFull
from service.jobs.detection_pool import _one_torch_thread
from service.jobs.worker import Failed, Finished, GenerationWorker, Job, Tokens


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret(bytes([i + 1]) * 32), 4, True, 1000 + i)


JOBS = [  # (prompt, config, drafter): mixed lengths, methods, processing, B, L
    ([1, 2, 3], SamplerConfig("mpfr", 4, 3, 20), "ngram"),
    ([5] * 17, SamplerConfig("basic-uwm", max_new_tokens=9), None),
    ([7, 8], SamplerConfig("pfr", 1, 4, 14, Processing(0.8, 40, 0.9)), "self:1"),
    ([9, 10, 11, 12, 13], SamplerConfig("mpfr", 2, 2, 25, Processing(1.2, 0, 1.0)), "ngram"),
    ([4], SamplerConfig("ar", max_new_tokens=7), None),
    ([20, 21, 22, 23], SamplerConfig("gls", 3, 2, 11), "self:1"),
    ([30] * 9, SamplerConfig("vsps", 1, 3, 16), "ngram"),
]


def _wide(loaded):  # type: ignore[no-untyped-def]
    """``loaded`` on a float64 copy of its model: in float32 a batched forward rounds the last
    bits differently from a solo one, so a near-tie of the race can flip between the two (the
    batching is what is tested, not float32 rounding)."""
    wide = copy.deepcopy(loaded.model).double()
    return dataclasses.replace(loaded, model=wide, dtype=torch.float64)


def _solo(loaded, i: int):  # type: ignore[no-untyped-def]
    prompt, config, spec = JOBS[i]
    drafter = make_drafter(spec, loaded.target) if spec else None
    return generate(loaded.target, prompt, config, _source(i), drafter, eos_ids(loaded))


async def _collect(job: Job) -> tuple[list[int], Finished | Failed]:
    """The ids of a job's Tokens events, and its final event."""
    ids: list[int] = []
    while True:
        event = await asyncio.wait_for(job.events.get(), 60)
        if isinstance(event, Tokens):
            ids.extend(event.ids)
        else:
            return ids, event


def test_concurrent_jobs_batch_and_equal_solo(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """Seven jobs, at most four stepping together, the rest waiting in the queue: each one's
    streamed tokens are exactly its solo output (no other job's), and the batch gauge saw 4.
    Both run the tiny model in float64 (``_wide``)."""
    loaded = _wide(tiny_loaded)
    sizes: list[int] = []
    waiting: list[int] = []

    async def scenario() -> list[tuple[list[int], Finished | Failed]]:
        worker = GenerationWorker(
            loaded, 8, 1, max_batch=4, on_batch=sizes.append, on_waiting=waiting.append
        )
        try:
            jobs = [worker.submit(p, c, _source(i), d) for i, (p, c, d) in enumerate(JOBS)]
            return list(await asyncio.gather(*(_collect(j) for j in jobs)))
        finally:
            worker.close()

    outcomes = asyncio.run(scenario())
    for i, (streamed, final) in enumerate(outcomes):
        assert isinstance(final, Finished), final
        solo = _solo(loaded, i)
        assert final.result.token_ids == solo.token_ids, i
        assert tuple(streamed) == solo.token_ids, i  # each stream carries only its tokens
        assert final.result.finish_reason == solo.finish_reason
    assert max(sizes) == 4 and sizes[-1] == 0
    assert max(waiting) >= 1  # some waited for a slot


def test_a_job_that_waits_for_its_end_gets_its_end_alone(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """A job submitted with ``stream=False`` (a non-streamed request) is posted no ``Tokens``
    while it runs beside a streamed one (each step of theirs would wake the event loop): its
    queue holds the final event alone, with its solo output; the streamed job beside it still
    gets every token. Both in float64 (``_wide``)."""
    loaded = _wide(tiny_loaded)

    async def scenario() -> tuple[tuple[list[int], Finished | Failed], ...]:
        worker = GenerationWorker(loaded, 4, 1, max_batch=2)
        try:
            quiet = worker.submit(*JOBS[0][:2], _source(0), JOBS[0][2], stream=False)
            loud = worker.submit(*JOBS[3][:2], _source(3), JOBS[3][2])
            return await asyncio.gather(_collect(quiet), _collect(loud))
        finally:
            worker.close()

    (quiet_ids, quiet_end), (loud_ids, loud_end) = asyncio.run(scenario())
    assert quiet_ids == [] and isinstance(quiet_end, Finished)
    assert quiet_end.result.token_ids == _solo(loaded, 0).token_ids
    assert isinstance(loud_end, Finished)
    assert tuple(loud_ids) == loud_end.result.token_ids == _solo(loaded, 3).token_ids


def test_cancelled_job_frees_its_slot(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """One slot: a long job runs, a short one waits; cancelling the long one lets the short
    one run at the next step (it finishes with its solo output)."""
    long = SamplerConfig("basic-uwm", max_new_tokens=10_000)

    async def scenario() -> None:
        worker = GenerationWorker(tiny_loaded, 2, 1, max_batch=1)
        try:
            running = worker.submit([1, 2, 3], long, _source(0), None)
            waiting = worker.submit(JOBS[1][0], JOBS[1][1], _source(1), None)
            first = await asyncio.wait_for(running.events.get(), 30)
            assert isinstance(first, Tokens) and worker.active == 1
            assert not waiting.ended.is_set()  # no free slot for it yet
            running.cancel()
            with pytest.raises(GenerationCancelled):
                await asyncio.wait_for(running.result(), 30)
            done = await asyncio.wait_for(waiting.result(), 60)
            assert done.result.token_ids == _solo(tiny_loaded, 1).token_ids
        finally:
            worker.close()

    asyncio.run(scenario())


def test_queue_stays_bounded_while_batching(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """Two jobs active and one waiting fill max_batch = 2 and queue_size = 1: the next is
    refused with QueueFull (the route's 503 + Retry-After)."""
    gate, gated = threading.Event(), threading.Event()

    class Gated(GenerationWorker):
        def _join(self, joining):  # type: ignore[no-untyped-def]
            super()._join(joining)
            if self.active == 2:  # the second admitted job holds the thread after its prefill
                gated.set()
                gate.wait(30)

    long = SamplerConfig("basic-uwm", max_new_tokens=10_000)

    async def scenario() -> None:
        worker = Gated(tiny_loaded, 1, 3, max_batch=2)
        jobs = []
        try:
            for i in range(2):
                jobs.append(worker.submit([1 + i, 2], long, _source(i), None))
                while worker.waiting:  # taken from the queue into the batch
                    await asyncio.sleep(0.01)
            assert gated.wait(30)  # the worker thread is held: nothing more is admitted
            jobs.append(worker.submit([5, 6], long, _source(2), None))
            assert worker.waiting == 1 and worker.active == 2
            with pytest.raises(QueueFull) as refused:
                worker.submit([7, 8], long, _source(3), None)
            assert refused.value.retry_after_s == 3
        finally:
            gate.set()
            for job in jobs:
                job.cancel()
            worker.close()

    asyncio.run(scenario())


def test_worker_keeps_its_threads_after_the_detection_pool(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """``torch.set_num_threads(1)`` in the detection pool's initializer makes every thread
    that has not set its own count read 1; the worker sets its own before its steps."""
    wanted = 2
    with ThreadPoolExecutor(1, initializer=_one_torch_thread) as pool:
        pool.submit(lambda: None).result()  # the initializer ran
        seen: list[int] = []
        probe = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        probe.start()
        probe.join()
        assert seen == [1]  # the leak the worker must not inherit

        async def scenario() -> None:
            worker = GenerationWorker(tiny_loaded, 1, 1, threads=wanted)
            try:
                job = worker.submit(
                    [1, 2], SamplerConfig("basic-uwm", max_new_tokens=3), _source(0), None
                )
                await asyncio.wait_for(job.result(), 30)
                pool.submit(_one_torch_thread).result()  # the pool sets 1 again, later
                again = worker.submit(
                    [1, 2], SamplerConfig("basic-uwm", max_new_tokens=3), _source(1), None
                )
                await asyncio.wait_for(again.result(), 30)
                assert worker.step_threads == wanted
            finally:
                worker.close()

        asyncio.run(scenario())


def _parse_sse(body: str) -> list[tuple[str, dict[str, object]]]:
    import json

    events = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_concurrent_streams_over_http_each_get_their_own_tokens(live, tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """Four SSE streams at once through a live server, batched in the worker: each stream's
    deltas are exactly its own non-streamed response (same key and nonce), and the batch-size
    gauge is served. The tiny model runs in float64: in float32 a batched forward rounds the
    last bits differently from a solo one, and over ~1,250 tokens a near-tie of the race
    flipped once (a fresh-clone CI run here)."""
    import httpx

    svc = live(_wide(tiny_loaded), generation_batch=4)
    key_id = svc.create_key()
    bodies = [
        {
            "key_id": key_id,
            "prompt": f"Tell story number {i}.",
            "max_new_tokens": 300 + 7 * i,
            "nonce": 77 + i,
            "method": ["mpfr", "basic-uwm", "pfr", "mpfr"][i],
            "drafter": "self:1",
            "drafts": 1 + i,
            "lookahead": 2 + i % 2,
        }
        for i in range(4)
    ]
    streamed: dict[int, str] = {}
    start = threading.Barrier(4)

    def stream(i: int) -> None:
        with httpx.Client(base_url=str(svc.client.base_url), timeout=120) as client:
            start.wait(30)
            r = client.post("/v1/generate", json={**bodies[i], "stream": True}, headers=svc.admin)
            assert r.status_code == 200, r.text
            streamed[i] = r.text

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(streamed) == [0, 1, 2, 3]
    worker = svc.resources.worker
    assert worker.peak_active >= 2  # they stepped together
    for i, body in enumerate(bodies):
        plain = svc.client.post("/v1/generate", json=body, headers=svc.admin).json()
        events = _parse_sse(streamed[i])
        ids = [t for name, data in events if name == "delta" for t in data["token_ids"]]  # type: ignore[attr-defined]
        assert ids == plain["token_ids"], i
        assert events[-1][0] == "done" and events[-1][1]["token_ids"] == plain["token_ids"]
    metrics = svc.client.get("/metrics", headers=svc.admin).text
    assert "poissonmark_generation_batch_size 0.0" in metrics


def test_a_failed_joint_prefill_fails_only_its_culprit(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """Three jobs join together and their joint prefill fails because of one of them: each is
    tried alone, so only that one gets the error and the other two finish."""
    gate, gated = threading.Event(), threading.Event()
    poison = [6, 6, 6]

    class Held(GenerationWorker):
        def _join(self, joining):  # type: ignore[no-untyped-def]
            if any(job.prompt == [1, 2] for job, _ in joining):  # the first job holds the thread
                gated.set()
                gate.wait(30)
            super()._join(joining)

    async def scenario() -> None:
        worker = Held(tiny_loaded, 4, 1, max_batch=4)
        real = worker._batch.add_many
        sizes: list[int] = []

        def add_many(requests, eos):  # type: ignore[no-untyped-def]
            sizes.append(len(requests))
            if any(prompt == poison for prompt, *_ in requests):
                raise InvalidInput("prompt", "refused by the test")
            return real(requests, eos)

        worker._batch.add_many = add_many  # type: ignore[method-assign]
        short = SamplerConfig("basic-uwm", max_new_tokens=3)
        try:
            first = worker.submit([1, 2], short, _source(0), None)
            assert await asyncio.to_thread(gated.wait, 30)
            jobs = [worker.submit(p, short, _source(i), None)
                    for i, p in enumerate(([3, 4], poison, [5, 7]), 1)]  # fmt: skip
            assert worker.waiting == 3
            gate.set()
            outcomes = [await _collect(job) for job in (first, *jobs)]
        finally:
            gate.set()
            worker.close()
        kinds = [type(event).__name__ for _, event in outcomes]
        assert sizes == [1, 3, 1, 1, 1], sizes  # together, then each alone
        assert kinds == ["Finished", "Finished", "Failed", "Finished"], kinds
        failed = outcomes[2][1]
        assert isinstance(failed, Failed) and "refused by the test" in str(failed.error)

    asyncio.run(scenario())
