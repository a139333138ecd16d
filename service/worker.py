"""The generation worker: one thread that owns the model, fed by a bounded queue (DESIGN §5).

Glossary:
- **job**: one generation request: prompt ids, ``SamplerConfig``, keyed source, drafter spec.
  Its events (``Tokens`` per decoding step, then ``Finished`` or ``Failed``) reach the event
  loop through an ``asyncio.Queue`` fed with ``call_soon_threadsafe``.
- **queue**: jobs waiting for the worker, at most ``queue_size``; one more is refused at once
  with ``QueueFull`` (the route answers 503 + Retry-After) instead of piling up latency.
- **cancel**: a job's flag, set when its client disconnects (or the service stops). The
  decoder's per-step callback checks it and raises ``GenerationCancelled``, so a cancelled job
  stops within one step; a job cancelled while queued never starts.

The model is used from this one thread only: no locks around torch, one generation at a time
(batching requests is future work). Drafters are built once per spec and reused; each
``start()`` forgets the previous request.
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

from keyed import KeyedSource
from sampler.completion import eos_ids
from sampler.decoder import GenerationResult, SamplerConfig, generate
from sampler.drafters import Drafter, make_drafter
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

    def _on_tokens(self, ids: list[int]) -> None:
        if self.cancelled.is_set():
            raise GenerationCancelled()
        self._post(Tokens(list(ids)))

    async def result(self) -> Finished:
        """Wait for the end; the tokens events are skipped. Raises the job's error."""
        while True:
            event = await self.events.get()
            if isinstance(event, Finished):
                return event
            if isinstance(event, Failed):
                raise event.error


class GenerationWorker:
    """Runs jobs one at a time on a thread that owns ``loaded``'s model.

    Args:
        loaded: the model and tokenizer (the worker only reads the model).
        queue_size: jobs that may wait; more raises ``QueueFull``.
        retry_after_s: the Retry-After a refusal suggests.
        on_finished: called on the worker thread after each successful job (metrics).
        on_waiting: called with the number of waiting jobs whenever it changes (metrics).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        queue_size: int,
        retry_after_s: int,
        on_finished: Callable[[GenerationResult], None] | None = None,
        on_waiting: Callable[[int], None] | None = None,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size: expected >= 1, got {queue_size}")
        self.loaded = loaded
        self.queue_size = queue_size
        self.retry_after_s = retry_after_s
        self._on_finished = on_finished
        self._on_waiting = on_waiting
        self._waiting_lock = threading.Lock()
        self._queue: queue.Queue[Job | object] = queue.Queue(maxsize=queue_size)
        self._eos = eos_ids(loaded)
        self._drafters: dict[str, Drafter] = {}
        self._current: Job | None = None
        self._thread = threading.Thread(target=self._run, name="generation-worker", daemon=True)
        self._closed = False
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    @property
    def waiting(self) -> int:
        """Jobs in the queue (not counting the one running)."""
        return self._queue.qsize()

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

    def close(self, timeout: float = 30.0) -> None:
        """Cancel queued jobs and the running one, stop the thread and wait for it."""
        self._closed = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, Job):
                job.cancel()
                job._post(Failed(GenerationCancelled()))
        if self._current is not None:
            self._current.cancel()
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            assert isinstance(job, Job)
            self._waiting_changed()
            if job.cancelled.is_set() or self._closed:
                job._post(Failed(GenerationCancelled()))
                continue
            self._current = job
            try:
                event: Event = self._generate(job)
            except Exception as exc:  # every failure goes back to its caller
                if problem_for(exc) is INTERNAL:  # a bug: the traceback is for the log only
                    log.error("generation failed: %s", type(exc).__name__, exc_info=exc)
                event = Failed(exc)
            finally:
                self._current = None
            if isinstance(event, Finished) and self._on_finished is not None:
                self._on_finished(event.result)
            job._post(event)

    def _generate(self, job: Job) -> Finished:
        drafter = self._drafter(job.drafter) if job.config.speculative else None
        result = generate(
            self.loaded.model,
            job.prompt,
            job.config,
            job.source,
            drafter,
            self._eos,
            on_tokens=job._on_tokens,
        )
        return Finished(result, drafter.name if drafter is not None else None)

    def _drafter(self, spec: str | None) -> Drafter:
        if spec is None:
            raise ValueError("drafter: a speculative method needs one (ngram, heads or self:N)")
        if spec not in self._drafters:
            try:
                self._drafters[spec] = make_drafter(spec, self.loaded.model)
            except ValueError as exc:  # make_drafter's check of the spec (e.g. self:N too deep)
                raise InvalidInput("drafter", str(exc)) from None
        return self._drafters[spec]
