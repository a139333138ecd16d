"""Two llama.cpp builds' target forward costs by query size, interleaved: which build is faster
on this CPU, and do they compute the same logits.

A build is a directory of llama.cpp shared libraries (``libllama.so`` and its ``libggml*``),
as ``cmake --build build --target llama`` leaves them in ``build/bin``, or ``installed`` for the
wheel in this environment. One process can load one build only, so each round starts one
process per build, in turn (the first build of the pair alternating), and every process times
the same forwards: ``--cached`` fixed, unkeyed tokens in a KV cache, then for each query size q
a causal chain of q new tokens, dropped again (``GgufCache.keep``) so that the cache stays the
same, the sizes in a turning order. A build's cost of q is the median over rounds of its
per-round medians; ``ratio[q]`` is that over its cost of one token (what a draft tree of q
nodes costs in one-token steps); ``first_ms_over_last_ms[q]``: the first build's cost over the
last's. ``same_logits``: every build's logits of every q equal the first build's, bit for bit
(a kernel change that claims the same bits must show it here).

    python -m bench.gguf_build_ab --build before=/path/to/old/build/bin --build after=installed
        [--rounds 6] [--calls 60] [--cached 200] [--repack] --out bench/results/gguf_build_ab.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, environment
from bench.speed_cpu import cpu_flags
from sampler.models import DEFAULT_MODEL

SIZES = (1, 2, 3, 5, 8, 9, 17)


def _child(calls: int, cached: int, repack: bool = False) -> dict[str, Any]:
    """One process: the forward times (ms) of every query size and a digest of its logits;
    ``repack``: the weights in llama.cpp's extra CPU buffer types (AMX tiles on a Xeon)."""
    import torch

    from sampler.targets.llamacpp import GgufTarget
    from sampler.targets.model_files import gguf_path

    torch.set_num_threads(1)  # as precision gguf sets: llama.cpp has its own threads
    target = GgufTarget(gguf_path(DEFAULT_MODEL), repack=repack)
    vocab = target.vocab_size
    cache = target.new_cache()
    cache.extend([(31 * i + 7) % vocab for i in range(cached)])
    times: dict[int, list[float]] = {q: [] for q in SIZES}
    digest = hashlib.sha256()
    for q in SIZES:  # the logits, once, before timing
        logits = cache.extend([(53 * i + 11) % vocab for i in range(q)])
        digest.update(logits.numpy().tobytes())
        cache.keep(cached, [])
    for call in range(calls + 1):  # call 0: untimed warm-up
        turn = call % len(SIZES)
        for q in SIZES[turn:] + SIZES[:turn]:
            chain = [(53 * i + 11 + call) % vocab for i in range(q)]
            started = time.perf_counter()
            cache.extend(chain)
            elapsed = time.perf_counter() - started
            cache.keep(cached, [])
            if call:
                times[q].append(elapsed * 1000)
    return {
        "median_ms": {str(q): statistics.median(v) for q, v in times.items()},
        "logits_sha256": digest.hexdigest(),
        "llama_cpp_library": os.environ.get("LLAMA_CPP_LIB_PATH", "installed"),
    }


def _run(path: str, calls: int, cached: int, repack: bool) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    if path != "installed":
        env["LLAMA_CPP_LIB_PATH"] = str(Path(path).resolve())
    child = f"b._child({calls}, {cached}, {repack})"
    code = f"import json, bench.gguf_build_ab as b; print(json.dumps({child}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=RESULTS.parents[1],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--build",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="a build: a name and its library directory, or `installed` (give two or more)",
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--cached", type=int, default=200)
    parser.add_argument(
        "--repack",
        action="store_true",
        help="weights repacked into llama.cpp's extra CPU buffer types (AMX tiles on a Xeon)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "gguf_build_ab.json")
    args = parser.parse_args()
    builds = dict(b.split("=", 1) for b in args.build)
    if len(builds) < 2:
        parser.error("expected two or more --build NAME=DIR")
    names = list(builds)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            runs[name].append(_run(builds[name], args.calls, args.cached, args.repack))
            print(name, {q: round(v, 2) for q, v in runs[name][-1]["median_ms"].items()})
    first = runs[names[0]][0]["logits_sha256"]
    rows: dict[str, Any] = {}
    for name in names:
        per_round = {str(q): [run["median_ms"][str(q)] for run in runs[name]] for q in SIZES}
        cost = {q: statistics.median(v) for q, v in per_round.items()}
        rows[name] = {
            "library": builds[name],
            "forward_ms": {q: round(v, 3) for q, v in cost.items()},
            "forward_ms_per_round": {q: [round(x, 3) for x in v] for q, v in per_round.items()},
            "ratio": {q: round(cost[q] / cost["1"], 3) for q in cost},
            "same_logits": all(run["logits_sha256"] == first for run in runs[name]),
        }
    speedup = {
        q: round(rows[names[0]]["forward_ms"][q] / rows[names[-1]]["forward_ms"][q], 3)
        for q in rows[names[-1]]["forward_ms"]
    }
    result = {
        "bench": "gguf_build_ab",
        "model": DEFAULT_MODEL,
        "cpu_flags": cpu_flags(),
        "cached_tokens": args.cached,
        "repacked": args.repack,
        "calls": args.calls,
        "rounds": args.rounds,
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "builds": rows,
        "first_ms_over_last_ms": speedup,
        **environment(),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        print(name, row["forward_ms"], row["ratio"], "same logits:", row["same_logits"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
