"""Detection throughput: scored tokens per second, one process, on 512-token texts.

In one run, on the same texts (human passages of ``data/human-pydoc.jsonl`` joined and cut into
512-token pieces, decoded back to text):
- ``tokenizer_only``: the tokenizer call ``detect`` makes (offsets on), tokens/s;
- ``aaronson_evidence``: ``detect`` with its defaults (Aaronson, per-token evidence),
  scored tokens/s;
- ``all_scores``: ``detect(..., scores=all four)``;
- ``aaronson_spans``: ``detect(..., spans=True)``;
- ``corpus_workers_N``: ``detect_many`` over a larger corpus with N worker processes: wall
  clock including the pool's start-up, the time to the first result (start-up: spawned
  workers import torch and receive the tokenizer), and the rate after it.
Each single-process measurement is repeated (interleaved) and the best and median runs are kept.
The machine's load average is recorded: on a shared machine, other processes slow every row.

Writes ``bench/results/detector_throughput.json``. Run from the repository root::

    python -m bench.detector_throughput [--texts 40] [--repeats 5] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import RESULTS
from bench.detector_common import DATA, bench_source, data_home, run_metadata
from detector import SCORE_NAMES, SCORES, detect, detect_many
from sampler.models import DEFAULT_MODEL, load_tokenizer

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


def timed(run: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    units = run()
    return time.perf_counter() - start, units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--corpus-texts", type=int, default=1200)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    tokenizer = load_tokenizer(DEFAULT_MODEL, data_home())
    source = bench_source()
    texts = texts_of_512_tokens(tokenizer, args.texts)
    for name in SCORE_NAMES:
        SCORES[name]  # tabulate the Chernoff grids outside the timed region

    def tokenizer_only() -> int:
        total = 0
        for text in texts:
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            total += len(enc["input_ids"])
        return total

    def scored(**options: Any) -> Callable[[], int]:
        def run() -> int:
            return sum(detect(tokenizer, source, text=t, **options).num_scored for t in texts)

        return run

    cases: dict[str, Callable[[], int]] = {
        "tokenizer_only": tokenizer_only,
        "aaronson_evidence": scored(),
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
            "units": "tokens" if name == "tokenizer_only" else "scored tokens",
            "per_run": units,
            "best_per_second": units / best,
            "median_per_second": units / median,
            "runs_seconds": [round(seconds, 4) for seconds, _ in runs],
        }
    reference = rows["tokenizer_only"]["best_per_second"]
    for row in rows.values():
        row["fraction_of_tokenizer_only"] = row["best_per_second"] / reference

    corpus = (texts * (args.corpus_texts // len(texts) + 1))[: args.corpus_texts]
    for workers in args.workers:
        start = time.perf_counter()
        first_at, first_units, units = 0.0, 0, 0
        for result in detect_many(tokenizer, source, corpus, workers=workers, chunk_size=8):
            assert result.detection is not None
            units += result.detection.num_scored
            if not first_at:
                first_at, first_units = time.perf_counter() - start, units
        seconds = time.perf_counter() - start
        rows[f"corpus_workers_{workers}"] = {
            "units": "scored tokens",
            "per_run": units,
            "texts": len(corpus),
            "per_second": units / seconds,
            "seconds": round(seconds, 3),
            "first_result_seconds": round(first_at, 3),
            "per_second_after_first_result": (units - first_units) / (seconds - first_at),
        }
    result = {
        "meta": run_metadata(),
        "load_average_after": list(os.getloadavg()),
        "text_tokens": TEXT_TOKENS,
        "texts": len(texts),
        "repeats": args.repeats,
        "results": rows,
    }
    OUT_JSON.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT_JSON}")
    for name, row in rows.items():
        rate = row.get("best_per_second", row.get("per_second"))
        share = row.get("fraction_of_tokenizer_only")
        print(f"{name:20s} {rate:12,.0f} /s" + (f"  ({share:.0%} of tokenizer)" if share else ""))


if __name__ == "__main__":
    main()
