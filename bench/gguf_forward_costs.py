"""What one llama.cpp target forward costs by query size, with and without weight repacking
(``sampler.targets.llamacpp``, precision ``gguf``), in one process.

Two ``GgufTarget`` s on the shipped GGUF (SmolLM2-135M-Instruct, Q4_1 layers): ``repack`` on
(llama.cpp's extra CPU buffer types: AMX int8 tiles on a CPU with AMX; only where
``repacking_safe``, i.e. ``scripts/setup.sh``'s patched build) and off. For each:

- ``probe``: whether the row-invariance probe the service runs at load passes;
- ``forward_ms[q]``: one causal chain of q new tokens after ``--cached`` cached ones (fixed,
  unkeyed token ids), median over ``--calls`` forwards, the two targets and the query sizes
  taken in a turning order so that drift falls on all alike;
- ``cost_ratio[q]``: ``forward_ms[q] / forward_ms[1]`` (what a draft tree of q nodes costs
  in one-token steps: the number a tree must beat in accepted tokens);
- ``logits_vs_norepack``: the largest absolute logit difference between the two targets over
  the same chain (different int8 kernels and activation quantisation: the law moves by
  quantisation noise, which is why a generation's identity holds per backend, not across).

    python -m bench.gguf_forward_costs [--calls 15] [--cached 200]

Writes ``bench/results/gguf_forward_costs.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, environment
from bench.speed_cpu import cpu_flags
from sampler.models import DEFAULT_MODEL
from sampler.targets.llamacpp import GgufTarget, RowInvarianceError, repacking_safe
from sampler.targets.model_files import gguf_path

SIZES = (1, 2, 3, 5, 8, 9, 17, 33)


def _probe(target: GgufTarget) -> str:
    try:
        target.probe()
    except RowInvarianceError as exc:
        return f"failed: {exc}"
    return "ok"


def _forward_ms(target: GgufTarget, prefix: list[int], chain: list[int]) -> float:
    cache = target.new_cache()
    cache.extend(prefix)
    started = time.perf_counter()
    cache.extend(chain)
    elapsed = time.perf_counter() - started
    del cache
    return elapsed * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--cached", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS / "gguf_forward_costs.json")
    args = parser.parse_args()
    path = gguf_path(DEFAULT_MODEL)
    targets = {"norepack": GgufTarget(path, repack=False)}
    if repacking_safe():
        targets["repack"] = GgufTarget(path, repack=True)
    vocab = targets["norepack"].vocab_size
    prefix = [(31 * i + 7) % vocab for i in range(args.cached)]
    times: dict[str, dict[int, list[float]]] = {n: {q: [] for q in SIZES} for n in targets}
    jobs = [(name, q) for name in targets for q in SIZES]
    for call in range(args.calls + 1):  # call 0: untimed warm-up
        for name, q in jobs[call % len(jobs) :] + jobs[: call % len(jobs)]:
            chain = [(53 * i + 11 + call) % vocab for i in range(q)]
            ms = _forward_ms(targets[name], prefix, chain)
            if call:
                times[name][q].append(ms)
    rows: dict[str, Any] = {}
    for name, target in targets.items():
        median = {q: statistics.median(times[name][q]) for q in SIZES}
        rows[name] = {
            "weights": target.weights,
            "probe": _probe(target),
            "forward_ms": {str(q): round(median[q], 3) for q in SIZES},
            "forward_ms_spread": {
                str(q): [round(min(times[name][q]), 3), round(max(times[name][q]), 3)]
                for q in SIZES
            },
            "cost_ratio": {str(q): round(median[q] / median[1], 3) for q in SIZES},
        }
    if "repack" in targets:
        chain = [(53 * i + 11) % vocab for i in range(17)]
        logits = []
        for name in ("norepack", "repack"):
            cache = targets[name].new_cache()
            cache.extend(prefix)
            logits.append(cache.extend(chain))
        rows["repack"]["logits_vs_norepack"] = {
            "max_abs": float((logits[0] - logits[1]).abs().max()),
            "argmax_equal_rows": int((logits[0].argmax(-1) == logits[1].argmax(-1)).sum()),
            "rows": len(chain),
        }
    result = {
        "bench": "gguf_forward_costs",
        "model": DEFAULT_MODEL,
        "gguf": path.name,
        "threads": targets["norepack"].threads,
        "cached_tokens": args.cached,
        "calls": args.calls,
        "repacking_safe": repacking_safe(),
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "cpu_flags": cpu_flags(),
        "targets": rows,
        **environment(),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, row in rows.items():
        print(name, row["probe"], row["forward_ms"], row["cost_ratio"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    torch.set_num_threads(1)  # as precision gguf sets: llama.cpp has its own threads
    main()
