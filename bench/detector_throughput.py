"""Detection throughput: scored tokens per second, one process, on 512-token texts.

In one run, on the same texts (human passages of ``data/human-pydoc.jsonl`` joined and cut into
512-token pieces, decoded back to text):
- ``tokenizer_only``: the tokenizer call ``detect`` makes — the fast tokenizer's Rust backend,
  ``backend_tokenizer.encode(text, add_special_tokens=False)``, reading its ids and offsets —
  tokens/s: the reference of the goal (>= 50 %);
- ``tokenizer_call``: the same through the ``transformers`` wrapper,
  ``tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)`` (what ``detect``
  called before it went to the backend; 2-12 % slower), for comparison with earlier runs;
- ``aaronson_evidence``: ``detect`` with its defaults (Aaronson, per-token evidence: ids,
  offsets, skip reasons, pivots and terms in NumPy columns, ``Detection.evidence``),
  scored tokens/s;
- ``aaronson_evidence_rows``: the same, plus the evidence as ``TokenEvidence`` rows
  (``Detection.tokens``, built on first use: what JSON output and the CLI's view read);
- ``all_scores``: ``detect(..., scores=all four)``;
- ``aaronson_spans``: ``detect(..., spans=True)``;
- ``stages_us_per_text``: µs per text of each stage alone (tokenize, plan, context keys,
  pivots, the Aaronson evaluation), with the compiled kernels and, for the plan and the
  pivots, the NumPy fallback;
- ``corpus_workers_N``: ``detect_many`` over a larger corpus with N worker processes, run in a
  light process of its own (``bench.corpus_rate``): wall clock including the pool's start-up,
  the time to the first result (start-up: spawned workers import the detector and receive the
  tokenizer), and the rate after it.
Each single-process measurement is repeated (interleaved) and the best and median runs are kept.
The machine's load average is recorded: on a shared machine, other processes slow every row.

Writes ``bench/results/detector_throughput.json``. Run from the repository root::

    python -m bench.detector_throughput [--texts 40] [--repeats 5] [--workers 1 2] [--chunk-size 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from bench.common import RESULTS
from bench.detector_common import DATA, bench_source, data_home, run_metadata
from detector import AARONSON, SCORE_NAMES, SCORES, DetectOptions, detect
from detector.tokens import tokenize
from keyed import _kernel_loader, detection_plan_arrays, label_key_words, pivot_array
from sampler.models import DEFAULT_MODEL, load_tokenizer, materialise

TEXT_TOKENS = 512
OUT_JSON = RESULTS / "detector_throughput.json"


def texts_of_512_tokens(tokenizer: Any, count: int) -> list[str]:
    """``count`` texts of 512 tokens each, cut from the joined human passages."""
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        joined = "\n\n".join(json.loads(line)["text"] for line in f)
    ids = tokenizer(joined, add_special_tokens=False)["input_ids"]
    pieces = [ids[i : i + TEXT_TOKENS] for i in range(0, len(ids) - TEXT_TOKENS, TEXT_TOKENS)]
    if len(pieces) < count:
        raise ValueError(f"only {len(pieces)} pieces of {TEXT_TOKENS} tokens, asked {count}")
    return [tokenizer.decode(piece) for piece in pieces[:count]]


def stage_times(tokenizer: Any, source: Any, texts: list[str], repeats: int) -> dict[str, Any]:
    """Microseconds per text of each stage of ``detect`` alone, best of ``repeats`` loops over
    the texts (each stage in its own loop: warmer caches than inside the pipeline, so the sum
    is below the pipeline's time), with the compiled kernels and with the NumPy fallback."""
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    width = source.context_width
    tokenized = [tokenize(tokenizer, text, None) for text in texts]
    plans = [detection_plan_arrays(t.ids, width, special) for t in tokenized]
    keys = [label_key_words(source.secret, plan.labels) for plan in plans]
    scored = [t.ids[plan.scored] for t, plan in zip(tokenized, plans, strict=True)]
    pivots = [pivot_array(k, ids) for k, ids in zip(keys, scored, strict=True)]
    stages: dict[str, Callable[[], object]] = {
        "tokenize": lambda: [tokenize(tokenizer, text, None) for text in texts],
        "plan": lambda: [detection_plan_arrays(t.ids, width, special) for t in tokenized],
        "context_keys": lambda: [label_key_words(source.secret, plan.labels) for plan in plans],
        "pivots": lambda: [pivot_array(k, ids) for k, ids in zip(keys, scored, strict=True)],
        "aaronson_evaluate": lambda: [AARONSON.evaluate(r) for r in pivots],
    }

    def best(run: Callable[[], object]) -> float:
        return min(timed(lambda: len(run()))[0] for _ in range(repeats)) / len(texts) * 1e6

    out: dict[str, Any] = {"units": "µs per 512-token text, each stage alone"}
    out["compiled"] = {name: round(best(run), 1) for name, run in stages.items()}
    with mock.patch.object(_kernel_loader, "kernels", lambda: None):  # the NumPy fallback
        out["numpy_fallback"] = {name: round(best(stages[name]), 1) for name in ("plan", "pivots")}
    return out


def timed(run: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    units = run()
    return time.perf_counter() - start, units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--corpus-texts", type=int, default=6000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--chunk-size", type=int, default=8, help="corpus mode: texts per task")
    parser.add_argument("--out", type=Path, default=OUT_JSON, help="the result file")
    args = parser.parse_args()

    tokenizer = load_tokenizer(DEFAULT_MODEL, data_home())
    source = bench_source()
    texts = texts_of_512_tokens(tokenizer, args.texts)
    for name in SCORE_NAMES:
        SCORES[name]  # tabulate the Chernoff grids outside the timed region

    backend = tokenizer.backend_tokenizer

    def tokenizer_only() -> int:
        total = 0
        for text in texts:
            encoding = backend.encode(text, add_special_tokens=False)
            ids, _offsets = encoding.ids, encoding.offsets  # what detect reads out of it
            total += len(ids)
        return total

    def tokenizer_call() -> int:
        total = 0
        for text in texts:
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            total += len(enc["input_ids"])
        return total

    def scored(**fields: Any) -> Callable[[], int]:
        options = DetectOptions(**fields)

        def run() -> int:
            return sum(detect(tokenizer, source, text=t, options=options).num_scored for t in texts)

        return run

    def with_rows() -> int:  # evidence as TokenEvidence rows, as the CLI and JSON output use it
        total = 0
        for text in texts:
            found = detect(tokenizer, source, text=text)
            assert len(found.tokens) == found.num_tokens  # builds the rows
            total += found.num_scored
        return total

    cases: dict[str, Callable[[], int]] = {
        "tokenizer_only": tokenizer_only,
        "tokenizer_call": tokenizer_call,
        "aaronson_evidence": scored(),
        "aaronson_evidence_rows": with_rows,
        "all_scores": scored(scores=SCORE_NAMES),
        "aaronson_spans": scored(spans=True),
    }
    for run in cases.values():  # warm-up
        run()
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, run in cases.items():
            samples[name].append(timed(run))
    rows: dict[str, Any] = {}
    for name, runs in samples.items():
        units = runs[0][1]
        best = min(seconds for seconds, _ in runs)
        median = statistics.median(seconds for seconds, _ in runs)
        rows[name] = {
            "units": "tokens" if name.startswith("tokenizer") else "scored tokens",
            "per_run": units,
            "best_per_second": units / best,
            "median_per_second": units / median,
            "runs_seconds": [round(seconds, 4) for seconds, _ in runs],
        }
    reference = rows["tokenizer_only"]["best_per_second"]
    for row in rows.values():
        row["fraction_of_tokenizer_only"] = row["best_per_second"] / reference

    rows["stages_us_per_text"] = stage_times(tokenizer, source, texts, args.repeats)

    corpus = (texts * (args.corpus_texts // len(texts) + 1))[: args.corpus_texts]
    with tempfile.TemporaryDirectory() as tmp:
        corpus_file = Path(tmp) / "corpus.json"
        corpus_file.write_text(json.dumps(corpus), encoding="utf-8")
        for workers in args.workers:
            # its own process (bench.corpus_rate): workers spawned from this one would import
            # torch through this module's imports, which the CLI's workers never do
            done = subprocess.run(
                [sys.executable, "-m", "bench.corpus_rate", "--texts", str(corpus_file),
                 "--model-dir", str(materialise(DEFAULT_MODEL, data_home())),
                 "--workers", str(workers), "--chunk-size", str(args.chunk_size)],
                capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1],
            )  # fmt: skip
            line = json.loads(done.stdout.strip().splitlines()[-1])
            rows[f"corpus_workers_{workers}"] = {"units": "scored tokens", **line}
    result = {
        "meta": run_metadata(),
        "load_average_after": list(os.getloadavg()),
        "text_tokens": TEXT_TOKENS,
        "texts": len(texts),
        "repeats": args.repeats,
        "results": rows,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    for name, row in rows.items():
        if name == "stages_us_per_text":
            print(f"{name}: {row['compiled']}  NumPy fallback: {row['numpy_fallback']}")
            continue
        rate = row.get("best_per_second", row.get("per_second"))
        share = row.get("fraction_of_tokenizer_only")
        print(f"{name:20s} {rate:12,.0f} /s" + (f"  ({share:.0%} of tokenizer)" if share else ""))


if __name__ == "__main__":
    main()
