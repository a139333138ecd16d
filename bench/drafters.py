"""Drafters compared in the real decoder: AATPS and acceptance per level of ``mpfr`` (T = 1,
top-k 50) for ngram, the shipped parallel heads and eagle heads (``sampler.eagle``), on
held-out prompts (``sampler.rollouts.split_of``: never trained on), every output checked
identical to ``basic-uwm`` for the same key and nonce.

AATPS = emitted tokens / target forwards (``GenerationStats.aatps``), pooled over the prompts
of a cell; acceptance at level ℓ = P(the target's token at depth ℓ − 1 was drafted | the walk
reached depth ℓ − 1): accepted at level ℓ / accepted at level ℓ − 1 (level 1: / steps that
drafted). Wall seconds are this shared CPU's and only indicative.

Writes ``bench/results/drafters.json`` and ``drafters.md``.

    python -m bench.drafters --eagle NAME=DIR [--eagle NAME=DIR ...] [--prompts 4]
        [--tokens 64] [--cells 4x4,8x6] [--precision gguf]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, environment
from bench.train_eagle import chosen_prompts
from keyed import KeyedSource, Secret
from sampler.completion import chat_prompt_ids
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import make_drafter
from sampler.models import DEFAULT_MODEL, load_model
from sampler.processing import Processing

PROCESSING = Processing(1.0, 50, 1.0)


def _cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    emitted = sum(r["emitted"] for r in runs)
    forwards = sum(r["forwards"] for r in runs)
    depth = max(len(r["drafted_per_level"]) for r in runs)
    accepted = [0] * depth
    drafted = [0] * depth
    for r in runs:
        for i, count in enumerate(r["accepted_per_level"]):
            accepted[i] += count
        for i, count in enumerate(r["drafted_per_level"]):
            drafted[i] += count
    reached = [drafted[0], *accepted[:-1]]  # steps whose walk reached level ℓ − 1
    return {
        "aatps": emitted / max(forwards, 1),
        "aatps_per_prompt": [r["emitted"] / max(r["forwards"], 1) for r in runs],
        "acceptance_per_level": [
            a / n if n else 0.0 for a, n in zip(accepted, reached, strict=True)
        ],
        "identical_to_basic_uwm": all(r["identical"] for r in runs),
        "emitted": emitted,
        "forwards": forwards,
        "seconds": sum(r["seconds"] for r in runs),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eagle", action="append", default=[], help="NAME=DIR")
    parser.add_argument("--home", type=Path, default=Path("~/.local/share/poissonmark"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--precision", default="gguf")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--cells", default="4x4,8x6")
    parser.add_argument("--out", default="drafters")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(args.model, args.home.expanduser(), device="cpu", precision=args.precision)
    target = loaded.target
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    drafters = {"ngram": "ngram", "heads (shipped)": "heads"}
    for item in args.eagle:
        name, _, path = item.partition("=")
        drafters[name] = f"eagle:{path}"
    prompts = chosen_prompts(0, args.prompts)
    eos = frozenset({loaded.tokenizer.eos_token_id})
    refs = []
    for i, record in enumerate(prompts):
        ids = chat_prompt_ids(loaded.tokenizer, record.get("prompt"), record.get("messages"))
        source = KeyedSource(Secret(hashlib.sha256(b"drafters-bench-%d" % i).digest()), 4, True, i)
        config = SamplerConfig("basic-uwm", max_new_tokens=args.tokens, processing=PROCESSING)
        refs.append((ids, source, generate(target, ids, config, source, eos_ids=eos)))
    results: dict[str, Any] = {}
    for name, spec in drafters.items():
        for b, lookahead in cells:
            runs = []
            for (ids, source, ref), record in zip(refs, prompts, strict=True):
                config = SamplerConfig("mpfr", b, lookahead, args.tokens, PROCESSING)
                drafter = make_drafter(spec, target)
                started = time.perf_counter()
                out = generate(target, ids, config, source, drafter, eos_ids=eos)
                runs.append(
                    {
                        "prompt": record["id"],
                        "emitted": out.stats.emitted_tokens,
                        "forwards": out.stats.target_forward_passes,
                        "accepted_per_level": list(out.stats.accepted_per_level),
                        "drafted_per_level": list(out.stats.drafted_per_level),
                        "identical": out.token_ids == ref.token_ids,
                        "seconds": time.perf_counter() - started,
                    }
                )
            results[f"{name} B={b} L={lookahead}"] = cell = _cell(runs)
            print(
                f"{name} B={b} L={lookahead}: AATPS {cell['aatps']:.3f} "
                f"acc {[round(a, 2) for a in cell['acceptance_per_level']]} "
                f"identical {cell['identical_to_basic_uwm']} {cell['seconds']:.0f}s",
                flush=True,
            )
    payload = {
        "what": "mpfr AATPS per drafter, T = 1, top-k 50, held-out prompts",
        "model": args.model,
        "precision": args.precision,
        "backend": target.backend(),
        "prompts": [p["id"] for p in prompts],
        "max_new_tokens": args.tokens,
        "drafters": drafters,
        "cells": results,
        **environment(),
    }
    (RESULTS / f"{args.out}.json").write_text(json.dumps(payload, indent=1) + "\n")
    lines = [
        "# Drafters in the real decoder: AATPS at T = 1, top-k 50",
        "",
        f"Model {args.model} ({target.backend()}), {len(prompts)} held-out prompts × up to "
        f"{args.tokens} tokens (EOS stops), mpfr; CPU {payload['hardware']['cpu']} "
        f"(shared, wall times indicative only); commit {payload['commit']}"
        f"{' (dirty tree)' if payload['dirty_tree'] else ''}, {payload['date']}.",
        "",
        "| drafter | B | L | AATPS | acceptance per level | = basic-uwm | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, cell in results.items():
        name, b, lookahead = key.rsplit(" ", 2)
        acceptance = ", ".join(f"{a:.2f}" for a in cell["acceptance_per_level"])
        lines.append(
            f"| {name} | {b[2:]} | {lookahead[2:]} | {cell['aatps']:.3f} | {acceptance} | "
            f"{'yes' if cell['identical_to_basic_uwm'] else 'NO'} | {cell['seconds']:.0f} |"
        )
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
