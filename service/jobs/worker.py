"""The generation worker: one thread that owns the model, fed by a bounded queue, stepping
every active request together (continuous batching; docs/design.md §5).

Glossary:
- **job**: one generation request: prompt ids, ``SamplerConfig``, keyed source, drafter spec.
  Its events (``Tokens`` per decoding step for a streamed job, then ``Finished`` or
  ``Failed``) reach the event loop through an ``asyncio.Queue`` fed with
  ``call_soon_threadsafe``; each job's queue gets only its own tokens.
- **tenant**: whose job it is (the API token's tenant). Waiting jobs queue per tenant.
- **queue**: jobs waiting for a slot, at most ``queue_size`` in all; one more is refused at
  once with ``QueueFull`` (the route answers 503 + Retry-After) instead of piling up latency.
- **fair share** (docs/design.md §5): a free slot goes to the waiting tenant that holds the
  fewest slots (ties: the tenant served longest ago, round-robin), its oldest job first; so
  while several tenants wait, none holds more than an equal share of the slots that free up.
  When the queue is full, a job of a tenant holding fewer waiting entries than the largest
  holder still gets in: the largest holder's newest waiting job is refused instead
  (``QueueFull``, as if it had come later). With one tenant both rules are plain FIFO.
- **deadline**: seconds a job may take from its submission to its end; past it, waiting for
  the job's next event fails with ``DeadlineExceeded`` and cancels the job, which frees its
  slot at the next step (a queued one never starts).
- **batch**: the active jobs, at most ``max_batch``; every step advances all of them with ONE
  target forward over all their draft trees (``sampler.batch``). Waiting jobs join between
  steps as soon as slots are free (those joining together prefill in one forward); a finished
  one leaves.
- **cancel**: a job's flag, set when its client disconnects (or the service stops). The worker
  checks it before and after every step: a cancelled job leaves the batch (its slot is free for
  the next step) and gets ``GenerationCancelled``; a job cancelled while queued never starts.

The model is used from this one thread only: no locks around torch. Drafters are stateful:
one is built per spec (weights loaded once) and each job gets its own ``fresh_drafter`` of it.

Threads: ``torch.set_num_threads`` in another thread (the detection pool's initializer sets 1)
changes the count every thread that has not set its own reads, this one included; so the
worker sets its own count when it starts and again whenever it finds another one before a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import torch

from keyed import KeyedSource
from sampler.batch import Batch, Member
from sampler.completion import eos_ids
from sampler.decoder import GenerationResult, SamplerConfig
from sampler.drafters import Drafter, default_drafter, fresh_drafter, make_drafter
from sampler.models import LoadedModel
from service.errors import (
    INTERNAL,
    DeadlineExceeded,
    GenerationCancelled,
    InvalidInput,
    NotReady,
    QueueFull,
    problem_for,
)

log = logging.getLogger("poissonmark.worker")

_STOP: Final = object()


@dataclass(frozen=True)
class Tokens:
    """The ids one decoding step emitted (possibly none on the final step)."""

    ids: list[int]


@dataclass(frozen=True)
class Finished:
    result: GenerationResult
    drafter: str | None


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = Tokens | Finished | Failed


@dataclass
class Job:
    """One queued generation and the channel its events come back on."""

    prompt: list[int]
    config: SamplerConfig
    source: KeyedSource
    drafter: str | None
    loop: asyncio.AbstractEventLoop
    tenant: str = ""
    deadline_s: float | None = None
    """Seconds from submission to the end (None: none)."""
    stream: bool = True
    """Whether each step's ``Tokens`` come back; a job that only waits for its end (a
    non-streamed request) gets its final event alone, so its steps never wake the event loop."""
    submitted: float = field(default_factory=time.monotonic)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def expired(self) -> bool:
        return self.deadline_s is not None and time.monotonic() - self.submitted > self.deadline_s

    def cancel(self) -> None:
        """Stop the job at its next step (idempotent; a finished job ignores it)."""
        self.cancelled.set()

    def _post(self, event: Event) -> None:
        if isinstance(event, Tokens):
            if not self.stream:
                return
        else:
            self.ended.set()
        # At shutdown the loop may be closed: nobody is listening any more then.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def next_event(self) -> Event:
        """The job's next event; past the deadline ``Failed(DeadlineExceeded)``, and the job is
        cancelled (its slot frees at the worker's next step)."""
        if self.deadline_s is None:
            return await self.events.get()
        left = self.submitted + self.deadline_s - time.monotonic()
        try:
            return await asyncio.wait_for(self.events.get(), max(left, 0.0))
        except TimeoutError:
            self.cancel()
            return Failed(DeadlineExceeded("generation_deadline_s", self.deadline_s))

    async def result(self) -> Finished:
        """Wait for the end; the tokens events are skipped. Raises the job's error (past the
        deadline ``DeadlineExceeded``)."""
        while True:
            event = await self.next_event()
            if isinstance(event, Finished):
                return event
            if isinstance(event, Failed):
                raise event.error


class GenerationWorker:
    """Runs jobs, up to ``max_batch`` at once, on a thread that owns ``loaded``'s model.

    Args:
        loaded: the model and tokenizer (the worker only reads the model).
        queue_size: jobs that may wait for a slot; more raises ``QueueFull``.
        retry_after_s: the Retry-After a refusal suggests.
        on_finished: called on the worker thread after each successful job (metrics).
        on_waiting: called with the number of waiting jobs whenever it changes (metrics).
        max_batch: jobs stepping together (1: one at a time).
        node_budget: cap on draft-tree nodes per target forward (``sampler.batch.step_many``;
            None: none). Changes no keyed-race output.
        threads: torch threads of the worker; None: 1 on precision gguf (torch's OpenMP team
            slows llama.cpp's forwards), else the count of the constructing thread.
        on_batch: called with the number of active jobs whenever it changes (metrics).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        queue_size: int,
        retry_after_s: int,
        on_finished: Callable[[GenerationResult], None] | None = None,
        on_waiting: Callable[[int], None] | None = None,
        max_batch: int = 8,
        node_budget: int | None = None,
        threads: int | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size: expected >= 1, got {queue_size}")
        if max_batch < 1:
            raise ValueError(f"max_batch: expected >= 1, got {max_batch}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads: expected >= 1, got {threads}")
        self.loaded = loaded
        self.queue_size = queue_size
        self.retry_after_s = retry_after_s
        self.max_batch = max_batch
        self.node_budget = node_budget
        if threads is None:  # precision gguf: one torch thread (``sampler.models.load_model``)
            threads = 1 if loaded.precision == "gguf" else torch.get_num_threads()
        self.threads = threads
        self._on_finished = on_finished
        self._on_waiting = on_waiting
        self._on_batch = on_batch
        self._waiting_lock = threading.Lock()
        self._queued = threading.Condition()  # guards _queues and _stopping
        self._queues: dict[str, deque[Job]] = {}  # per tenant
        self._served: dict[str, int] = {}  # tenant -> number of its latest admission
        self._admissions = 0
        self._stopping = False
        self._eos = eos_ids(loaded)
        self._drafters: dict[str, Drafter] = {}
        self._default_drafter: str | None = None
        self._batch = Batch(loaded.target, node_budget)
        self._active: list[Job] = []
        self._reported_batch = -1
        self.peak_active = 0  # the most jobs that stepped together so far
        self.step_threads = 0  # torch threads of the latest step (tests, /metrics)
        self._thread = threading.Thread(target=self._run, name="generation-worker", daemon=True)
        self._closed = False
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    @property
    def waiting(self) -> int:
        """Jobs in the queue (not counting the active ones)."""
        with self._queued:
            return sum(len(q) for q in self._queues.values())

    @property
    def active(self) -> int:
        """Jobs in the batch (started, not finished)."""
        return len(self._active)

    def submit(
        self,
        prompt: list[int],
        config: SamplerConfig,
        source: KeyedSource,
        drafter: str | None,
        *,
        tenant: str = "",
        deadline_s: float | None = None,
        stream: bool = True,
    ) -> Job:
        """Queue ``tenant``'s job (call from the event loop); ``deadline_s``: seconds it may
        take from now (None: no deadline); ``stream``: post each step's ``Tokens`` (False: the
        final event only). Raises ``QueueFull`` or ``NotReady``."""
        if not self.alive:
            raise NotReady("the generation worker is stopped")
        loop = asyncio.get_running_loop()
        job = Job(prompt, config, source, drafter, loop, tenant, deadline_s, stream)
        refused = QueueFull(self.queue_size, self.retry_after_s)
        with self._queued:
            queues = self._queues
            if sum(len(q) for q in queues.values()) >= self.queue_size:
                mine = len(queues.get(tenant, ()))
                largest = max(queues, key=lambda t: len(queues[t]))
                if len(queues[largest]) <= mine + 1:  # no tenant holds more than its share
                    raise refused
                evicted = queues[largest].pop()  # its newest: as if it had come later
                if not queues[largest]:
                    del queues[largest]
                evicted._post(Failed(refused))
            queues.setdefault(tenant, deque()).append(job)
            self._queued.notify()
        self._waiting_changed()
        return job

    def _waiting_changed(self) -> None:
        # read and report under one lock: the event loop (submit) and the worker thread (get)
        # both call this, and a stale count must never be written after a newer one
        if self._on_waiting is not None:
            with self._waiting_lock:
                self._on_waiting(self.waiting)

    def _batch_changed(self) -> None:
        self.peak_active = max(self.peak_active, len(self._active))
        if self._on_batch is not None and self._reported_batch != len(self._active):
            self._reported_batch = len(self._active)
            self._on_batch(self._reported_batch)

    def close(self, timeout: float = 30.0) -> None:
        """Cancel queued jobs and the active ones, stop the thread and wait for it."""
        self._closed = True
        with self._queued:
            queued = [job for q in self._queues.values() for job in q]
            self._queues.clear()
            self._stopping = True
            self._queued.notify()
        for job in queued:
            job.cancel()
            job._post(Failed(GenerationCancelled()))
        for active in list(self._active):
            active.cancel()
        self._thread.join(timeout)

    def _own_threads(self) -> None:
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def _run(self) -> None:
        self._own_threads()
        while True:
            self._batch_changed()  # before _admit may block: finished jobs left the batch
            if not self._admit():
                self._end(Failed(GenerationCancelled()), list(self._batch.members))
                self._batch_changed()
                return
            self._drop_cancelled()
            self._batch_changed()
            if not self._batch.members:
                continue
            self._own_threads()
            self.step_threads = torch.get_num_threads()
            try:
                stepped = self._batch.step()
            except Exception as exc:  # a failed batched step fails every job in it
                if problem_for(exc) is INTERNAL:  # a bug: the traceback is for the log only
                    log.error("generation failed: %s", type(exc).__name__, exc_info=exc)
                self._end(Failed(exc), list(self._batch.members))
                continue
            for member, ids in stepped:
                job = member.tag
                assert isinstance(job, Job)
                if job.cancelled.is_set():  # its tokens are not sent; it leaves the batch
                    self._end(Failed(GenerationCancelled()), [member])
                    continue
                job._post(Tokens(list(ids)))
                if member.seq.done:
                    result = Batch.result(member)
                    if self._on_finished is not None:
                        self._on_finished(result)
                    drafter = member.seq.drafter
                    self._end(Finished(result, drafter.name if drafter else None), [member])

    def _admit(self) -> bool:
        """Move waiting jobs into free slots (block while nothing is active), their prefills
        in one forward; False at stop."""
        joining: list[tuple[Job, Drafter | None]] = []
        holding = Counter(job.tenant for job in self._active)  # slots per tenant
        while len(self._batch.members) + len(joining) < self.max_batch:
            job = self._next(holding, block=not (self._batch.members or joining))
            if job is None:
                break
            if job is _STOP:
                for waiting, _ in joining:
                    waiting._post(Failed(GenerationCancelled()))
                return False
            assert isinstance(job, Job)
            self._waiting_changed()
            if job.cancelled.is_set() or self._closed:
                job._post(Failed(GenerationCancelled()))
                continue
            if job.expired:  # its client got ``DeadlineExceeded`` (or is about to)
                assert job.deadline_s is not None
                job._post(Failed(DeadlineExceeded("generation_deadline_s", job.deadline_s)))
                continue
            try:
                drafter = self._drafter(job.drafter) if job.config.speculative else None
                self._batch.check(job.prompt, job.config, drafter)
            except Exception as exc:  # every failure goes back to its caller
                self._fail(job, exc)
                continue
            joining.append((job, drafter))
            holding[job.tenant] += 1
        self._join(joining)
        return True

    def _next(self, holding: Counter[str], block: bool) -> Job | object | None:
        """The next waiting job by fair share (module docstring): the oldest of the tenant
        holding the fewest slots in ``holding``, ties to the one served longest ago
        (round-robin); ``_STOP`` at stop; None when nothing waits and ``block`` is False."""
        with self._queued:
            while block and not self._queues and not self._stopping:
                self._queued.wait()
            if self._stopping:
                return _STOP
            if not self._queues:
                return None
            tenant = min(self._queues, key=lambda t: (holding[t], self._served.get(t, -1)))
            waiting = self._queues[tenant]
            job = waiting.popleft()
            if not waiting:
                del self._queues[tenant]
            self._served[tenant] = self._admissions
            self._admissions += 1
            if len(self._served) > 4 * (len(self._queues) + self.max_batch) + 64:
                # forget tenants with nothing waiting (an active one's count is in holding)
                self._served = {t: n for t, n in self._served.items() if t in self._queues}
            return job

    def _join(self, joining: list[tuple[Job, Drafter | None]]) -> None:
        """Prefill the checked jobs together and add them to the batch; where that fails, each
        is tried alone, and only those whose own prefill fails get the error."""
        if not joining:
            return
        requests = [(j.prompt, j.config, j.source, d, j) for j, d in joining]
        failed = False
        try:
            self._batch.add_many(requests, self._eos)
        except Exception as exc:
            if len(joining) == 1:
                self._fail(joining[0][0], exc)
                return
            failed = True  # retried below, once the traceback (the caches it holds) is gone
        if failed:
            for one in joining:  # one job's failure must not fail the others
                self._join([one])
            return
        self._active.extend(job for job, _ in joining)

    @staticmethod
    def _fail(job: Job, exc: Exception) -> None:
        if problem_for(exc) is INTERNAL:  # a bug: the traceback is for the log only
            log.error("generation failed: %s", type(exc).__name__, exc_info=exc)
        job._post(Failed(exc))

    def _drop_cancelled(self) -> None:
        gone = [
            m
            for m in self._batch.members
            if self._closed or (isinstance(m.tag, Job) and m.tag.cancelled.is_set())
        ]
        self._end(Failed(GenerationCancelled()), gone)

    def _end(self, event: Event, members: list[Member]) -> None:
        for member in members:
            if member in self._batch.members:
                self._batch.remove(member)
            job = member.tag
            assert isinstance(job, Job)
            if job in self._active:
                self._active.remove(job)
            job._post(event)

    def _drafter(self, spec: str | None) -> Drafter:
        """This job's own drafter: a fresh instance of the spec's (built once per spec); no spec
        means the served model's default (``sampler.drafters.default_drafter``)."""
        if spec is None:
            if self._default_drafter is None:
                default = default_drafter(self.loaded.target, self.loaded.data_dir)
                self._drafters.setdefault(default.name, default)
                self._default_drafter = default.name
            spec = self._default_drafter
        if spec not in self._drafters:
            try:
                self._drafters[spec] = make_drafter(spec, self.loaded.target, self.loaded.data_dir)
            except ValueError as exc:  # make_drafter's check of the spec (e.g. self:N too deep)
                raise InvalidInput("drafter", str(exc)) from None
        return fresh_drafter(self._drafters[spec])
