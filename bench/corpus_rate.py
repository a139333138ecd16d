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

The Ray row: ``--ray`` runs the same corpus as a JSONL file through
``poissonmark detect --jsonl --engine ray``'s runner (``service.ray.corpus``) on a real local
cluster of 1 and then 2 nodes (``ray start``, one CPU and one detector actor each; the driver
is this process), interleaved with the local engine at 1 and 2 processes, and writes
``bench/results/corpus_rate_ray.json``: wall time, scored tokens per second overall and after
the first result line, the per-worker rate, and a projection for a cluster of N workers
(per-worker rate × N: on paper, valid while the driver — reading, ordering and writing the
lines — keeps up; its own cost per line is measured too, from the output's write rate).

    python -m bench.corpus_rate --ray --model-dir DIR [--docs 454] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import DATA, RESULTS, environment
from bench.detector_common import bench_source
from detector import DetectOptions, detect_many


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=Path)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--ray", action="store_true", help="the Ray row (module docstring)")
    parser.add_argument("--docs", type=int, default=454)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "corpus_rate_ray.json")
    args = parser.parse_args()
    if args.ray:
        ray_row(args.model_dir, args.docs, args.repeats, args.out)
        return
    if args.texts is None or args.workers is None:
        parser.error("--texts and --workers are required without --ray")

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


def _corpus(path: Path, docs: int) -> None:
    """``docs`` human passages (``data/human-pydoc.jsonl``, cycled: later rounds from a third
    of the way in) as corpus-mode JSONL."""
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        passages = [json.loads(line)["text"] for line in f]
    with path.open("w", encoding="utf-8") as f:
        for i in range(docs):
            text = passages[i % len(passages)]
            text = text if i < len(passages) else text[len(text) // 3 :]
            f.write(json.dumps({"id": f"d{i}", "text": text}, ensure_ascii=False) + "\n")


def _timed_run(run: Any, out: Path) -> dict[str, Any]:
    """Run ``run(on_line)``; wall seconds, seconds to the first line, scored tokens."""
    out.unlink(missing_ok=True)
    start = time.perf_counter()
    first: list[float] = []
    run(lambda: first or first.append(time.perf_counter() - start))
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n") if line]
    scored = sum(int(r["num_scored"]) for r in rows if "num_scored" in r)
    first_rows = 1  # the first line's tokens are not in the after-first-result rate
    after = (scored - int(rows[0].get("num_scored", 0)) * first_rows) / (seconds - first[0])
    return {
        "seconds": round(seconds, 3),
        "first_result_seconds": round(first[0], 3),
        "scored_tokens": scored,
        "per_second": scored / seconds,
        "per_second_after_first_result": after,
        "output_bytes": out.stat().st_size,
    }


def ray_row(model_dir: Path, docs: int, repeats: int, out_path: Path) -> None:
    """The Ray row: local engine 1/2 processes and Ray 1/2 nodes, interleaved, ``repeats``
    rounds; the JSON at ``out_path``."""
    import secrets

    # this process is a driver of every cluster below: one token for all, set before ray loads
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    os.environ.update(token)
    from sampler.targets.model_files import load_detection_tokenizer  # the CLI's (no torch)
    from service.jobs.corpus import detect_corpus
    from service.ray.corpus import detect_corpus_ray
    from tests.service.ray_cluster import LocalRayCluster

    tokenizer = load_detection_tokenizer(str(model_dir), model_dir.parent.parent)
    source = bench_source()
    options = DetectOptions(alpha=0.01, key_id="pmk_0123456789abcdef")
    work = Path(tempfile.mkdtemp(prefix="pmbench"))
    corpus, out = work / "in.jsonl", work / "out.jsonl"
    _corpus(corpus, docs)
    runs: list[dict[str, Any]] = []
    loads: list[float] = []
    for repeat in range(repeats):
        for workers in (1, 2):
            loads.append(os.getloadavg()[0])
            row = _timed_run(
                lambda on_line, w=workers: detect_corpus(
                    tokenizer,
                    source,
                    corpus,
                    out,
                    options,
                    workers=w,
                    tokens=False,
                    on_line=on_line,
                ),
                out,
            )
            runs.append({"engine": "local", "workers": workers, "repeat": repeat, **row})
            print(json.dumps(runs[-1]), flush=True)
        for nodes in (1, 2):
            cluster = LocalRayCluster(token)
            try:
                cluster.start_head(num_cpus=1)
                if nodes == 2:
                    cluster.add_worker(num_cpus=1)
                os.environ.update({k: cluster.env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")})
                loads.append(os.getloadavg()[0])
                row = _timed_run(
                    lambda on_line, n=nodes, a=cluster.address: detect_corpus_ray(
                        tokenizer,
                        source,
                        corpus,
                        out,
                        options,
                        workers=n,
                        tokens=False,
                        on_line=on_line,
                        address=a,
                    ),
                    out,
                )
            finally:
                cluster.stop()
            runs.append(
                {"engine": "ray", "nodes": nodes, "workers": nodes, "repeat": repeat, **row}
            )
            print(json.dumps(runs[-1]), flush=True)
    ray_runs = [r for r in runs if r["engine"] == "ray"]
    # per worker: the rate after the first line, over the workers; the after-first rate is a
    # little high (work done before the first line is counted in it), so the projection takes
    # the lowest of these and of the one-process local rate (the same detection code)
    per_worker = [r["per_second_after_first_result"] / r["workers"] for r in ray_runs]
    local_one = [r["per_second"] for r in runs if r["engine"] == "local" and r["workers"] == 1]
    rate = min(*per_worker, *local_one)
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    result = {
        "bench": "corpus_rate --ray",
        "model": "SmolLM2-135M-Instruct tokenizer (detection needs no model)",
        "environment": environment(),
        "amx": "amx_tile" in flags,
        "machine_load": (
            "2 cores shared with other work; 1-min load average at each run's "
            f"start: {[round(x, 2) for x in loads]} (compare only ratios within this run)"
        ),
        "corpus": {"docs": docs, "source": "data/human-pydoc.jsonl, cycled", "tokens": False},
        "cluster": "ray start on this machine: a head (+ a worker node), 1 CPU and 1 detector "
        "actor each, 100 MiB object stores; the driver (reads, orders, writes) is this process",
        "runs": runs,
        "per_worker_scored_tokens_per_second": {
            "ray_runs_after_first_result": [round(x, 1) for x in per_worker],
            "local_one_process": [round(x, 1) for x in local_one],
            "used": round(rate, 1),
        },
        "projection": {
            "how": "scored tokens/s of a cluster of N detector workers = the lowest per-worker "
            "rate above x N, plus the ~8 s start-up measured here; on paper: assumes a core "
            "per worker and a driver that keeps up (one process reads, orders and writes "
            "every line: its ceiling was not reached, or measured, on 2 cores)",
            **{f"{n}_workers": round(rate * n) for n in (8, 32, 128)},
        },
    }
    out_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
