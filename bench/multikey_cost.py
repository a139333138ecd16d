"""The cost of multi-key detection per key: one text against K keys (``detect_multi``).

For texts of 128 and 512 tokens (human passages of ``data/human-pydoc.jsonl``, as
``bench.detector_throughput`` cuts them) and K = 1 .. 5,000 keys (m = 4), the wall time of
``detect_multi`` (tokenize and plan once, every key's Aaronson p in one vectorised pass, the
full result of the best 10 keys), best of ``--repeats``; the cost per key is the slope of a
least-squares line through (K, time) for K >= 100, given per key and per (key, scored token).
For comparison, the path it replaced: ``detect`` per key (a Python loop, one full ``Detection``
each), at K = 100.

Writes ``bench/results/multikey_cost.json`` (model, hardware with the CPU model from
/proc/cpuinfo, commit). Under a minute on two shared cores. Run from the repository root::

    python -m bench.multikey_cost [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.common import RESULTS
from bench.detector_common import bench_source, data_home, run_metadata
from bench.detector_throughput import texts_of_512_tokens
from detector import detect, detect_multi
from keyed import warm_up
from sampler.models import DEFAULT_MODEL, load_tokenizer

OUT_JSON = RESULTS / "multikey_cost.json"
KEYS = (1, 10, 100, 1000, 2000, 5000)
TEXT_TOKENS = (128, 512)
DETAILED = 10
LOOP_KEYS = 100


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warm_up()
    tokenizer = load_tokenizer(DEFAULT_MODEL, data_home())
    (long_text,) = texts_of_512_tokens(tokenizer, 1)
    ids = tokenizer(long_text, add_special_tokens=False)["input_ids"]
    texts = {n: tokenizer.decode(ids[:n]) for n in TEXT_TOKENS}
    sources = {f"pmk_{k:016x}": bench_source(f"multikey-{k}") for k in range(max(KEYS))}
    rows: list[dict[str, Any]] = []
    for tokens, text in texts.items():
        for k in KEYS:
            chosen = dict(list(sources.items())[:k])
            found = detect_multi(tokenizer, chosen, text=text, detailed=DETAILED)
            seconds = best_seconds(
                lambda c=chosen, t=text: detect_multi(tokenizer, c, text=t, detailed=DETAILED),
                args.repeats,
            )
            rows.append(
                {
                    "text_tokens": tokens,
                    "scored_tokens": int(found.best.num_scored),
                    "keys": k,
                    "seconds": round(seconds, 5),
                }
            )
            print(f"{tokens:4d} tokens  K={k:5d}  {seconds * 1e3:9.2f} ms", flush=True)
    fits = {}
    for tokens in TEXT_TOKENS:
        mine = [r for r in rows if r["text_tokens"] == tokens and r["keys"] >= 100]
        slope, intercept = np.polyfit([r["keys"] for r in mine], [r["seconds"] for r in mine], 1)
        scored = mine[0]["scored_tokens"]
        fits[str(tokens)] = {
            "scored_tokens": scored,
            "us_per_key": round(slope * 1e6, 2),
            "ns_per_key_and_scored_token": round(slope * 1e9 / scored, 1),
            "fixed_ms": round(intercept * 1e3, 2),
        }
    loop_text = texts[512]
    loop_sources = list(sources.values())[:LOOP_KEYS]
    loop = best_seconds(lambda: [detect(tokenizer, s, text=loop_text) for s in loop_sources], 1)
    vectorised = next(r for r in rows if r["text_tokens"] == 512 and r["keys"] == LOOP_KEYS)
    result = {
        "benchmark": "multikey_cost",
        **run_metadata(),
        "load_average": list(os.getloadavg()),
        "settings": {"context_width": 4, "detailed": DETAILED, "repeats": args.repeats},
        "runs": rows,
        "per_key": fits,
        "detect_per_key_loop_512_tokens": {
            "keys": LOOP_KEYS,
            "seconds": round(loop, 4),
            "us_per_key": round(loop / LOOP_KEYS * 1e6, 1),
            "vectorised_seconds": vectorised["seconds"],
        },
        "notes": (
            "seconds: best of the repeats, wall clock, one thread; per_key: least-squares slope "
            "over K >= 100 (fixed_ms: its intercept: tokenize, plan, the detailed keys' full "
            "results). The per-key work is one keyed BLAKE2b compression and one Philox per "
            "(key, scored token); the machine is shared (load_average), so these are upper "
            "bounds of an idle core."
        ),
    }
    OUT_JSON.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(fits, indent=2))


if __name__ == "__main__":
    main()
