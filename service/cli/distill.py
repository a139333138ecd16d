"""``poissonmark distill``: train parallel drafter heads with MDraft
(``sampler.training.distill``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import Progress, TaskID

from service.cli.common import (
    DeviceOpt,
    Json,
    ModelOpt,
    emit_json,
    err,
    errors,
    load,
    out,
    read_settings,
)

if TYPE_CHECKING:
    from sampler.training.distill import TrainState

DATA = Path(__file__).resolve().parents[2] / "data"
DEFAULT_PROMPTS = (DATA / "prompts-eli5.jsonl", DATA / "prompts-summarize.jsonl")


class _TrainingProgress:
    """Progress bars for the rollouts (one per split) and the optimiser steps."""

    def __init__(self, progress: Progress, objective: str, steps: int) -> None:
        self.progress = progress
        self.objective = objective
        self.steps = steps
        self.bars: dict[str, TaskID] = {}

    def data(self, what: str, done: int, total: int) -> None:
        """``prepare_data``'s callback: ``done`` of ``total`` rollouts of one split."""
        if what not in self.bars:
            self.bars[what] = self.progress.add_task(what, total=total)
        self.progress.update(self.bars[what], completed=done)

    def step(self, state: TrainState, loss: float) -> None:
        """``train``'s callback after each optimiser step."""
        from sampler.training.distill import reach_summary

        if "training" not in self.bars:
            self.bars["training"] = self.progress.add_task("training", total=self.steps)
        last = state.log[-1]
        note = f" · held-out {reach_summary(last['eval'])}" if "eval" in last else ""
        description = f"training ({self.objective}) loss {loss:.3f}{note}"
        self.progress.update(self.bars["training"], completed=state.step, description=description)


def distill(
    out_dir: Annotated[Path, typer.Option("--out", help="Where heads, checkpoint and logs go.")],
    objective: Annotated[str, typer.Option(help="mdraft, rkl, fkl or ce.")] = "mdraft",
    alpha: Annotated[
        float, typer.Option(help="MDraft blending coefficient α in [0, 1] (mdraft only).")
    ] = 0.9,
    proposals: Annotated[
        int, typer.Option("--proposals", "-K", help="MDraft drafts K per context (mdraft only).")
    ] = 4,
    lookahead: Annotated[int, typer.Option("--lookahead", "-L", help="Heads L.")] = 4,
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = 300,
    anchors: Annotated[int, typer.Option(help="Contexts per step.")] = 32,
    lr: Annotated[float, typer.Option(help="AdamW peak learning rate.")] = 1e-3,
    warmup: Annotated[int, typer.Option(min=0, help="Steps of linear learning-rate warm-up.")] = 20,
    seed: int = 0,
    eval_every: Annotated[
        int, typer.Option(min=0, help="Held-out τ every N steps (0 = off).")
    ] = 100,
    init: Annotated[
        Path | None,
        typer.Option(
            help="Start from these heads (e.g. off-policy ce heads), as MDraft post-trains."
        ),
    ] = None,
    prompts: Annotated[
        list[Path] | None,
        typer.Option(
            "--prompts", help="Prompt JSONL files (default: the shared ELI5 and summarise sets)."
        ),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Rollout length per prompt.")] = 128,
    model: ModelOpt = None,
    device: DeviceOpt = None,
    as_json: Json = False,
) -> None:
    """Train parallel drafter heads (MDraft); resumes from OUT/checkpoint.pt.

    Use the result as --drafter heads:OUT. On a terminal a progress bar shows the rollouts and
    the training steps with their loss."""
    from sampler.training.distill import DistillConfig, evaluate, reach_summary, train
    from sampler.training.mdraft import Objective
    from sampler.training.rollouts import prepare_data

    settings = read_settings()
    with errors():
        config = DistillConfig(
            objective=Objective.named(objective, alpha, proposals),
            lookahead=lookahead,
            steps=steps,
            anchors=anchors,
            lr=lr,
            warmup=warmup,
            seed=seed,
            eval_every=eval_every,
            init=str(init) if init else None,
        )
        files = list(prompts or DEFAULT_PROMPTS)
        for path in files:
            if not path.is_file():
                raise ValueError(f"--prompts: {path} does not exist")
        loaded = load(settings, model, device, as_json)
        if init is not None:  # fail before the rollouts, not after
            from sampler.drafters.heads import ParallelHeads

            ParallelHeads.load(init, loaded.model)
        # the bars on a terminal only: a pipe or a log gets neither frames nor their end state
        quiet = as_json or not err.is_terminal
        with Progress(console=err, disable=quiet, transient=False) as progress:
            bars = _TrainingProgress(progress, objective, steps)
            data = prepare_data(
                loaded.model, loaded.tokenizer, files, settings.home, max_new_tokens, seed,
                bars.data,
            )  # fmt: skip
            heads, state = train(
                loaded.model, data.train, data.train_hidden, data.heldout, data.heldout_hidden,
                config, out_dir, bars.step,
            )  # fmt: skip
            status = err.status("evaluating on held-out prompts…")
            with status if not quiet else contextlib.nullcontext():
                result = evaluate(heads, loaded.model, data.heldout, data.heldout_hidden)
        (out_dir / "evaluation.json").write_text(json.dumps(result, indent=1) + "\n")
    payload: dict[str, Any] = {
        "out": str(out_dir),
        "objective": objective,
        "steps": state.step,
        "train_seconds": state.seconds,
        "train_rollouts": len(data.train),
        "heldout_rollouts": len(data.heldout),
        "evaluation": result,
    }
    if as_json:
        emit_json(payload)
        return
    out.print(
        f"heads written to {out_dir} after {state.step} steps "
        f"({state.seconds / 60:.1f} min) · held-out {reach_summary(result)}"
    )
    out.print(f"[dim]use: poissonmark generate --drafter heads:{out_dir} …[/]")
