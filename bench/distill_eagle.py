"""``poissonmark distill --drafter eagle`` on the real model, then the head it wrote against the
shipped head and ngram in the real decoder.

1. Training: the CLI itself, in a subprocess (``python -m service.cli distill --drafter eagle
   --json``) with the given settings, into ``--out``; its wall time (model load, rollouts,
   teachers, steps, held-out evaluation) and its own report (steps, seconds of the steps,
   held-out τ).
2. AATPS: mpfr of each drafter on held-out prompts (``bench.drafters.measure``: top-k 50, the
   split's prompts never trained on, every output compared with basic-uwm's for the same key and
   nonce).

Writes ``bench/results/<--name>.json`` and ``.md``.

    python -m bench.distill_eagle --home DIR --out DIR [--steps 600] [--batch 256]
        [--max-new-tokens 128] [--train-prompts FILE ...] [--threads 2] [--prompts 20]
        [--tokens 128] [--cells 4x4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, environment
from bench.drafters import measure
from bench.train_eagle import chosen_prompts
from sampler.models import DEFAULT_MODEL, load_model


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run the CLI's training; its JSON report and the wall seconds of the whole command."""
    command = [
        sys.executable, "-m", "service.cli", "distill", "--drafter", "eagle",
        "--model", args.model, "--out", str(args.out), "--steps", str(args.steps),
        "--batch", str(args.batch), "--max-new-tokens", str(args.max_new_tokens),
        "--device", "cpu", "--json",
    ]  # fmt: skip
    for path in args.train_prompts:
        command += ["--prompts", str(path)]
    env = {**os.environ, "POISSONMARK_HOME": str(args.home), "OMP_NUM_THREADS": str(args.threads)}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"distill failed ({done.returncode}): {done.stderr.strip()}")
    report: dict[str, Any] = json.loads(done.stdout)
    return {
        "command": " ".join(command[1:]),
        "torch_threads": args.threads,
        "wall_seconds": round(wall, 1),
        "report": report,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, default=Path("~/.local/share/poissonmark"))
    parser.add_argument("--out", type=Path, required=True, help="where the head goes")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--train-prompts", type=Path, nargs="*", default=[], help="distill's --prompts files"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the training")
    parser.add_argument("--precision", default="gguf", help="the decoder's, for AATPS")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--cells", default="4x4", help="BxL,...")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0])
    parser.add_argument("--skip-training", action="store_true", help="measure --out as it is")
    parser.add_argument("--name", default="distill_eagle")
    args = parser.parse_args()
    args.home, args.out = args.home.expanduser(), args.out.expanduser()
    training = None if args.skip_training else train(args)
    torch.set_num_threads(1)
    loaded = load_model(args.model, args.home, device="cpu", precision=args.precision)
    cells = [(int(b), int(n)) for b, _, n in (c.partition("x") for c in args.cells.split(","))]
    drafters = {
        "ngram": "ngram",
        "eagle (shipped)": "eagle",
        "eagle (distilled)": f"eagle:{args.out}",
    }
    prompts = chosen_prompts(0, args.prompts)
    results, costs = measure(
        loaded, drafters, {name: cells for name in drafters}, prompts, args.temperatures,
        args.tokens, report=True,
    )  # fmt: skip
    provenance = json.loads((args.out / "provenance.json").read_text())
    payload = {
        "what": "poissonmark distill --drafter eagle on the real model: training, then mpfr "
        "AATPS of its head against the shipped head and ngram on held-out prompts, top-k 50",
        "model": args.model,
        "training": training,
        "head": provenance,
        "decoder": {"precision": args.precision, "backend": loaded.target.backend()},
        "prompts": [p["id"] for p in prompts],
        "max_new_tokens": args.tokens,
        "temperatures": args.temperatures,
        "drafters": drafters,
        "cells": results,
        "drafting_cost": costs,
        **environment(),
    }
    (RESULTS / f"{args.name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (RESULTS / f"{args.name}.md").write_text(summary(payload, args.name))


def summary(payload: dict[str, Any], name: str) -> str:
    """The record's Markdown page: the run, then AATPS per drafter and cell."""
    head, training = payload["head"], payload["training"]
    run = (
        f"`poissonmark {training['command'].split(' ', 2)[2]}` took "
        f"{training['wall_seconds'] / 60:.1f} min wall in all"
        if training
        else "(training not timed here)"
    )
    taus = ", ".join(f"{k}: τ = {v['tau']:.3f}" for k, v in head["evaluation"].items())
    lines = [
        "# `poissonmark distill --drafter eagle` on the real model",
        "",
        f"Model {payload['model']}; CPU {payload['hardware']['cpu']} "
        f"({payload['hardware']['cores']} cores, shared with other work: times indicative); "
        f"commit {payload['commit']}{' (dirty tree)' if payload['dirty_tree'] else ''}, "
        f"{payload['date']}. Record: [`{name}.json`]({name}.json).",
        "",
        f"Training: {run}: {head['train_rollouts']} rollouts of the train-split prompts (up to "
        f"{head['max_new_tokens']} new tokens), {head['roots']} roots, draft vocabulary "
        f"{head['draft_vocab']}, {head['steps']} steps of the `ce` stage in "
        f"{head['train_seconds'] / 60:.1f} min; held-out τ of one chain of L drafts: {taus}.",
        "",
        f"mpfr in the real decoder ({payload['decoder']['backend']}), "
        f"{len(payload['prompts'])} held-out prompts × up to {payload['max_new_tokens']} tokens:",
        "",
        "| drafter | T | B | L | AATPS | acceptance per level | = basic-uwm | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, cell in payload["cells"].items():
        drafter, t, b, lookahead = key.rsplit(" ", 3)
        acceptance = ", ".join(f"{a:.2f}" for a in cell["acceptance_per_level"])
        lines.append(
            f"| {drafter} | {t[2:]} | {b[2:]} | {lookahead[2:]} | {cell['aatps']:.3f} | "
            f"{acceptance} | {'yes' if cell['identical_to_basic_uwm'] else 'NO'} | "
            f"{cell['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
