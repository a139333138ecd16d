"""Drafters compared in the real decoder: AATPS and acceptance per level of ``mpfr`` (top-k
50, each of ``--temperatures``) for ngram, the shipped parallel heads, the shipped eagle head
and eagle heads given by ``--eagle`` (``sampler.drafters.eagle``), on held-out prompts
(``sampler.training.rollouts.split_of``: never trained on), every output checked identical to
``basic-uwm`` for the same key and nonce. Drafting cost: the wall seconds of the drafter's
calls per level and node count, measured inside the same runs.

AATPS = emitted tokens / target forwards (``GenerationStats.aatps``), pooled over the prompts
of a cell; acceptance at level ℓ = P(the target's token at depth ℓ − 1 was drafted | the walk
reached depth ℓ − 1): accepted at level ℓ / accepted at level ℓ − 1 (level 1: / steps that
drafted). Wall seconds are this shared CPU's and only indicative.

Writes ``bench/results/drafters.json`` and ``drafters.md``.

The shipped eagle head runs twice: through its fused 8-bit level (what decoding uses on the
CPU, ``sampler.drafters.eagle_level``) and through its own float layers (``+float``).

    python -m bench.drafters [--eagle NAME=DIR ...] [--prompts 20] [--tokens 128]
        [--cells 4x4,8x6] [--temperatures 1 0.7] [--precision gguf]
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
from sampler.models import DEFAULT_MODEL, LoadedModel, load_model
from sampler.processing import Processing

TOP_K = 50
MAX_TREE_NODES = 64


class TimedDrafter:
    """A drafter whose ``propose`` (and ``support``, where it has one) calls are timed:
    (level, nodes) -> wall seconds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.costs: dict[tuple[int, int], list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name != "support":
            return attribute

        def support(tree: Any, level: int, committed: list[int], processing: Any) -> Any:
            started = time.perf_counter()
            out = attribute(tree, level, committed, processing)
            key = (level, len(tree.levels[level - 1]))
            self.costs.setdefault(key, []).append(time.perf_counter() - started)
            return out

        return support

    def propose(self, tree: Any, level: int, committed: list[int]) -> torch.Tensor:
        started = time.perf_counter()
        out: torch.Tensor = self.inner.propose(tree, level, committed)
        key = (level, len(tree.levels[level - 1]))
        self.costs.setdefault(key, []).append(time.perf_counter() - started)
        return out


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


def _costs(timed: list[TimedDrafter]) -> dict[str, dict[str, float]]:
    """Mean seconds per call by level and node count, pooled over runs."""
    pooled: dict[tuple[int, int], list[float]] = {}
    for t in timed:
        for key, values in t.costs.items():
            pooled.setdefault(key, []).extend(values)
    return {
        f"level {level}, {nodes} nodes": {"mean_ms": 1e3 * sum(v) / len(v), "calls": len(v)}
        for (level, nodes), v in sorted(pooled.items())
    }


FLOAT = "+float"
"""A spec suffix: the eagle head drafting through its own float layers instead of the fused
8-bit level (``EagleDrafter.fast`` off), for comparing the two."""


def drafter_of(spec: str, target: Any) -> Any:
    """``make_drafter(spec)``; ``<eagle spec>+float``: without the fast level."""
    drafter = make_drafter(spec.removesuffix(FLOAT), target)
    if spec.endswith(FLOAT):
        drafter.fast = None  # type: ignore[attr-defined]
    return drafter


def measure(
    loaded: LoadedModel,
    drafters: dict[str, str],
    cells_of: dict[str, list[tuple[int, int]]],
    prompts: list[dict[str, Any]],
    temperatures: list[float],
    tokens: int,
    report: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """mpfr with each drafter (name -> spec) in each of its (B, L) cells on ``prompts`` at each
    temperature (top-k 50), every output compared with ``basic-uwm``'s for the same key and
    nonce. Returns (cells by ``"<name> T=<t> B=<b> L=<l>"``: ``_cell``'s record, the drafting
    cost per drafter at the first temperature: ``_costs``'s); ``report`` prints each cell."""
    target = loaded.target
    eos = frozenset({loaded.tokenizer.eos_token_id})
    results: dict[str, Any] = {}
    costs: dict[str, Any] = {}
    for temperature in temperatures:
        processing = Processing(temperature, TOP_K, 1.0)
        refs = []
        for i, record in enumerate(prompts):
            ids = chat_prompt_ids(loaded.tokenizer, record.get("prompt"), record.get("messages"))
            secret = Secret(hashlib.sha256(b"drafters-bench-%d" % i).digest())
            source = KeyedSource(secret, 4, True, i)
            config = SamplerConfig("basic-uwm", max_new_tokens=tokens, processing=processing)
            refs.append((ids, source, generate(target, ids, config, source, eos_ids=eos)))
        for name, spec in drafters.items():
            timed: list[TimedDrafter] = []
            for b, lookahead in cells_of[name]:
                runs = []
                for (ids, source, ref), record in zip(refs, prompts, strict=True):
                    config = SamplerConfig("mpfr", b, lookahead, tokens, processing)
                    drafter = TimedDrafter(drafter_of(spec, target))
                    timed.append(drafter)
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
                key = f"{name} T={temperature:g} B={b} L={lookahead}"
                results[key] = cell = _cell(runs)
                if report:
                    print(
                        f"{key}: AATPS {cell['aatps']:.3f} "
                        f"acc {[round(a, 2) for a in cell['acceptance_per_level']]} "
                        f"identical {cell['identical_to_basic_uwm']} {cell['seconds']:.0f}s",
                        flush=True,
                    )
            if temperature == temperatures[0]:
                costs[name] = _costs(timed)
    return results, costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eagle", action="append", default=[], help="NAME=DIR")
    parser.add_argument("--home", type=Path, default=Path("~/.local/share/poissonmark"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--precision", default="gguf")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--cells", default="4x4,8x6", help="BxL,... for every drafter")
    parser.add_argument(
        "--cells-for", action="append", default=[], help="NAME=BxL,...: that drafter's cells"
    )
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    parser.add_argument("--only", nargs="+", default=[], help="run only these drafters (names)")
    parser.add_argument("--out", default="drafters")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(args.model, args.home.expanduser(), device="cpu", precision=args.precision)
    target = loaded.target

    def parse_cells(text: str) -> list[tuple[int, int]]:
        cells = [(int(b), int(n)) for b, _, n in (c.partition("x") for c in text.split(","))]
        for b, lookahead in cells:
            if not 1 <= b <= 8 or b * lookahead + 1 > MAX_TREE_NODES:
                raise SystemExit(f"cell {b}x{lookahead}: B <= 8 and B·L + 1 <= {MAX_TREE_NODES}")
        return cells

    drafters = {
        "ngram": "ngram",
        "heads (shipped)": "heads",
        "eagle (shipped)": "eagle",
        "eagle (shipped, float level)": "eagle" + FLOAT,
    }
    for item in args.eagle:
        name, _, path = item.partition("=")
        drafters[name] = f"eagle:{path}"
    if args.only:
        unknown = set(args.only) - set(drafters)
        if unknown:
            raise SystemExit(f"--only {', '.join(sorted(unknown))}: not a drafter here")
        drafters = {name: spec for name, spec in drafters.items() if name in args.only}
    cells_of = {name: parse_cells(args.cells) for name in drafters}
    for item in args.cells_for:
        name, _, text = item.partition("=")
        if name not in drafters:
            raise SystemExit(f"--cells-for {name}: not a drafter here ({', '.join(drafters)})")
        cells_of[name] = parse_cells(text)
    prompts = chosen_prompts(0, args.prompts)
    results, costs = measure(
        loaded, drafters, cells_of, prompts, args.temperatures, args.tokens, report=True
    )
    payload = {
        "what": "mpfr AATPS per drafter, top-k 50, held-out prompts",
        "model": args.model,
        "precision": args.precision,
        "backend": target.backend(),
        "prompts": [p["id"] for p in prompts],
        "max_new_tokens": args.tokens,
        "temperatures": args.temperatures,
        "drafters": drafters,
        "cells": results,
        "drafting_cost": costs,
        **environment(),
    }
    (RESULTS / f"{args.out}.json").write_text(json.dumps(payload, indent=1) + "\n")
    lines = [
        "# Drafters in the real decoder: AATPS at top-k 50",
        "",
        f"Model {args.model} ({target.backend()}), {len(prompts)} held-out prompts × up to "
        f"{args.tokens} tokens (EOS stops), mpfr; CPU {payload['hardware']['cpu']} "
        f"(wall times indicative only); commit {payload['commit']}"
        f"{' (dirty tree)' if payload['dirty_tree'] else ''}, {payload['date']}. "
        f"Record: [`{args.out}.json`]({args.out}.json).",
        "",
        "| drafter | T | B | L | AATPS | acceptance per level | = basic-uwm | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, cell in results.items():
        name, t, b, lookahead = key.rsplit(" ", 3)
        acceptance = ", ".join(f"{a:.2f}" for a in cell["acceptance_per_level"])
        lines.append(
            f"| {name} | {t[2:]} | {b[2:]} | {lookahead[2:]} | {cell['aatps']:.3f} | "
            f"{acceptance} | {'yes' if cell['identical_to_basic_uwm'] else 'NO'} | "
            f"{cell['seconds']:.0f} |"
        )
    lines += [
        "",
        f"Drafting cost at T = {args.temperatures[0]:g} (mean ms per drafter call, by level "
        "and the level's node count; one torch thread):",
        "",
        "| drafter | level, nodes | ms | calls |",
        "|---|---|---|---|",
    ]
    for name, table in costs.items():
        for where, value in table.items():
            lines.append(f"| {name} | {where} | {value['mean_ms']:.2f} | {value['calls']} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
