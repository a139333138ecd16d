"""Corpus mode's rate: ``detect_many`` over N worker processes, in a process of its own.

Spawned workers re-import their parent's main module. ``bench.detector_throughput`` imports the
model loader (torch, transformers' models), so workers spawned from it paid seconds of imports
no ``poissonmark detect --jsonl`` run pays; this module imports only the detector and the
tokenizer class, as the CLI's workers do. ``bench.detector_throughput`` runs it once per worker
count and records the JSON line it prints.

    python -m bench.corpus_rate --texts FILE.json --model-dir DIR --workers 2 [--chunk-size 8]

FILE.json: a JSON list of texts. Prints ``{"workers", "chunk_size", "texts", "per_run",
"seconds", "first_result_seconds", "per_second", "per_second_after_first_result"}`` (scored
tokens per second).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.detector_common import bench_source
from detector import detect_many


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--chunk-size", type=int, default=8)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir))
    texts = json.loads(args.texts.read_text(encoding="utf-8"))
    start = time.perf_counter()
    first_at, first_units, units = 0.0, 0, 0
    results = detect_many(
        tokenizer, bench_source(), texts, workers=args.workers, chunk_size=args.chunk_size
    )
    for result in results:
        assert result.detection is not None
        units += result.detection.num_scored
        if not first_at:
            first_at, first_units = time.perf_counter() - start, units
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "workers": args.workers,
                "chunk_size": args.chunk_size,
                "texts": len(texts),
                "per_run": units,
                "seconds": round(seconds, 3),
                "first_result_seconds": round(first_at, 3),
                "per_second": units / seconds,
                "per_second_after_first_result": (units - first_units) / (seconds - first_at),
            }
        )
    )


if __name__ == "__main__":
    main()
