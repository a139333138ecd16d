"""Train the eagle head (``sampler.drafters.eagle``) for the real target on this CPU, both
objectives.

1. Data: the rollout shards of ``bench.eagle_data`` in ``--data`` (train-split prompts only,
   at T = 1 and T = 0.7, with the target's hidden states). The ``--validation-prompts`` last
   prompts in SHA-256 order of their ids are kept out of training and measure the heads.
2. ``ce``: the cross-entropy baseline from a fresh head (``sampler.training.eagle_distill.fit``):
the
   target's processed law (top-k 50) at every level of the head's own unrolled states,
   ``--ce-steps`` × ``--batch`` roots, L = ``--lookahead``.
3. ``mdraft``: MDraft (α = 0.9, K = ``--proposals``, survival weights) post-training from the
   ``ce`` head (``sampler.training.eagle_train.train``), as the MDraft paper post-trains an
   off-policy drafter: the head's own sampled chains scored by the target.
4. Validation: one-draft acceptance per level, 1 − TV of the processed laws on the target's
   path (``sampler.training.eagle_distill.validate``), at T = 1 and T = 0.7.

Each head goes to ``<out>/<objective>/`` (``eagle.json``, ``eagle.safetensors``,
``provenance.json``: data, steps, objective, seconds, validation, commit); ``ce`` is rewritten
every ``--checkpoint`` steps so an interrupted run keeps its progress.

    python -m bench.train_eagle --data DIR --out DIR [--ce-steps 2000] [--mdraft-steps 300]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.common import PROMPT_FILES, environment, prompts_by_hash
from sampler.drafters.eagle import EagleHead
from sampler.drafters.heads import target_fingerprint
from sampler.models import DEFAULT_MODEL, load_model
from sampler.training.eagle_distill import (
    AnchorData,
    EagleDistillConfig,
    draft_vocabulary,
    fit,
    validate,
    vocabulary_coverage,
)
from sampler.training.eagle_train import EagleTrainConfig, train
from sampler.training.mdraft import Objective
from sampler.training.optimiser import TrainLog
from sampler.training.rollouts import Rollout, RolloutShard, split_of


def chosen_prompts(train: int, heldout: int) -> list[dict[str, Any]]:
    """``train`` prompts of the train split and ``heldout`` of the held-out split, half from
    each shared prompt file, in the order of the SHA-256 of their ids."""
    chosen: list[dict[str, Any]] = []
    for name in PROMPT_FILES:
        rows = prompts_by_hash(name)
        chosen += [r for r in rows if split_of(r["id"]) == "train"][: train // 2]
        chosen += [r for r in rows if split_of(r["id"]) == "heldout"][: heldout // 2]
    return chosen


def _rollouts(shards: list[RolloutShard]) -> tuple[list[Rollout], list[torch.Tensor]]:
    """The shards as ``Rollout``s with (T, d) hidden states (zeros before prompt_len − 2,
    where no anchor reads)."""
    rollouts, hidden = [], []
    for shard in shards:
        for i, (ids, h) in enumerate(zip(shard.ids, shard.hidden, strict=True)):
            rollouts.append(
                Rollout(
                    f"{shard.prompt_id}#{shard.temperature:g}#{i}",
                    shard.prompt_len,
                    tuple(ids.tolist()),
                )
            )
            full = torch.zeros((len(ids), h.shape[1]), dtype=h.dtype)
            full[shard.prompt_len - 2 :] = h
            hidden.append(full)
    return rollouts, hidden


def _validation(head: EagleHead, target: Any, data: AnchorData, lookahead: int) -> dict[str, Any]:
    return {
        f"T={t:g}": [round(a, 4) for a in validate(head, target, data, lookahead, temperature=t)]
        for t in (1.0, 0.7)
    }


def _progress(stage: str, measure: str) -> Callable[[TrainLog], None]:
    """A step callback printing, every 25 steps, the mean of the log entries' ``measure`` over
    those steps and the seconds since the stage began."""
    begun = time.perf_counter()

    def report(log: TrainLog) -> None:
        if log.steps % 25 == 0:
            recent = [e.get(measure, 0.0) for e in log.log[-25:]]
            print(
                f"{stage} step {log.steps} {measure} {sum(recent) / max(len(recent), 1):.4f} "
                f"{time.perf_counter() - begun:.0f}s",
                flush=True,
            )

    return report


def _stage(
    name: str, config: EagleTrainConfig | EagleDistillConfig, log: TrainLog, init: str | None
) -> dict[str, Any]:
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
    parser.add_argument("--data", type=Path, required=True, help="bench.eagle_data's shards")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--home", type=Path, default=Path("~/.local/share/poissonmark"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--validation-prompts", type=int, default=8)
    parser.add_argument("--lookahead", type=int, default=6)
    parser.add_argument("--ce-steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3, help="ce's peak learning rate")
    parser.add_argument(
        "--draft-vocab", type=int, default=16384, help="tokens the head drafts (0: all)"
    )
    parser.add_argument("--mdraft-steps", type=int, default=300)
    parser.add_argument("--mdraft-anchors", type=int, default=16)
    parser.add_argument("--proposals", type=int, default=4)
    parser.add_argument("--mdraft-lr", type=float, default=2e-4)
    parser.add_argument("--checkpoint", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out: Path = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(args.data.expanduser().glob("*.pt"))
    shards = [RolloutShard.load(f) for f in files]
    if not shards:
        raise SystemExit(f"--data {args.data}: no rollout shard (*.pt); run bench.eagle_data")
    for shard in shards:
        if split_of(shard.prompt_id) != "train":
            raise SystemExit(f"--data: {shard.prompt_id} is a held-out prompt")
    ids = sorted({s.prompt_id for s in shards}, key=lambda i: hashlib.sha256(i.encode()).digest())
    held = set(ids[len(ids) - args.validation_prompts :])
    train_shards = [s for s in shards if s.prompt_id not in held]
    valid_shards = [s for s in shards if s.prompt_id in held]
    loaded = load_model(args.model, args.home.expanduser(), device="cpu", dtype=torch.bfloat16)
    target = loaded.model
    started = time.perf_counter()
    data = AnchorData.from_shards(target, train_shards)
    valid = AnchorData.from_shards(target, valid_shards)
    print(f"data: {data.roots.numel()} roots, teachers in {time.perf_counter() - started:.0f}s")
    digest = hashlib.sha256()
    for shard in train_shards:
        for row in shard.ids:
            digest.update(row.numpy().tobytes())
    provenance_data = {
        "made_by": "python -m bench.eagle_data",
        "prompt_files": list(PROMPT_FILES),
        "train_prompt_ids": sorted({s.prompt_id for s in train_shards}),
        "validation_prompt_ids": sorted(held),
        "temperatures": sorted({s.temperature for s in shards}),
        "rollouts_per_temperature": {
            f"T={t:g}": sum(len(s.ids) for s in train_shards if s.temperature == t)
            for t in sorted({s.temperature for s in shards})
        },
        "max_new_tokens": max(max(len(ids) for ids in s.ids) - s.prompt_len for s in train_shards),
        "top_k": sorted({s.top_k for s in shards}),
        "rollouts": sum(len(s.ids) for s in train_shards),
        "rollout_tokens": sum(s.continuation_tokens() for s in train_shards),
        "rollouts_sha256": digest.hexdigest(),
    }
    vocab = int(target.config.vocab_size)
    draft_tokens = None
    if args.draft_vocab:
        draft_tokens = draft_vocabulary(data, args.draft_vocab, vocab)
        provenance_data["draft_vocabulary"] = {
            "size": args.draft_vocab,
            "chosen_by": "teacher probability summed over the training positions",
            "coverage_train": round(vocabulary_coverage(data, draft_tokens, vocab), 5),
            "coverage_validation": round(vocabulary_coverage(valid, draft_tokens, vocab), 5),
        }
        print("draft vocabulary", provenance_data["draft_vocabulary"], flush=True)
    stages: list[dict[str, Any]] = []
    heads: dict[str, EagleHead] = {}
    validation: dict[str, Any] = {}
    if args.ce_steps:
        config = EagleDistillConfig(
            lookahead=args.lookahead,
            steps=args.ce_steps,
            batch=args.batch,
            lr=args.lr,
            warmup=max(1, args.ce_steps // 20),
            seed=args.seed,
        )
        report = _progress("ce", "loss")

        def progress(head: EagleHead, log: TrainLog) -> None:
            report(log)
            if log.steps % args.checkpoint == 0 or log.steps == config.steps:
                head.eval()
                print("  validation", _validation(head, target, valid, args.lookahead), flush=True)
                head.save(out / "ce")
                head.train()

        head, log = fit(target, data, config, None, progress, draft_tokens)
        heads["ce"] = head
        stages.append(_stage("ce", config, log, None))
        (out / "ce" / "stage.json").write_text(json.dumps(stages[-1], indent=1) + "\n")
    else:  # a finished ce stage: its head and record
        heads["ce"] = EagleHead.load(out / "ce", target)
        stages.append(json.loads((out / "ce" / "stage.json").read_text()))
    validation["ce"] = _validation(heads["ce"], target, valid, args.lookahead)
    if args.mdraft_steps:
        rollouts, hidden = _rollouts(train_shards)
        mconfig = EagleTrainConfig(
            objective=Objective.named("mdraft", proposals=args.proposals),
            lookahead=args.lookahead,
            steps=args.mdraft_steps,
            anchors=args.mdraft_anchors,
            lr=args.mdraft_lr,
            warmup=max(1, args.mdraft_steps // 10),
            seed=args.seed,
        )
        head, log = train(
            target, rollouts, hidden, mconfig, heads["ce"], _progress("mdraft", "train_tau")
        )
        head.save(out / "mdraft")
        heads["mdraft"] = head
        stages.append(_stage("mdraft", mconfig, log, "ce"))
        validation["mdraft"] = _validation(head, target, valid, args.lookahead)
    for name, value in validation.items():
        print(name, value)
    env = environment()
    for index, name in enumerate(heads):
        provenance = {
            "drafter": "eagle",
            "model": args.model,
            "target": target_fingerprint(target),
            "objective": name,
            "data": provenance_data,
            "training": stages[: index + 1],
            "validation": {
                "measure": "one-draft acceptance per level, 1 - TV of the top-k 50 laws on the "
                "target's path (sampler.training.eagle_distill.validate), validation prompts",
                **validation[name],
            },
            "commit": env["commit"],
            "dirty_tree": env["dirty_tree"],
            "date": env["date"],
            "hardware": env["hardware"],
            "command": "python -m bench.train_eagle "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        }
        (out / name / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    print(f"heads written to {', '.join(str(out / name) for name in heads)}")


if __name__ == "__main__":
    main()
