"""Train the eagle head (``sampler.eagle``) for the real target on this CPU, both objectives.

1. Data: ``--train-prompts`` prompts of the train split and ``--heldout-prompts`` of the
   held-out split (``sampler.rollouts.split_of``; half ELI5, half summarisation, in a fixed
   hash order), target rollouts at T = 1 and their hidden states (``rollouts.prepare_data``,
   cached under the data dir). Held-out prompts are never trained on.
2. ``ce``: the cross-entropy baseline from a fresh head (``--ce-steps``).
3. ``mdraft``: MDraft (α = 0.9, K = ``--proposals``, survival weights) post-training from the
   ``ce`` head (``--mdraft-steps``), as the MDraft paper post-trains an off-policy drafter.
4. Held-out τ at T = 1 (one chain of L = 4 drafts, ``eagle_train.evaluate``) for both and
   for the shipped parallel heads on the same rollouts (``distill.evaluate``).

Each head goes to ``<out>/<objective>/`` (``eagle.json``, ``eagle.safetensors``,
``provenance.json``: data, steps, objective, seconds, evaluation, commit). Torch runs on one
thread (``--threads``).

    python -m bench.train_eagle --out DIR [--ce-steps 120] [--mdraft-steps 50 (0: none)]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.common import DATA, environment
from sampler.distill import evaluate as heads_evaluate
from sampler.eagle import EagleHead
from sampler.eagle_train import EagleTrainConfig, TrainLog, evaluate, train
from sampler.heads import SHIPPED_HEADS, ParallelHeads, target_fingerprint
from sampler.mdraft import Objective
from sampler.models import DEFAULT_MODEL, load_model
from sampler.rollouts import prepare_data, split_of

PROMPT_FILES = ("prompts-eli5.jsonl", "prompts-summarize.jsonl")


def chosen_prompts(train: int, heldout: int) -> list[dict[str, Any]]:
    """``train`` prompts of the train split and ``heldout`` of the held-out split, half from
    each shared prompt file, in the order of the SHA-256 of their ids."""
    chosen: list[dict[str, Any]] = []
    for name in PROMPT_FILES:
        rows = [json.loads(line) for line in (DATA / name).read_text().splitlines() if line]
        rows.sort(key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
        chosen += [r for r in rows if split_of(r["id"]) == "train"][: train // 2]
        chosen += [r for r in rows if split_of(r["id"]) == "heldout"][: heldout // 2]
    return chosen


def _stage(name: str, config: EagleTrainConfig, log: TrainLog, init: str | None) -> dict[str, Any]:
    losses = [e["loss"] for e in log.log]
    tail = losses[-10:]
    return {
        "objective": name,
        "config": json.loads(json.dumps(asdict(config))),
        "init": init,
        "steps": log.steps,
        "train_seconds": round(log.seconds, 1),
        "loss_first10": sum(losses[:10]) / max(len(losses[:10]), 1),
        "loss_last10": sum(tail) / max(len(tail), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--home", type=Path, default=Path("~/.local/share/poissonmark"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--train-prompts", type=int, default=40)
    parser.add_argument("--heldout-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--ce-steps", type=int, default=120)
    parser.add_argument("--ce-anchors", type=int, default=32)
    parser.add_argument("--mdraft-steps", type=int, default=50)
    parser.add_argument("--mdraft-anchors", type=int, default=8)
    parser.add_argument("--proposals", type=int, default=4)
    parser.add_argument("--lookahead", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3, help="ce's peak learning rate")
    parser.add_argument("--mdraft-lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    home = args.home.expanduser()
    out: Path = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    prompts = chosen_prompts(args.train_prompts, args.heldout_prompts)
    prompt_file = out / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    loaded = load_model(args.model, home, device="cpu", precision="float32")
    target = loaded.model
    data = prepare_data(
        target, loaded.tokenizer, [prompt_file], home, args.max_new_tokens, args.seed
    )
    rollouts = json.dumps([r.ids for r in data.train]).encode()
    provenance_data = {
        "prompt_files": list(PROMPT_FILES),
        "train_prompt_ids": [r.id for r in data.train],
        "heldout_prompt_ids": [r.id for r in data.heldout],
        "rollouts": len(data.train),
        "rollout_tokens": sum(len(r.ids) - r.prompt_len for r in data.train),
        "rollout_temperature": 1.0,
        "max_new_tokens": args.max_new_tokens,
        "rollouts_sha256": hashlib.sha256(rollouts).hexdigest(),
    }
    stages: list[dict[str, Any]] = []
    heads: dict[str, EagleHead] = {}
    plan = [
        ("ce", args.ce_steps, args.ce_anchors, args.lr, None),
        ("mdraft", args.mdraft_steps, args.mdraft_anchors, args.mdraft_lr, "ce"),
    ]
    for name, steps, anchors, lr, init in [stage for stage in plan if stage[1] > 0]:
        config = EagleTrainConfig(
            Objective.named(name, proposals=args.proposals),
            args.lookahead,
            steps,
            anchors,
            lr,
            warmup=max(1, steps // 10),
            seed=args.seed,
        )
        started = time.perf_counter()

        def progress(log: TrainLog, name: str = name, started: float = started) -> None:
            if log.steps % 10 == 0:
                entry = log.log[-1] if log.log else {}
                wall = time.perf_counter() - started
                print(f"{name} step {log.steps} loss {entry.get('loss', 0):.3f} {wall:.0f}s")

        head, log = train(
            target,
            data.train,
            data.train_hidden,
            config,
            heads[init] if init else None,
            progress,
        )
        heads[name] = head
        head.save(out / name)  # kept even if a later stage is interrupted
        stages.append(_stage(name, config, log, init))
    evaluation: dict[str, Any] = {}
    for name, head in heads.items():
        evaluation[f"eagle-{name}"] = evaluate(
            head, target, data.heldout, data.heldout_hidden, args.lookahead
        )["T=1"]
    shipped = ParallelHeads.load(SHIPPED_HEADS, target)
    evaluation["heads (shipped)"] = heads_evaluate(
        shipped, target, data.heldout, data.heldout_hidden, (1.0,)
    )["T=1"]
    for key, value in evaluation.items():
        print(key, f"tau {value['tau']:.3f}", [round(c, 3) for c in value["conditional"]])
    env = environment()
    for index, name in enumerate(heads):
        directory = out / name
        provenance = {
            "drafter": "eagle",
            "model": args.model,
            "target": target_fingerprint(target),
            "objective": name,
            "data": provenance_data,
            "training": stages[: index + 1],
            "evaluation_heldout": {
                "measure": "tau, one chain of L drafts, T = 1 (sampler.eagle_train.evaluate)",
                "rollouts": len(data.heldout),
                **evaluation,
            },
            "commit": env["commit"],
            "dirty_tree": env["dirty_tree"],
            "date": env["date"],
            "hardware": env["hardware"],
            "command": "python -m bench.train_eagle "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        }
        (directory / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    print(f"heads written to {', '.join(str(out / name) for name in heads)}")


if __name__ == "__main__":
    main()
