"""Target rollouts for training the eagle head (``sampler.drafters.eagle``), with the target's
hidden states: ``--samples`` continuations per train-split prompt at each ``--temperatures`` (top-k
``--top-k``, as the decoder samples), several prompts per ``generate`` call (``--batch`` rows), one
shard per (prompt, temperature) so an interrupted run resumes where it stopped.

A shard ``<out>/<prompt id>-T<t>.pt`` holds ``sampler.training.rollouts.RolloutShard``'s fields: the
rollouts' token ids and the target's final (normed) hidden states from position
``prompt_len − 2`` on (what the head and its teacher read at every continuation anchor).
Held-out prompts (``sampler.training.rollouts.split_of``) are never sampled.

    python -m bench.eagle_data --out DIR [--samples 16] [--temperatures 1 0.7]
        [--max-new-tokens 192] [--precision bfloat16]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench.common import DATA, PROMPT_FILES
from sampler.models import DEFAULT_MODEL, load_model
from sampler.training.rollouts import load_prompts, prompt_ids, sample_shards, split_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--home", type=Path, default=Path("~/.local/share/poissonmark"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--prompts", type=int, default=0, help="at most this many (0: all)")
    parser.add_argument("--batch", type=int, default=96, help="rows per generate call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out: Path = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    prompts = [
        p
        for p in load_prompts([DATA / name for name in PROMPT_FILES])
        if split_of(p["id"]) == "train"
    ]
    if args.prompts:
        prompts = prompts[: args.prompts]
    loaded = load_model(args.model, args.home.expanduser(), device="cpu", dtype=torch.bfloat16)
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    started = time.perf_counter()
    tokens = 0
    for temperature in args.temperatures:
        todo = [p for p in prompts if not (out / f"{p['id']}-T{temperature:g}.pt").is_file()]
        per_call = max(1, args.batch // args.samples)
        for start in range(0, len(todo), per_call):
            group = todo[start : start + per_call]
            shards = sample_shards(
                loaded.model,
                [(p["id"], prompt_ids(loaded.tokenizer, p)) for p in group],
                args.samples,
                temperature,
                args.top_k,
                args.max_new_tokens,
                pad,
                tokenizer.eos_token_id,
                args.seed,
            )
            for prompt, shard in zip(group, shards, strict=True):
                shard.save(out / f"{prompt['id']}-T{temperature:g}.pt")
                tokens += shard.continuation_tokens()
            wall = time.perf_counter() - started
            print(
                f"T={temperature:g}: {start + len(group)}/{len(todo)} prompts, "
                f"{tokens} new tokens, {tokens / wall:.0f}/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
