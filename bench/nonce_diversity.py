"""Fresh samples per nonce, and detection power, on the real model (issue 17, item 7).

Two measurements with one key (m = 4, masking on) over 20 shared prompts (``shared_prompts``):

- diversity: for each prompt, 10 calls with different nonces, ``basic-uwm``, 24 new tokens;
  the number of distinct outputs among the 10 (goal: >= 9 on most prompts);
- power: for each prompt, 2 nonces x 64 new tokens; detection of the decoded text with the key
  (``detector.detect``): TPR at alpha = 0.01 (the p-values are valid, so this is TPR at 1 % FPR),
  median log10 p and the mean number of scored tokens.

``mpfr`` outputs equal ``basic-uwm``'s (drafter invariance, held exactly by tests/sampler), so
the autoregressive method stands for both. Run it once on the code before a change (from a
``git worktree`` of that commit, ``--label before``) and once after; each run writes its own
JSON under ``bench/results/`` with model, hardware and commit:

    python -m bench.nonce_diversity --label after
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, shared_prompts
from bench.detector_common import MODEL, bench_secret, data_home, run_metadata
from detector import detect
from keyed import KeyedSource
from sampler.completion import chat_prompt_ids, eos_ids
from sampler.decoder import SamplerConfig, generate
from sampler.models import load_model

KEY_NAME = "poissonmark-bench:nonce-diversity"
WIDTH = 4


def _generate(loaded: Any, ids: list[int], nonce: int, tokens: int, eos: frozenset[int]) -> Any:
    source = KeyedSource(bench_secret(KEY_NAME), WIDTH, True, nonce)
    config = SamplerConfig("basic-uwm", max_new_tokens=tokens)
    return generate(loaded.target, ids, config, source, eos_ids=eos)


def _progress(message: str, started: float) -> None:
    sys.stderr.write(f"[{time.perf_counter() - started:6.0f} s] {message}\n")
    sys.stderr.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="before or after (names the output)")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--nonces", type=int, default=10)
    parser.add_argument("--diversity-tokens", type=int, default=24)
    parser.add_argument("--power-nonces", type=int, default=2)
    parser.add_argument("--power-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (shared cores)")
    parser.add_argument("--skip-diversity", action="store_true", help="power only")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or RESULTS / f"nonce_diversity_{args.label}.json"

    started = time.perf_counter()
    loaded = load_model(MODEL, data_home(), device="cpu")
    eos = eos_ids(loaded)
    prompts = shared_prompts(args.prompts)
    diversity = []
    for row in [] if args.skip_diversity else prompts:
        ids = chat_prompt_ids(loaded.tokenizer, messages=row["messages"])
        outputs = {
            _generate(loaded, ids, 1000 + j, args.diversity_tokens, eos).token_ids
            for j in range(args.nonces)
        }
        diversity.append({"id": row["id"], "distinct": len(outputs)})
        _progress(f"diversity {row['id']}: {len(outputs)} distinct", started)
    power = []
    source = KeyedSource(bench_secret(KEY_NAME), WIDTH, True)
    for row in prompts:
        ids = chat_prompt_ids(loaded.tokenizer, messages=row["messages"])
        for j in range(args.power_nonces):
            result = _generate(loaded, ids, 2000 + j, args.power_tokens, eos)
            text = loaded.tokenizer.decode(list(result.token_ids), skip_special_tokens=False)
            found = detect(loaded.tokenizer, source, text=text)
            a = found.scores["aaronson"]
            power.append(
                {
                    "id": row["id"],
                    "nonce": 2000 + j,
                    "tokens": len(result.token_ids),
                    "num_scored": found.num_scored,
                    "log10_p": a.log10_p_value,
                }
            )
            _progress(f"power {row['id']} nonce {2000 + j}: log10 p {a.log10_p_value:.1f}", started)
    distinct = [d["distinct"] for d in diversity]
    log10 = [p["log10_p"] for p in power]
    payload = {
        "bench": "nonce_diversity",
        "label": args.label,
        **run_metadata(),
        "method": "basic-uwm (= mpfr by drafter invariance)",
        "key": {"name": KEY_NAME, "context_width": WIDTH, "masking": True},
        "processing": "T = 1.0, top-k = 50, top-p = 1.0",
        "torch_threads": torch.get_num_threads(),
        "diversity": {
            "prompts": len(prompts),
            "nonces_per_prompt": args.nonces,
            "new_tokens": args.diversity_tokens,
            "distinct_per_prompt": diversity,
            "prompts_with_at_least_9_distinct": sum(d >= 9 for d in distinct),
            "mean_distinct": statistics.fmean(distinct) if distinct else None,
        },
        "power": {
            "texts": len(power),
            "new_tokens": args.power_tokens,
            "alpha": 0.01,
            "tpr_at_1pct": sum(v < -2.0 for v in log10) / len(log10) if log10 else None,
            "median_log10_p": statistics.median(log10) if log10 else None,
            "mean_num_scored": statistics.fmean(p["num_scored"] for p in power) if power else None,
            "per_text": power,
        },
        "seconds": time.perf_counter() - started,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    summary = {k: payload["diversity"][k] for k in ("prompts_with_at_least_9_distinct",)}
    summary |= {k: payload["power"][k] for k in ("tpr_at_1pct", "median_log10_p")}
    print(json.dumps(summary | {"seconds": round(payload["seconds"])}))


if __name__ == "__main__":
    main()
