"""Resumable corpus detection over a JSONL file: ``detect --jsonl`` (docs/design.md §9).

Input: one JSON object per line, ``{"id", "text"}``, ``{"id", "token_ids"}`` or both (blank
lines are passed over). Output: one JSON object per input line, in input order —
``{"id", **detection}`` (``service.jobs.detect_response.detection_json``, the shape of one key's
result in ``POST /v1/detect``), ``{"id", "error"}`` when the detector refused the item, or
``{"id", "line", "error"}`` when the line is not a valid input (``id`` null when it has none).

Resume: ids already in the output file are skipped, so a rerun after an interruption adds only
what is missing; a torn last line (an interrupted write) is cut off first. Each result is
flushed before the next starts, so what is on disk is always whole lines.

q-values (``add_q_values``, ``--q-values``): a pass over the finished output adds to every
detection row its Benjamini–Hochberg q-value across all the detection rows of the file
(``"q_value"``, from each row's ``p_value``: the one its verdict is on). It needs every
document's p, so it runs after the last line is written, rewrites the file whole (a temporary
file, then ``os.replace``: an interruption leaves the old file) and is recomputed from the
p-values each time, so a resumed run that adds rows gives every row the q-value of the whole corpus.

Engines: this module runs the corpus in this process or over ``detect_many``'s worker
processes; ``service.ray.corpus`` runs the same lines through Ray Data and writes the same
output (``result_line``, ``line_error_line``).
"""

from __future__ import annotations

import json
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from detector import CorpusItem, CorpusResult, DetectOptions, Tokenizer, detect_many
from keyed import KeyedSource
from service.jobs.detect_response import detection_json


@dataclass
class CorpusCounts:
    """What a run did, by outcome (lines skipped because their id was already written too)."""

    detected: int = 0
    watermarked: int = 0
    errors: int = 0
    skipped: int = 0

    def summary(self) -> str:
        """``"4 detected, 1 watermarked, 4 errors, 0 skipped (already in output)"``."""
        return (
            f"{self.detected} detected, {self.watermarked} watermarked, {self.errors} errors, "
            f"{self.skipped} skipped (already in output)"
        )


@dataclass(frozen=True)
class CorpusLine:
    """One non-blank input line: a valid ``item``, or the ``error`` that makes it invalid.

    Attributes:
        number: 1-based line number in the file.
        id: the line's id as a string (an integer id is converted), None when it has none.
    """

    number: int
    id: str | None
    item: CorpusItem | None
    error: str | None = None


def parse_line(number: int, line: str) -> CorpusLine:
    """Read one input line (the detector checks the ids' values)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        return CorpusLine(number, None, None, f"not JSON ({exc.msg})")
    if not isinstance(row, dict):
        return CorpusLine(
            number, None, None, "expected a JSON object with id and text or token_ids"
        )
    raw_id = row.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        return CorpusLine(number, None, None, "expected an id (string or integer)")
    item_id = str(raw_id)
    text, ids = row.get("text"), row.get("token_ids")
    problem = None
    if text is None and ids is None:
        problem = "expected text or token_ids"
    elif text is not None and not isinstance(text, str):
        problem = "text: expected a string"
    elif ids is not None and not isinstance(ids, list):
        problem = "token_ids: expected a list of integers"
    if problem is not None:
        return CorpusLine(number, item_id, None, problem)
    token_ids = None if ids is None else tuple(ids)
    return CorpusLine(number, item_id, CorpusItem(item_id, text=text, token_ids=token_ids))


def dump_line(payload: dict[str, Any]) -> str:
    """One output line: ``payload`` as compact-enough JSON (UTF-8 kept, no NaN), newline ended."""
    return json.dumps(payload, allow_nan=False, ensure_ascii=False) + "\n"


def result_line(result: CorpusResult, tokens: bool) -> str:
    """The output line of a detector result: ``{"id", **detection}`` or ``{"id", "error"}``."""
    if result.detection is None:
        return dump_line({"id": result.id, "error": result.error})
    return dump_line({"id": result.id, **detection_json(result.detection, tokens=tokens)})


def line_error_line(line: CorpusLine) -> str:
    """The output line of an invalid input line: ``{"id", "line", "error"}``."""
    return dump_line({"id": line.id, "line": line.number, "error": line.error})


def read_corpus(path: Path) -> Iterator[CorpusLine]:
    """The non-blank lines of ``path``, parsed, lazily (a corpus need not fit in memory)."""
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield parse_line(number, line)


def count_lines(path: Path) -> int:
    """Non-blank lines of ``path`` (the total of a progress bar)."""
    with path.open(encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def done_ids(output: Path) -> set[str]:
    """Ids already written to ``output`` (resume). A torn last line (an interrupted write) is
    cut off so that appending continues on a clean line."""
    if not output.exists():
        return set()
    data = output.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with output.open("r+b") as f:
            f.truncate(len(data))
    done: set[str] = set()
    # "\n" alone ends a line: splitlines() would also cut at U+2028, U+0085…, which
    # ensure_ascii=False writes raw inside a text, and lose that row's id
    for line in data.decode("utf-8").split("\n"):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("id"), str):
            done.add(row["id"])
    return done


class _Run:
    """One run's state: the lines read but not yet written, the sink, the counts.

    Results come back from ``detect_many`` in input order; the invalid lines read before an
    item wait in ``pending`` and are written just before that item's result.
    """

    def __init__(self, sink: TextIO, tokens: bool, on_line: Callable[[], None] | None) -> None:
        self.sink = sink
        self.tokens = tokens
        self.on_line = on_line
        self.counts = CorpusCounts()
        self.pending: deque[CorpusLine] = deque()

    def items(self, lines: Iterable[CorpusLine], done: set[str]) -> Iterator[CorpusItem]:
        """The valid items to detect, skipping ids in ``done``; every line goes to ``pending``."""
        for line in lines:
            if line.id is not None and line.id in done:
                self.counts.skipped += 1
                self._advance()
                continue
            self.pending.append(line)
            if line.item is not None:
                yield line.item

    def result(self, result: CorpusResult) -> None:
        """Write the invalid lines before ``result``'s item, then the result."""
        self.invalid_lines()
        line = self.pending.popleft()
        assert line.item is not None and line.id == result.id
        if result.detection is not None:
            self.counts.detected += 1
            self.counts.watermarked += result.detection.verdict.value == "watermarked"
        self._write(result_line(result, self.tokens), error=result.detection is None)

    def invalid_lines(self) -> None:
        """Write the invalid lines at the head of ``pending``."""
        while self.pending and self.pending[0].item is None:
            self._write(line_error_line(self.pending.popleft()), error=True)

    def _write(self, line: str, error: bool = False) -> None:
        self.counts.errors += error
        self.sink.write(line)
        self.sink.flush()  # a line is complete on disk before the next starts (resume)
        self._advance()

    def _advance(self) -> None:
        if self.on_line is not None:
            self.on_line()


