"""Where decoding time goes on the CPU, on the real model with the bfloat16
runner, in one process:

- ``heads_pass_ms``: one parallel-heads pass (the shipped heads, 1 row), median of 30, through
  the runner's packed bfloat16 LM head against transformers' float32 head;
- ``batched``: 8 ELI5 prompts x 128 tokens, mpfr/ngram B = L = 4 (tree fixed), generated
  together by ``generate_many`` (node budget 16, as the server): seconds in target forwards,
  prefills, drafting (``grow_level``) and the rest of the step (``finish_step``), and their shares.

    python -m bench.decode_costs --out bench/results/decode_costs.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import sampler.batch as batch_module
from bench.common import environment
from keyed import KeyedSource, Secret
from sampler.completion import chat_prompt_ids, eos_ids
from sampler.decoder import SamplerConfig
from sampler.drafters import fresh_drafter, make_drafter
from sampler.invariant import InvariantLlama
from sampler.models import DEFAULT_MODEL, load_model

ROOT = Path(__file__).resolve().parents[1]


def median_ms(f: Callable[[], object], repeats: int = 30) -> float:
    f()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        f()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def heads_pass(loaded: Any) -> dict[str, float]:
    heads = make_drafter("heads", loaded.target).heads  # type: ignore[attr-defined]
    hidden = torch.randn((1, loaded.model.config.hidden_size), generator=torch.Generator())
    token = torch.tensor([42])
    with torch.inference_mode():
        packed = median_ms(lambda: heads.logits(loaded.target, hidden, token))
        # the bare transformers model: its own float32 head
        float32 = median_ms(lambda: heads.logits(loaded.model, hidden, token))
    return {
        "runner_packed_bf16_head": round(packed, 2),
        "transformers_fp32_head": round(float32, 2),
    }


def batched(loaded: Any) -> dict[str, Any]:
    seconds: dict[str, float] = defaultdict(float)
    originals = {}
    for name in ("forward_many", "grow_level", "finish_step", "start_many"):
        original = getattr(batch_module, name)
        originals[name] = original

        def timed(*args: Any, _f: Any = original, _n: str = name, **kwargs: Any) -> Any:
            began = time.perf_counter()
            out = _f(*args, **kwargs)
            seconds[_n] += time.perf_counter() - began
            return out

        setattr(batch_module, name, timed)
    rows = [json.loads(line) for line in (ROOT / "data/prompts-eli5.jsonl").open()][:8]
    ids = [chat_prompt_ids(loaded.tokenizer, messages=r["messages"]) for r in rows]
    drafter = make_drafter("ngram", loaded.target)
    config = SamplerConfig("mpfr", 4, 4, 128)
    requests = [
        (p, config, KeyedSource(Secret(hashlib.sha256(b"k%d" % i).digest()), 4, True, 1000 + i),
         fresh_drafter(drafter))
        for i, p in enumerate(ids)
    ]  # fmt: skip
    try:
        began = time.perf_counter()
        results = batch_module.generate_many(
            loaded.target, requests, eos_ids(loaded), max_batch=8, node_budget=16
        )
        total = time.perf_counter() - began
    finally:
        for name, original in originals.items():
            setattr(batch_module, name, original)
    tokens = sum(len(r.token_ids) for r in results)
    parts = {
        "target_forwards": seconds["forward_many"],
        "prefills": seconds["start_many"],
        "drafting": seconds["grow_level"],
        "walk_race_keep": seconds["finish_step"],
    }
    return {
        "seconds": round(total, 2),
        "tokens": tokens,
        "tokens_per_second": round(tokens / total, 1),
        "seconds_by_part": {k: round(v, 2) for k, v in parts.items()},
        "share_by_part": {k: round(v / total, 3) for k, v in parts.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/decode_costs.json")
    args = parser.parse_args()
    loaded = load_model(DEFAULT_MODEL, args.home, device="cpu", precision="bfloat16")
    assert isinstance(loaded.target, InvariantLlama)
    result = {
        "bench": "decode_costs",
        "model": DEFAULT_MODEL,
        "precision": "bfloat16 (sampler.invariant runner)",
        **environment(),
        "heads_pass_ms": heads_pass(loaded),
        "batched_8x128_mpfr_ngram": batched(loaded),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("heads_pass_ms", "batched_8x128_mpfr_ngram")}))


if __name__ == "__main__":
    main()
