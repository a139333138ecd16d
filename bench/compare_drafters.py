"""basic-uwm vs mpfr (B = 4, L = 4) for each drafter on shared prompts, real model, this CPU.

Per prompt and method: emitted tokens, target forward passes, AATPS, tokens/s and whether the
mpfr output is identical to basic-uwm for the same key and nonce (drafter invariance).
Resumable: finished prompts are kept in ``<out>.partial.jsonl``.

    python -m bench.compare_drafters [--prompts 20] [--tokens 64] [--drafters ngram self:4 self:12]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
from pathlib import Path

from rich.progress import track

from bench.common import RESULTS, environment, shared_prompts
from keyed import KeyedSource, Secret
from sampler.completion import complete, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.models import DEFAULT_MODEL, load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--drafters", nargs="+", default=["ngram", "self:4", "self:12"])
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "drafters_cpu.json")
    parser.add_argument(
        "--finalize",
        action="store_true",
        help="summarise the prompts finished so far without generating more",
    )
    args = parser.parse_args()

    loaded = load_model(DEFAULT_MODEL, args.home, device="auto")
    partial = args.out.with_suffix(".partial.jsonl")
    done = {}
    if partial.exists():
        done = {r["id"]: r for r in map(json.loads, partial.read_text().splitlines())}
    prompts = shared_prompts(args.prompts)
    for i, row in enumerate(track(prompts, description="prompts")):
        if row["id"] in done or args.finalize:
            continue
        source = KeyedSource(Secret(hashlib.sha256(b"bench-key-%d" % i).digest()), 4, True, i)
        ids = prompt_ids(loaded, messages=row["messages"])
        runs = {}
        ref = complete(loaded, ids, SamplerConfig("basic-uwm", max_new_tokens=args.tokens), source)
        for name, config, drafter in [("basic-uwm", None, None)] + [
            (f"mpfr/{d}", SamplerConfig("mpfr", 4, 4, args.tokens), d) for d in args.drafters
        ]:
            out = ref if config is None else complete(loaded, ids, config, source, drafter)
            s = out.result.stats
            runs[name] = {
                "emitted_tokens": s.emitted_tokens,
                "target_forward_passes": s.target_forward_passes,
                "drafter_calls": s.drafter_calls,
                "aatps": s.aatps,
                "seconds": s.seconds,
                "tokens_per_second": s.tokens_per_second,
                "identical_to_basic_uwm": out.result.token_ids == ref.result.token_ids,
            }
        record = {"id": row["id"], "prompt_tokens": len(ids), "runs": runs}
        with partial.open("a") as f:
            f.write(json.dumps(record) + "\n")
        done[row["id"]] = record

    rows = [done[r["id"]] for r in prompts if r["id"] in done]
    summary = {}
    for name in rows[0]["runs"]:
        cells = [r["runs"][name] for r in rows]
        summary[name] = {
            "emitted_tokens": sum(c["emitted_tokens"] for c in cells),
            "target_forward_passes": sum(c["target_forward_passes"] for c in cells),
            "aatps_mean": statistics.fmean(c["aatps"] for c in cells),
            "tokens_per_second_mean": statistics.fmean(c["tokens_per_second"] for c in cells),
            "identical": sum(c["identical_to_basic_uwm"] for c in cells),
            "prompts": len(cells),
        }
    base = summary["basic-uwm"]["tokens_per_second_mean"]
    for entry in summary.values():
        entry["speed_vs_basic_uwm"] = entry["tokens_per_second_mean"] / base
    result = {
        "benchmark": "basic-uwm vs mpfr per drafter",
        "model": DEFAULT_MODEL,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype),
        "config": {
            "drafts": 4,
            "lookahead": 4,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
            "max_new_tokens": args.tokens,
            "prompts": len(rows),
            "prompts_planned": len(prompts),
        },
        "load_average_at_end": os.getloadavg(),
        **environment(),
        "summary": summary,
        "per_prompt": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
