"""The generation worker's fair share across tenants and its deadline, on the real worker and a
tiny random Llama (docs/design.md §5): a free slot goes to the waiting tenant holding the fewest
slots, so one tenant's burst cannot hold another's job behind it; a full queue makes room for a
tenant holding fewer entries by refusing the largest holder's newest; with one tenant the order
stays FIFO; a job past its deadline fails with ``DeadlineExceeded`` and frees its slot."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig
from sampler.drafters import Drafter
from sampler.models import LoadedModel
from service.errors import DeadlineExceeded, QueueFull
from service.jobs.worker import Failed, GenerationWorker, Job
from tests.service.conftest import slowed

SHORT = SamplerConfig("basic-uwm", max_new_tokens=6)  # one token per step: equal lengths
LONG = SamplerConfig("basic-uwm", max_new_tokens=10_000)


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret(bytes([i % 250 + 1]) * 32), 4, True, 2000 + i)


class Recording(GenerationWorker):
    """The real worker, recording the tenant and prompt of every job it admits, in order;
    the first admission holds the worker thread until ``release`` is set (so the queue can be
    filled while one job is in the batch)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.started: list[tuple[str, int]] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        super().__init__(*args, **kwargs)

    def _join(self, joining: list[tuple[Job, Drafter | None]]) -> None:
        if not self.holding.is_set():
            self.holding.set()
            self.release.wait(30)
        self.started.extend((job.tenant, job.prompt[0]) for job, _ in joining)
        super()._join(joining)


async def _held(worker: Recording, tenant: str) -> Job:
    """Submit ``tenant``'s first job and wait until the worker holds it in its first join."""
    first = worker.submit([1, 2], SHORT, _source(0), None, tenant=tenant)
    while not worker.holding.is_set():
        await asyncio.sleep(0.005)
    return first


def _finish(jobs: list[Job]) -> asyncio.Future[list[object]]:
    return asyncio.gather(*(asyncio.wait_for(j.result(), 60) for j in jobs))


def test_one_tenants_burst_does_not_hold_anothers_job(tiny_loaded: LoadedModel) -> None:
    """Two slots. Tenant A's first job is in the batch and 11 more of A's wait when B's one
    job comes: B takes the very next free slot (FIFO would start all 12 of A's first). Both
    then queue: B's next three jobs start in the first 8 admissions after it arrived, half of
    them (its equal share of the two slots)."""

    async def scenario() -> list[tuple[str, int]]:
        worker = Recording(slowed(tiny_loaded, 0.0), 32, 1, max_batch=2)
        try:
            jobs = [await _held(worker, "A")]
            jobs += [
                worker.submit([10 + i, 2], SHORT, _source(i), None, tenant="A") for i in range(11)
            ]
            jobs += [worker.submit([100, 2], SHORT, _source(50), None, tenant="B")]
            jobs += [
                worker.submit([101 + i, 2], SHORT, _source(60 + i), None, tenant="B")
                for i in range(3)
            ]
            assert worker.waiting == 15
            worker.release.set()
            await _finish(jobs)
            return worker.started
        finally:
            worker.release.set()
            worker.close()

    started = asyncio.run(scenario())
    tenants = [tenant for tenant, _ in started]
    assert len(tenants) == 16
    assert tenants[1] == "B"  # the first free slot after B came (A's first job held the other)
    assert tenants[1:9].count("B") == 4, tenants  # half of the slots while both wait
    # each tenant's own jobs start in its submission order
    assert [p for t, p in started if t == "A"] == [1, *range(10, 21)]
    assert [p for t, p in started if t == "B"] == [100, 101, 102, 103]


def test_one_tenant_keeps_fifo(tiny_loaded: LoadedModel) -> None:
    """Jobs of one tenant start in the order they were submitted (FIFO)."""

    async def scenario() -> list[tuple[str, int]]:
        worker = Recording(slowed(tiny_loaded, 0.0), 16, 1, max_batch=3)
        try:
            jobs = [await _held(worker, "")]
            jobs += [worker.submit([10 + i, 2], SHORT, _source(i), None) for i in range(9)]
            worker.release.set()
            await _finish(jobs)
            return worker.started
        finally:
            worker.release.set()
            worker.close()

    assert [p for _, p in asyncio.run(scenario())] == [1, *range(10, 19)]


