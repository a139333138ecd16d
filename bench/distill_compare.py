"""Drafter objectives compared (MDraft paper Table 1 in miniature), real model, this CPU.

As in the MDraft paper (which post-trains an off-policy DFlash drafter), every objective starts
from the same off-policy heads (``--init``: ``poissonmark distill --objective ce``) and gets the
same post-training: steps, anchors, learning rate and seed, for ``mdraft`` (α = 0.9, K = 4,
survival weights), per-prefix ``rkl`` and ``fkl`` (K = 1, uniform) and ``ce`` continued
(resumable checkpoints under ``<home>/drafters/``). Then, for the start and each result, on the
held-out prompts
1. τ, the expected acceptance length of standard speculative sampling with one chain of L = 4
   drafts, at T ∈ {0, 0.6, 1}, and the acceptance per draft position (``distill.evaluate``);
2. the real decoder (exactly ``--tokens`` tokens per prompt: EOS does not stop these runs, so
   every cell compares the same lengths): ``mpfr`` at B ∈ {1, 4}, L ∈ {2, 4} (T = 1, top-k 50),
   AATPS and tokens/s, output identical to ``basic-uwm`` for the same key and nonce, plus
   ``vsps`` (B = 1, L = 4) to
   check τ measured against τ computed.
Writes ``bench/results/distill_objectives.json``, ``distill_objectives.md`` and
``distill_acceptance.png``; copies the best heads (by τ at T = 1) to ``sampler/heads_data/``
(the ``heads`` drafter).

    python -m bench.distill_compare --init DIR [--steps 200] [--anchors 32] [--lr 5e-4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, environment
from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig, generate
from sampler.distill import DistillConfig, evaluate, train
from sampler.heads import SHIPPED_HEADS, HeadsDrafter, ParallelHeads
from sampler.mdraft import Objective
from sampler.models import DEFAULT_MODEL, load_model
from sampler.processing import Processing
from sampler.rollouts import prepare_data

REPO = Path(__file__).resolve().parents[1]
SHIPPED = SHIPPED_HEADS
OBJECTIVES = ("mdraft", "rkl", "fkl", "ce")
CELLS = [("mpfr", 1, 2), ("mpfr", 1, 4), ("mpfr", 4, 2), ("mpfr", 4, 4), ("vsps", 1, 4)]


def _decode(loaded: Any, heldout: list, drafter_for: dict[str, Any], tokens: int) -> dict[str, Any]:
    """Real-decoder cells per drafter, each checked against basic-uwm (same key and nonce)."""
    processing = Processing(1.0, 50, 1.0)
    rows: dict[str, Any] = {}
    references = []
    for i, rollout in enumerate(heldout):
        source = KeyedSource(Secret(hashlib.sha256(b"distill-bench-%d" % i).digest()), 4, True, i)
        prompt = list(rollout.ids[: rollout.prompt_len])
        ref = generate(
            loaded.target,
            prompt,
            SamplerConfig("basic-uwm", max_new_tokens=tokens, processing=processing),
            source,
        )
        references.append((prompt, source, ref))
        rows.setdefault("basic-uwm", []).append(
            {"aatps": ref.stats.aatps, "tokens_per_second": ref.stats.tokens_per_second}
        )
    for name, make in drafter_for.items():
        for method, b, lookahead in CELLS:
            cell = f"{method} B={b} L={lookahead} / {name}"
            for prompt, source, ref in references:
                out = generate(
                    loaded.target,
                    prompt,
                    SamplerConfig(method, b, lookahead, tokens, processing),
                    source,
                    make(),
                )
                rows.setdefault(cell, []).append(
                    {
                        "aatps": out.stats.aatps,
                        "tokens_per_second": out.stats.tokens_per_second,
                        "identical_to_basic_uwm": out.token_ids == ref.token_ids,
                    }
                )
    summary = {}
    for cell, runs in rows.items():
        aatps = [r["aatps"] for r in runs]
        speed = [r["tokens_per_second"] for r in runs]
        summary[cell] = {
            "aatps_mean": statistics.fmean(aatps),
            "aatps_std": statistics.stdev(aatps) if len(aatps) > 1 else 0.0,
            "tokens_per_second_mean": statistics.fmean(speed),
            "identical": sum(r.get("identical_to_basic_uwm", True) for r in runs),
            "prompts": len(runs),
        }
    return summary


def _plot(results: dict[str, Any], path: Path, commit: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
    for ax, temp in zip(axes, ("T=0", "T=0.6", "T=1"), strict=True):
        for name, row in results.items():
            conditional = row["evaluation"][temp]["conditional"]
            ax.plot(range(1, len(conditional) + 1), conditional, marker="o", label=name)
        ax.set_title(f"held-out, {temp}")
        ax.set_xlabel("draft position ℓ")
        ax.set_xticks(range(1, 5))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("P(accept ℓ | ℓ−1 accepted)")
    axes[-1].legend()
    fig.suptitle(
        "SmolLM2-135M-Instruct parallel heads (L = 4), speculative sampling, 2-core "
        f"CPU, commit {commit[:10]}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--init", type=Path, required=True, help="off-policy heads to start from")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--proposals", type=int, default=4)
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES))
    parser.add_argument("--prompts", type=int, default=10, help="held-out prompts to decode")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "distill_objectives.json")
    args = parser.parse_args()
    torch.manual_seed(0)

    loaded = load_model(DEFAULT_MODEL, args.home, device="cpu")
    files = [REPO / "data" / "prompts-eli5.jsonl", REPO / "data" / "prompts-summarize.jsonl"]
    data = prepare_data(loaded.model, loaded.tokenizer, files, args.home)
    results: dict[str, Any] = {}
    heads_of: dict[str, ParallelHeads] = {}
    start = ParallelHeads.load(args.init, loaded.model)
    start_log = json.loads((args.init / "training.json").read_text())
    heads_of["start (ce)"] = start
    results["start (ce)"] = {
        "objective": {"name": "ce", "stage": "off-policy start"},
        "steps": start_log["steps"],
        "train_seconds": start_log["train_seconds"],
        "evaluation": evaluate(start, loaded.model, data.heldout, data.heldout_hidden),
        "out_dir": str(args.init),
    }
    print(
        "start",
        {k: round(v["tau"], 3) for k, v in results["start (ce)"]["evaluation"].items()},
        flush=True,
    )
    for name in args.objectives:
        config = DistillConfig(
            Objective.named(name, proposals=args.proposals),
            4,
            args.steps,
            args.anchors,
            args.lr,
            warmup=10,
            eval_every=100,
            init=str(args.init),
        )
        out_dir = args.home / "drafters" / f"post-{name}-s{args.steps}-a{args.anchors}"
        started = time.perf_counter()
        heads, state = train(
            loaded.model,
            data.train,
            data.train_hidden,
            data.heldout,
            data.heldout_hidden,
            config,
            out_dir,
            lambda s, loss, n=name: (
                print(f"{n} step {s.step} loss {loss:.4f}", flush=True)
                if s.step % 25 == 0
                else None
            ),
        )
        evaluation = evaluate(heads, loaded.model, data.heldout, data.heldout_hidden)
        heads_of[name] = heads
        results[name] = {
            "objective": json.loads(json.dumps(config.objective.__dict__)),
            "steps": start_log["steps"] + state.step,
            "train_seconds": start_log["train_seconds"] + state.seconds,
            "post_train_seconds": state.seconds,
            "wall_seconds_this_call": time.perf_counter() - started,
            "evaluation": evaluation,
            "loss_first_last_25": [
                statistics.fmean(e["loss"] for e in state.log[:25]),
                statistics.fmean(e["loss"] for e in state.log[-25:]),
            ],
            "out_dir": str(out_dir),
        }
        print(name, {k: round(v["tau"], 3) for k, v in evaluation.items()}, flush=True)
    best = max(results, key=lambda n: results[n]["evaluation"]["T=1"]["tau"])
    SHIPPED.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(SHIPPED, ignore_errors=True)
    heads_of[best].save(SHIPPED)
    (SHIPPED / "README.md").write_text(
        f"Parallel heads for SmolLM2-135M-Instruct: off-policy ce start "
        f"({start_log['steps']} steps) then `{best}` post-training ({args.steps} steps, "
        f"{args.anchors} anchors, lr {args.lr}); made by `python -m bench.distill_compare`; "
        "figures in bench/results/distill_objectives.md.\n"
    )

    heldout = data.heldout[: args.prompts]
    drafters = {
        name: (lambda h=heads_of[name]: HeadsDrafter(h, loaded.target, "heads")) for name in results
    }
    from sampler.drafters import NgramDrafter

    drafters["ngram"] = lambda: NgramDrafter(loaded.model.config.vocab_size)
    decoding = _decode(loaded, heldout, drafters, args.tokens)
    payload = {
        "benchmark": "distill_objectives",
        "model": DEFAULT_MODEL,
        "environment": environment(),
        "setup": {
            "init": str(args.init),
            "init_steps": start_log["steps"],
            "init_anchors": start_log["config"]["anchors"],
            "init_lr": start_log["config"]["lr"],
            "steps": args.steps,
            "anchors": args.anchors,
            "lr": args.lr,
            "lookahead": 4,
            "proposals": args.proposals,
            "train_rollouts": len(data.train),
            "heldout_rollouts": len(data.heldout),
            "rollout_tokens": 128,
            "decode_prompts": len(heldout),
            "decode_tokens": args.tokens,
        },
        "objectives": results,
        "best": best,
        "decoding": decoding,
    }
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    _plot(results, args.out.with_name("distill_acceptance.png"), payload["environment"]["commit"])
    print(json.dumps({"best": best, "decoding": decoding}, indent=1))


if __name__ == "__main__":
    main()