def detect_corpus(
    tokenizer: Tokenizer,
    source: KeyedSource,
    corpus: Path,
    output: Path | None,
    options: DetectOptions,
    *,
    workers: int = 1,
    tokens: bool = True,
    on_line: Callable[[], None] | None = None,
) -> CorpusCounts:
    """Detect every line of ``corpus`` with one key; append the results to ``output``.

    Args:
        tokenizer: the key's tokenizer (checked against the key record by the caller).
        source: the key's keyed source.
        corpus: the input JSONL file (module docstring).
        output: the JSONL file results are appended to (ids in it are skipped), or None for
            stdout (nothing skipped).
        options: the detection's options (``key_id`` is echoed in every result).
        workers: detector processes (``detector.detect_many``).
        tokens: include per-token evidence in each result (else ``"tokens": null``).
        on_line: called once per input line written or skipped (progress).
    Returns:
        the counts by outcome.
    """
    done = done_ids(output) if output is not None else set()
    sink = output.open("a", encoding="utf-8") if output is not None else sys.stdout
    run = _Run(sink, tokens, on_line)
    try:
        items = run.items(read_corpus(corpus), done)
        for result in detect_many(tokenizer, source, items, workers=workers, options=options):
            run.result(result)
        run.invalid_lines()
    finally:
        if output is not None:
            sink.close()
    return run.counts


@dataclass(frozen=True)
class QValueCounts:
    """What ``add_q_values`` did: detection rows given a q-value, and those with q <= alpha."""

    documents: int
    discoveries: int
    alpha: float

    def summary(self) -> str:
        """``"q-values (Benjamini–Hochberg) over 120 documents: 7 with q <= 0.01"``."""
        return (
            f"q-values (Benjamini–Hochberg) over {self.documents} documents: "
            f"{self.discoveries} with q <= {self.alpha:g}"
        )


def row_p_value(row: dict[str, Any]) -> float | None:
    """The p-value a detection row's verdict is on (its top-level ``p_value``: the whole text
    and spans test), None for an error row."""
    p = row.get("p_value")
    return float(p) if isinstance(p, int | float) and not isinstance(p, bool) else None


def add_q_values(output: Path, alpha: float = 0.01) -> QValueCounts:
    """Give every detection row of ``output`` its Benjamini–Hochberg q-value (``"q_value"``).

    Benjamini & Hochberg (1995), step-up, as adjusted p-values: q_(i) = min_{j >= i}
    min(1, p_(j) · m / j) over the m detection rows sorted by p (``scipy.stats.
    false_discovery_control``, method ``"bh"``); rejecting the rows with q <= alpha controls
    the false discovery rate at alpha when the documents' p-values are independent (or
    positively dependent). Error rows (no p-value) are not counted in m and get no q-value.
    Lines keep their order and every other field; a q-value already there is recomputed.

    Args:
        output: a finished corpus-mode output file (whole lines; module docstring).
        alpha: the level the summary counts discoveries at, in (0, 1).
    Returns:
        the number of rows given a q-value and of those with q <= alpha.
    Raises:
        ValueError: ``alpha`` out of range, or a line of ``output`` that is not a JSON object.
    """
    from scipy.stats import false_discovery_control

    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a number in (0, 1), got {alpha!r}")
    p_values: list[float] = []
    with output.open(encoding="utf-8") as f:  # pass 1: the p-values (8 bytes a document)
        for number, line in enumerate(f, 1):
            p = row_p_value(_output_row(line, output, number))
            if p is not None:
                p_values.append(p)
    q = false_discovery_control(np.asarray(p_values, dtype=np.float64), method="bh")
    partial = output.with_name(output.name + ".q-values.partial")
    with output.open(encoding="utf-8") as f, partial.open("w", encoding="utf-8") as sink:
        index = 0  # pass 2: the rows again, each detection row with its q-value
        for number, line in enumerate(f, 1):
            row = _output_row(line, output, number)
            if row_p_value(row) is not None:
                row["q_value"] = float(q[index])
                index += 1
            sink.write(dump_line(row))
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(partial, output)
    return QValueCounts(len(p_values), int(np.count_nonzero(q <= alpha)), alpha)


def _output_row(line: str, output: Path, number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        row = None
    if not isinstance(row, dict):
        raise ValueError(f"{output}: line {number} is not a JSON object (not an output file?)")
    return row
