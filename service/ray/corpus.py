"""Corpus detection on Ray Data: ``poissonmark detect --jsonl IN --output OUT --engine ray``.

The same input and output as ``service.jobs.corpus`` (one result line per input line, in input
order, resumable), with the work spread over a Ray cluster:

- **read**: ``CorpusLines``, a Ray Data datasource, cuts the file into byte ranges at line
  ends and reads each range in a task on the driver's node (the file need exist only there);
  a range is split into lines as Python's text files split them (universal newlines), so the
  lines are those ``read_corpus`` sees.
- **detect**: ``map_batches`` over a pool of ``CorpusDetector`` actors (``workers`` of them,
  one CPU each, spread over the nodes); each actor receives the tokenizer, the key's keyed
  source, the options and the ids already done once, at construction (pickled by Ray: the
  ``Secret`` travels by value, as to ``detect_many``'s processes — run it on a cluster you
  trust as you trust this host), warms the keyed kernels, then parses and detects its batches
  with ``detector.detect_many`` (serial, in the actor).
- **write**: the driver streams the results back in input order (``preserve_order``) and
  writes and flushes each line before the next, as the local engine does.

Faults: a killed actor or node is Ray Data's to recover (actors restart, their tasks retry;
blocks are read again from the file); the output is only appended in order by the driver, so
nothing is lost or written twice. If the driver itself dies, a rerun resumes from the output
(``done_ids``), like the local engine.

Needs the ``ray`` extra (``pip install 'poissonmark[ray]'``) on the driver and on every node,
with this package importable there; nothing in the default import path imports this module.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import ray
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

import keyed
from detector import CorpusItem, DetectOptions, Tokenizer, detect_many
from keyed import KeyedSource
from service.jobs.corpus import (
    CorpusCounts,
    CorpusLine,
    done_ids,
    line_error_line,
    parse_line,
    result_line,
)

RANGE_BYTES: Final = 1 << 20
"""Bytes of input per read task (at least; ranges end at a line end)."""
LINES_PER_BLOCK: Final = 32
"""Input lines per Ray Data block a read task yields: an actor task takes a block and returns
its results at once, so this is the granularity of progress, retries and ordering waits."""
DEFAULT_BATCH_SIZE: Final = 8
"""Lines per ``map_batches`` call of a detector actor (the local engine's chunk size)."""
LOCAL_OBJECT_STORE_BYTES: Final = 128 * 1024 * 1024
"""Object store of the one-node Ray the driver starts when no ``address`` is given."""

# Row kinds a detector actor returns, one per input line.
_BLANK, _SKIPPED, _INVALID, _ERROR = "blank", "skipped", "invalid", "error"
_DETECTED, _WATERMARKED = "detected", "watermarked"


def line_ranges(path: Path, target_bytes: int = RANGE_BYTES) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges covering ``path``, each ending just after a ``\\n`` (or at
    the end of the file), about ``target_bytes`` each (ValueError if not >= 1)."""
    if target_bytes < 1:
        raise ValueError(f"target_bytes: expected an int >= 1, got {target_bytes!r}")
    size = path.stat().st_size
    cuts = [0]
    with path.open("rb") as f:
        while cuts[-1] < size:
            f.seek(min(cuts[-1] + target_bytes, size) - 1)
            f.readline()  # to just after the next newline (a "\r\n" is never split)
            cuts.append(min(f.tell(), size))
    return list(itertools.pairwise(cuts))


def read_range(
    path: str, start: int, end: int, lines_per_block: int = LINES_PER_BLOCK
) -> Iterator[pa.Table]:
    """The lines of ``path[start:end]`` as ``{"line": str}`` tables of ``lines_per_block``
    rows, blank lines included, split and newline-translated as ``open(path)`` iterates (a
    range starts at a line start, so the lines are the file's)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    lines: list[str] = []
    for line in io.StringIO(data.decode("utf-8"), newline=None):
        lines.append(line)
        if len(lines) == lines_per_block:
            yield pa.table({"line": pa.array(lines, pa.string())})
            lines = []
    if lines:
        yield pa.table({"line": pa.array(lines, pa.string())})


class CorpusLines(Datasource):
    """A corpus file as a Ray Data dataset of ``{"line"}`` rows in file order (read tasks on
    the driver's node)."""

    def __init__(self, path: Path, range_bytes: int = RANGE_BYTES) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.path = path.resolve()
        self.range_bytes = range_bytes

    @property
    def supports_distributed_reads(self) -> bool:
        return False  # the file is on the driver's node

    def estimate_inmemory_data_size(self) -> int:
        return self.path.stat().st_size

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        tasks = []
        for start, end in line_ranges(self.path, self.range_bytes):
            metadata = BlockMetadata(
                num_rows=None,
                size_bytes=end - start,
                exec_stats=None,
                input_files=(str(self.path),),
            )
            read = functools.partial(read_range, str(self.path), start, end)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks


class CorpusDetector:
    """A Ray Data actor: input lines in, one ``{"kind", "out"}`` row per line out.

    ``out`` is the output line for a detector result (``result_line``), the JSON
    ``{"id", "error"}`` of an invalid line (the driver adds its line number), or empty for a
    blank line and a line whose id is in ``done``.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        source: KeyedSource,
        options: DetectOptions,
        tokens: bool,
        done: frozenset[str],
    ) -> None:
        torch = sys.modules.get("torch")  # detection needs none; one thread if it is there
        if torch is not None:
            torch.set_num_threads(1)
        keyed.warm_up()  # compile or load the keyed kernels once, before the first batch
        self.tokenizer, self.source, self.options = tokenizer, source, options
        self.tokens, self.done = tokens, done

    def __call__(self, batch: pa.Table) -> pa.Table:
        kinds: list[str] = []
        outs: list[str] = []
        items: list[CorpusItem] = []
        slots: list[int] = []
        for index, line in enumerate(batch.column("line").to_pylist()):
            kind, out = self._line(line)
            if kind == "":
                parsed = parse_line(0, line)
                assert parsed.item is not None
                items.append(parsed.item)
                slots.append(index)
            kinds.append(kind)
            outs.append(out)
        results = detect_many(self.tokenizer, self.source, items, options=self.options)
        for slot, result in zip(slots, results, strict=True):
            if result.detection is None:
                kinds[slot] = _ERROR
            else:
                watermarked = result.detection.verdict.value == "watermarked"
                kinds[slot] = _WATERMARKED if watermarked else _DETECTED
            outs[slot] = result_line(result, self.tokens)
        return pa.table({"kind": pa.array(kinds, pa.string()), "out": pa.array(outs, pa.string())})

    def _line(self, line: str) -> tuple[str, str]:
        """``(kind, out)`` for a line that needs no detector, ``("", "")`` for an item."""
        if not line.strip():
            return _BLANK, ""
        parsed = parse_line(0, line)
        if parsed.id is not None and parsed.id in self.done:
            return _SKIPPED, ""
        if parsed.item is None:
            return _INVALID, json.dumps({"id": parsed.id, "error": parsed.error})
        return "", ""


def connect(address: str | None, num_cpus: int) -> bool:
    """Join the cluster at ``address`` ("auto", host:port, ray://…), or start a one-node Ray
    in this process with ``num_cpus`` CPUs and a small object store (``address`` None).
    Returns whether this call started Ray (the caller then shuts it down)."""
    if ray.is_initialized():
        return False
    if address is None:
        ray.init(
            num_cpus=num_cpus,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            include_dashboard=False,
            log_to_driver=False,
        )
    else:
        ray.init(address=address, log_to_driver=False)
    return True


def detect_corpus_ray(
    tokenizer: Tokenizer,
    source: KeyedSource,
    corpus: Path,
    output: Path | None,
    options: DetectOptions,
    *,
    workers: int = 1,
    tokens: bool = True,
    on_line: Callable[[], None] | None = None,
    address: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    range_bytes: int = RANGE_BYTES,
) -> CorpusCounts:
    """``service.jobs.corpus.detect_corpus`` on Ray Data: the same output file, line for line.

    Args:
        tokenizer, source, corpus, output, options, tokens, on_line: as ``detect_corpus``.
        workers: detector actors (one CPU each), 1..256.
        address: the Ray cluster (``connect``); None starts a one-node Ray here.
        batch_size: input lines per actor call, >= 1.
        range_bytes: input bytes per read task, >= 1.
    Returns:
        the counts by outcome.
    Raises:
        ValueError: invalid options, workers or batch size (before Ray is started).
    """
    detect_many(tokenizer, source, [], options=options)  # checks options and source now
    for name, value, limit in (("workers", workers, 256), ("batch_size", batch_size, 10**6)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ValueError(f"expected {name} an int in [1, {limit}], got {value!r}")
    done = frozenset(done_ids(output)) if output is not None else frozenset()
    if corpus.stat().st_size == 0:  # no read task to run; the output exists, as locally
        if output is not None:
            output.touch()
        return CorpusCounts()
    started = connect(address, workers)
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # results in input order
        context.enable_progress_bars = False  # the CLI draws its own
        # one read task at a time, in file order, taking no CPU from the detectors (which are
        # the bottleneck; Ray Data's backpressure bounds how far the read runs ahead)
        dataset = ray.data.read_datasource(
            CorpusLines(corpus, range_bytes), num_cpus=0, concurrency=1
        ).map_batches(
            CorpusDetector,
            fn_constructor_kwargs={
                "tokenizer": tokenizer,
                "source": source,
                "options": options,
                "tokens": tokens,
                "done": done,
            },
            batch_size=batch_size,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_cpus=1,
        )
        return _write(dataset, output, on_line)
    finally:
        if started:
            ray.shutdown()


def _write(
    dataset: ray.data.Dataset, output: Path | None, on_line: Callable[[], None] | None
) -> CorpusCounts:
    """Append the dataset's rows to ``output`` (stdout if None) in order, each flushed."""
    counts = CorpusCounts()
    sink = output.open("a", encoding="utf-8") if output is not None else sys.stdout
    number = 0  # every input line is one row, in order: the row's position is its line
    try:
        for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
            assert isinstance(batch, pa.Table)
            for kind, out in zip(
                batch.column("kind").to_pylist(), batch.column("out").to_pylist(), strict=True
            ):
                number += 1
                if kind == _BLANK:
                    continue
                if kind == _SKIPPED:
                    counts.skipped += 1
                else:
                    if kind == _INVALID:
                        row = json.loads(out)
                        out = line_error_line(CorpusLine(number, row["id"], None, row["error"]))
                    counts.errors += kind in (_INVALID, _ERROR)
                    counts.detected += kind in (_DETECTED, _WATERMARKED)
                    counts.watermarked += kind == _WATERMARKED
                    sink.write(out)
                    sink.flush()  # a line is complete on disk before the next (resume)
                if on_line is not None:
                    on_line()
    finally:
        if output is not None:
            sink.close()
    return counts


__all__ = [
    "CorpusDetector",
    "CorpusLines",
    "connect",
    "detect_corpus_ray",
    "line_ranges",
    "read_range",
]
