"""``poissonmark detect --jsonl``: a corpus against one key, one JSON result per line.

The runner is ``service.jobs.corpus.detect_corpus`` (this host's processes) or
``service.ray.corpus.detect_corpus_ray`` (``--engine ray``). On a terminal a progress bar on
stderr shows the documents done, their rate and the time left; when stderr is not a terminal
(a pipe, a file, a CI log) nothing but the final counts is written there.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rich.markup
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from detector import DetectOptions
from service.cli.common import err

if TYPE_CHECKING:
    from service.keys.record import KeyRecord

ENGINES = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class CorpusRun:
    """How ``--jsonl`` runs: worker count, evidence, engine, cluster, q-value pass."""

    workers: int
    tokens: bool
    engine: str
    address: str | None
    q_values: bool


def check_corpus_options(
    jsonl: Path | None, output: Path | None, engine: str, address: str | None, q_values: bool
) -> None:
    """``--engine``, ``--address`` and ``--q-values`` (ValueError naming the option)."""
    if engine not in ENGINES:
        raise ValueError(f"--engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    if jsonl is None and (engine != "local" or address is not None or q_values):
        raise ValueError("--engine, --address and --q-values go with --jsonl")
    if address is not None and engine != "ray":
        raise ValueError("--address goes with --engine ray")
    if q_values and output is None:
        raise ValueError("--q-values needs --output (the pass rewrites the finished file)")


class _Rate(ProgressColumn):
    """Documents per second over the run so far (blank until the first is done)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.1f} docs/s", style="progress.data.speed")


def corpus_progress() -> Progress:
    """The bar of a corpus run on stderr: documents done of all, rate, elapsed, time left;
    disabled (writes nothing) when stderr is not a terminal."""
    columns = (
        TextColumn("detecting"),
        BarColumn(),
        MofNCompleteColumn(),
        _Rate(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=err, transient=False, disable=not err.is_terminal)


def run_corpus(
    tok: Any,
    record: KeyRecord,
    corpus: Path,
    output: Path | None,
    options: DetectOptions,
    run: CorpusRun,
) -> None:
    """``--jsonl``: the corpus runner under ``corpus_progress``, then the counts (and the
    q-value pass when asked for) on stderr.

    Raises:
        ValueError: ``--engine ray`` where Ray is not installed (saying how to install it).
    """
    from service.jobs.corpus import add_q_values, count_lines, detect_corpus
    from service.jobs.detection import DETECTION_NONCE

    runner: Any = detect_corpus
    extra: dict[str, Any] = {}
    if run.engine == "ray":
        try:
            from service.ray.corpus import detect_corpus_ray
        except ImportError as exc:  # the extra is not installed (the default install)
            missing = exc.name or "ray"
            spec = rich.markup.escape("'poissonmark[ray]'")  # the message is printed as markup
            raise ValueError(f"--engine ray needs {missing}: pip install {spec}") from None

        runner, extra = detect_corpus_ray, {"address": run.address}

    keyed = dataclasses.replace(options, key_id=record.key_id)
    with corpus_progress() as progress:
        bar = progress.add_task("detect", total=count_lines(corpus))
        counts = runner(
            tok,
            record.source(DETECTION_NONCE),
            corpus,
            output,
            keyed,
            workers=run.workers,
            tokens=run.tokens,
            on_line=functools.partial(progress.advance, bar),
            **extra,
        )
    err.print(counts.summary(), highlight=False)
    if run.q_values:
        assert output is not None  # check_corpus_options
        err.print(add_q_values(output, options.alpha).summary(), highlight=False)
