"""Watermarked generations for the detector power benchmark, cached as JSONL.

Real SmolLM2-135M-Instruct generations with ``basic-uwm`` (the autoregressive keyed race; its
output is identical to ``mpfr`` for every drafter, docs/design.md §3), T = 1, top-k 50, 160 new
tokens, on 40 prompts (20 ELI5 + 20 summarisation) chosen by a fixed hash of their id (data
README: split by id, never by position). One fixed bench key; a per-prompt nonce from the id.

The cache ``bench/results/detector_generations.jsonl`` is appended one line per prompt and is
resumable: prompts already present are skipped. ~10 s per generation on 2 CPU cores.

Held-out set: ``--skip 20 --prompts 20 --method mpfr --max-new-tokens 128 --cache
bench/results/detector_heldout.jsonl`` takes the next prompts in the same hash order (ranks
20-29 of each task), never the 40 the statistics were designed on, and samples them with
``mpfr`` (drafter ``ngram``, B = L = 4; its tokens equal ``basic-uwm``'s for the same key).

Run from the repository root::

    python -m bench.detector_generations [--prompts 40] [--max-new-tokens 160]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from bench.detector_common import BENCH_KEY_NAME, DATA, GENERATIONS, bench_source, data_home
from keyed import KeyedSource
from sampler.completion import complete, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.models import DEFAULT_MODEL, load_model
from sampler.processing import Processing


def _rank(prompt_id: str) -> str:
    return hashlib.blake2b(f"detector-power:{prompt_id}".encode(), digest_size=8).hexdigest()


def chosen_prompts(per_task: int, skip: int = 0) -> list[dict[str, object]]:
    """``per_task`` prompts from each of ELI5 and summarise, smallest id hash first, after
    the first ``skip`` of each (the held-out set)."""
    chosen: list[dict[str, object]] = []
    for name in ("prompts-eli5.jsonl", "prompts-summarize.jsonl"):
        with (DATA / name).open(encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        chosen += sorted(rows, key=lambda row: _rank(str(row["id"])))[skip : skip + per_task]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--skip", type=int, default=0, help="prompts of each task to skip")
    parser.add_argument("--method", default="basic-uwm", choices=["basic-uwm", "mpfr"])
    parser.add_argument("--cache", type=Path, default=GENERATIONS)
    args = parser.parse_args()
    cache: Path = args.cache

    done: set[str] = set()
    if cache.exists():
        with cache.open(encoding="utf-8") as f:
            done = {json.loads(line)["id"] for line in f if line.strip()}
    todo = [p for p in chosen_prompts(args.prompts // 2, args.skip) if p["id"] not in done]
    print(f"{len(done)} cached, {len(todo)} to generate -> {cache}")
    if not todo:
        return
    loaded = load_model(DEFAULT_MODEL, data_home(), device="cpu")
    speculative = args.method == "mpfr"
    drafts = 4 if speculative else 1
    processing = Processing(1.0, 50, 1.0)
    config = SamplerConfig(args.method, drafts, drafts, args.max_new_tokens, processing)
    base = bench_source()
    cache.parent.mkdir(parents=True, exist_ok=True)
    for i, prompt in enumerate(todo):
        nonce = int(_rank(str(prompt["id"])), 16)
        source = KeyedSource(base.secret, base.context_width, base.masking, nonce)
        ids = prompt_ids(loaded, messages=prompt["messages"])  # type: ignore[arg-type]
        start = time.perf_counter()
        done_ = complete(loaded, ids, config, source, "ngram" if speculative else None)
        seconds = time.perf_counter() - start
        row = {
            "id": prompt["id"],
            "key": BENCH_KEY_NAME,
            "method": done_.result.method,
            "temperature": 1.0,
            "top_k": 50,
            "max_new_tokens": args.max_new_tokens,
            "nonce": nonce,
            "finish_reason": done_.result.finish_reason,
            "watermark_applied": done_.result.watermark_applied,
            "token_ids": list(done_.result.token_ids),
            "text": done_.text,
            "seconds": round(seconds, 2),
        }
        with cache.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(
            f"[{i + 1}/{len(todo)}] {prompt['id']}: {len(row['token_ids'])} tokens, "  # type: ignore[arg-type]
            f"{seconds:.1f} s, {row['finish_reason']}"
        )


if __name__ == "__main__":
    main()
