"""The generation worker: one thread that owns the model, fed by a bounded queue, stepping
every active request together (continuous batching; docs/design.md §5).

Glossary:
- **job**: one generation request: prompt ids, ``SamplerConfig``, keyed source, drafter spec.
  Its events (``Tokens`` per decoding step, then ``Finished`` or ``Failed``) reach the event
  loop through an ``asyncio.Queue`` fed with ``call_soon_threadsafe``; each job's queue gets
  only its own tokens.
- **queue**: jobs waiting for a slot, at most ``queue_size``; one more is refused at once
  with ``QueueFull`` (the route answers 503 + Retry-After) instead of piling up latency.
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
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import torch

from keyed import KeyedSource
from sampler.batch import Batch, Member
from sampler.completion import eos_ids
from sampler.decoder import GenerationResult, SamplerConfig
from sampler.drafters import Drafter, fresh_drafter, make_drafter
from sampler.models import LoadedModel
from service.errors import (
    INTERNAL,
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
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop the job at its next step (idempotent; a finished job ignores it)."""
        self.cancelled.set()

    def _post(self, event: Event) -> None:
        if not isinstance(event, Tokens):
            self.ended.set()
        # At shutdown the loop may be closed: nobody is listening any more then.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def result(self) -> Finished:
        """Wait for the end; the tokens events are skipped. Raises the job's error."""
        while True:
            event = await self.events.get()
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
        self._queue: queue.Queue[Job | object] = queue.Queue(maxsize=queue_size)
        self._eos = eos_ids(loaded)
        self._drafters: dict[str, Drafter] = {}
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
        return self._queue.qsize()

    @property
    def active(self) -> int:
        """Jobs in the batch (started, not finished)."""
        return len(self._active)

    def submit(
        self, prompt: list[int], config: SamplerConfig, source: KeyedSource, drafter: str | None
    ) -> Job:
        """Queue a job (call from the event loop). Raises ``QueueFull`` or ``NotReady``."""
        if not self.alive:
            raise NotReady("the generation worker is stopped")
        job = Job(prompt, config, source, drafter, asyncio.get_running_loop())
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(self.queue_size, self.retry_after_s) from None
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
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, Job):
                job.cancel()
                job._post(Failed(GenerationCancelled()))
        for active in list(self._active):
            active.cancel()
        self._queue.put(_STOP)
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
        while len(self._batch.members) + len(joining) < self.max_batch:
            try:
                job = self._queue.get(block=not (self._batch.members or joining))
            except queue.Empty:
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
            try:
                drafter = self._drafter(job.drafter) if job.config.speculative else None
                self._batch.check(job.prompt, job.config, drafter)
            except Exception as exc:  # every failure goes back to its caller
                self._fail(job, exc)
                continue
            joining.append((job, drafter))
        self._join(joining)
        return True

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
        """This job's own drafter: a fresh instance of the spec's (built once per spec)."""
        if spec is None:
            raise ValueError("drafter: a speculative method needs one (ngram, heads or self:N)")
        if spec not in self._drafters:
            try:
                self._drafters[spec] = make_drafter(spec, self.loaded.target)
            except ValueError as exc:  # make_drafter's check of the spec (e.g. self:N too deep)
                raise InvalidInput("drafter", str(exc)) from None
        return fresh_drafter(self._drafters[spec])
