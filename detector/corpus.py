"""Corpus detection: many texts under one key, optionally over worker processes (docs/design.md §4).

``detect_many`` runs ``detect`` on every item of an iterable and yields one ``CorpusResult``
per item, in input order. With ``workers > 1`` the items go, in chunks, to a pool of worker
processes (``spawn`` start method: no inherited threads or locks from the caller). Each worker
receives the tokenizer, the keyed source and the options once, pickled through its start-up
pipe — the ``Secret`` pickles by value (``Secret.__reduce__``) and never appears in a log, a
traceback or a result (its ``repr`` is a placeholder). At most ``2·workers`` chunks are in
flight, so the input is consumed lazily and memory stays bounded on large corpora.

An item whose input is invalid (e.g. a token id outside the vocabulary) yields a result with
``error`` set instead of stopping the run; anything else is a bug and propagates.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final

import keyed
from detector.detect import DEFAULT_OPTIONS, check_options, detect_readings, read_input
from detector.errors import DetectorError
from detector.evidence import Detection
from detector.options import DetectOptions
from detector.tokens import Tokenizer
from keyed import KeyedSource

MAX_WORKERS: Final = 256
DEFAULT_CHUNK_SIZE: Final = 8


@dataclass(frozen=True)
class CorpusItem:
    """One input of ``detect_many``: an id and a text, exact token ids, or both."""

    id: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class CorpusResult:
    """The outcome for one item: its detection, or the input error that prevented it.

    Attributes:
        id: the item's id (its index as a string for plain-text items).
        detection: the result, or None when ``error`` is set.
        error: the input error's message, or None.
    """

    id: str
    detection: Detection | None
    error: str | None

    def __post_init__(self) -> None:
        if (self.detection is None) == (self.error is None):
            raise ValueError("expected exactly one of detection or error")

    def to_json(self) -> dict[str, Any]:
        """``{"id", **detection JSON}`` or ``{"id", "error"}``."""
        if self.detection is None:
            return {"id": self.id, "error": self.error}
        return {"id": self.id, **self.detection.to_json()}


@dataclass(frozen=True)
class _Job:
    """What every item of a run shares (pickled once into each worker)."""

    tokenizer: Tokenizer
    source: KeyedSource
    options: DetectOptions

    def run(self, item: CorpusItem) -> CorpusResult:
        try:
            read = read_input(self.tokenizer, item.text, item.token_ids)
            special = frozenset(int(i) for i in self.tokenizer.all_special_ids)
            detection = detect_readings(read, special, self.source, self.options)
        except (ValueError, DetectorError) as exc:
            return CorpusResult(item.id, None, str(exc))
        return CorpusResult(item.id, detection, None)


# The worker process's job, set once by the pool initializer (one per process, never shared).
_WORKER_JOB: _Job | None = None


def _init_worker(job: _Job) -> None:
    global _WORKER_JOB
    # Detection needs no torch (only keyed.tensor, the sampler's path, imports it): a worker
    # that has it anyway runs one intra-op thread, one process per core.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    keyed.warm_up()  # compile or load the keyed kernels before the first chunk arrives
    _WORKER_JOB = job


def _run_chunk(items: list[CorpusItem]) -> list[CorpusResult]:
    assert _WORKER_JOB is not None, "worker used before its initializer ran"
    return [_WORKER_JOB.run(item) for item in items]


def _as_item(index: int, item: str | CorpusItem) -> CorpusItem:
    if isinstance(item, CorpusItem):
        return item
    if isinstance(item, str):
        return CorpusItem(str(index), text=item)
    raise ValueError(f"expected items to be strings or CorpusItem, got {type(item).__name__}")


def detect_many(
    tokenizer: Tokenizer,
    source: KeyedSource,
    items: Iterable[str | CorpusItem],
    *,
    options: DetectOptions = DEFAULT_OPTIONS,
    workers: int = 1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[CorpusResult]:
    """Detect the key's watermark in every item, in input order.

    Args:
        tokenizer: the key's tokenizer (checked by the caller with ``check_tokenizer``); must
            pickle when ``workers > 1`` (Hugging Face fast tokenizers do).
        source: the key's keyed source.
        items: texts (ids ``"0"``, ``"1"``, …) or ``CorpusItem``s; consumed lazily.
        workers: processes, 1..256; 1 runs in this process (no pool).
        chunk_size: items per task sent to a worker, >= 1.
        options: as ``detect``, for every item.
    Yields:
        one ``CorpusResult`` per item, in input order; per-item input errors are results.
    Raises:
        ValueError: invalid options (checked before any item is read), or an item that is
            neither a string nor a ``CorpusItem``.
    """
    check_options(options)
    if not isinstance(source, KeyedSource):
        raise ValueError(f"expected source to be a KeyedSource, got {type(source).__name__}")
    limits = (("workers", workers, MAX_WORKERS), ("chunk_size", chunk_size, 10**6))
    for name, value, limit in limits:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ValueError(f"expected {name} an int in [1, {limit}], got {value!r}")
    job = _Job(tokenizer, source, options)
    return _serial(job, items) if workers == 1 else _parallel(job, items, workers, chunk_size)


def _serial(job: _Job, items: Iterable[str | CorpusItem]) -> Iterator[CorpusResult]:
    for index, item in enumerate(items):
        yield job.run(_as_item(index, item))


def _chunks(items: Iterable[str | CorpusItem], size: int) -> Iterator[list[CorpusItem]]:
    numbered = (_as_item(i, item) for i, item in enumerate(items))
    while chunk := list(islice(numbered, size)):
        yield chunk


def _parallel(
    job: _Job, items: Iterable[str | CorpusItem], workers: int, chunk_size: int
) -> Iterator[CorpusResult]:
    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(workers, context, _init_worker, (job,)) as pool:
        pending: deque[cf.Future[list[CorpusResult]]] = deque()
        for chunk in _chunks(items, chunk_size):
            pending.append(pool.submit(_run_chunk, chunk))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