def test_a_full_queue_makes_room_for_a_tenant_with_fewer_entries(
    tiny_loaded: LoadedModel,
) -> None:
    """One slot, four queue entries, all A's: A's next job is refused (503 + Retry-After),
    but B's is taken in place of A's newest waiting job, which fails with ``QueueFull``. B's
    second job gets in too (A still holds 3 entries to its 1), a third does not (2 and 2)."""

    async def scenario() -> None:
        worker = Recording(slowed(tiny_loaded, 0.0), 4, 7, max_batch=1)
        try:
            first = await _held(worker, "A")
            queued = [
                worker.submit([10 + i, 2], SHORT, _source(i), None, tenant="A") for i in range(4)
            ]
            with pytest.raises(QueueFull):
                worker.submit([20, 2], SHORT, _source(20), None, tenant="A")
            b1 = worker.submit([100, 2], SHORT, _source(50), None, tenant="B")
            evicted = await asyncio.wait_for(queued[3].events.get(), 5)
            assert isinstance(evicted, Failed) and isinstance(evicted.error, QueueFull)
            assert evicted.error.retry_after_s == 7
            b2 = worker.submit([101, 2], SHORT, _source(51), None, tenant="B")
            evicted = await asyncio.wait_for(queued[2].events.get(), 5)
            assert isinstance(evicted, Failed) and isinstance(evicted.error, QueueFull)
            with pytest.raises(QueueFull):
                worker.submit([102, 2], SHORT, _source(52), None, tenant="B")
            assert worker.waiting == 4
            worker.release.set()
            await _finish([first, *queued[:2], b1, b2])
            assert [p for _, p in worker.started] == [1, 100, 10, 101, 11]
        finally:
            worker.release.set()
            worker.close()

    asyncio.run(scenario())


def test_a_job_past_its_deadline_fails_and_frees_its_slot(tiny_loaded: LoadedModel) -> None:
    """One slot; a long job with a 0.5 s deadline runs (each forward sleeps 20 ms): its result
    is ``DeadlineExceeded`` after about 0.5 s, the worker drops it within a step or two, and the
    next job runs. A queued job whose deadline passed before a slot freed never starts."""
    loaded = slowed(tiny_loaded, 0.02)

    async def scenario() -> None:
        worker = GenerationWorker(loaded, 4, 1, max_batch=1)
        try:
            began = time.monotonic()
            late = worker.submit([1, 2], LONG, _source(0), None, tenant="A", deadline_s=0.5)
            with pytest.raises(DeadlineExceeded) as exceeded:
                await asyncio.wait_for(late.result(), 30)
            assert 0.5 <= time.monotonic() - began < 5
            assert (exceeded.value.setting, exceeded.value.limit_s) == (
                "generation_deadline_s",
                0.5,
            )
            while worker.active:  # the slot frees at the next step
                assert time.monotonic() - began < 10
                await asyncio.sleep(0.01)
            after = worker.submit([3, 4], SHORT, _source(1), None, tenant="A")
            assert len((await asyncio.wait_for(after.result(), 30)).result.token_ids) == 6
            # a job that waits past its deadline never starts
            blocker = worker.submit([5, 6], LONG, _source(2), None, tenant="A")
            while not worker.active:
                await asyncio.sleep(0.01)
            queued = worker.submit([7, 8], SHORT, _source(3), None, tenant="B", deadline_s=0.3)
            with pytest.raises(DeadlineExceeded):
                await asyncio.wait_for(queued.result(), 30)
            blocker.cancel()
            final = await asyncio.wait_for(queued.events.get(), 30)  # the worker's own verdict
            assert isinstance(final, Failed)  # never a Tokens event: it did not start
        finally:
            worker.close()

    asyncio.run(scenario())
