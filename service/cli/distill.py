"""``poissonmark distill``: train a drafter for the model at hand from its own generations —
parallel heads with MDraft (``sampler.training.distill``) or the eagle head
(``sampler.training.eagle_distill.distill_eagle``).

Without ``--out`` the drafter goes to ``<data dir>/drafters/<fingerprint>/<drafter>``, where
``generate --drafter eagle|heads`` and ``serve`` find it for this model
(``sampler.drafters.heads.find_trained``).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import Progress, TaskID, TimeElapsedColumn

from service.cli.common import (
    DeviceOpt,
    Json,
    ModelOpt,
    emit_json,
    err,
    errors,
    fail,
    load,
    out,
    read_settings,
)

if TYPE_CHECKING:
    from sampler.drafters.eagle import EagleHead
    from sampler.models import LoadedModel
    from sampler.training.distill import TrainState
    from sampler.training.optimiser import TrainLog

DATA = Path(__file__).resolve().parents[2] / "data"
DEFAULT_PROMPTS = (DATA / "prompts-eli5.jsonl", DATA / "prompts-summarize.jsonl")
DRAFTERS = ("heads", "eagle")
DEFAULTS: dict[str, dict[str, Any]] = {
    "heads": {"objective": "mdraft", "lookahead": 4, "steps": 300, "lr": 1e-3},
    "eagle": {"objective": "ce", "lookahead": 6, "steps": 2000, "lr": 2e-3},
}
"""Per drafter, the value of each option left out."""
EAGLE_EVAL_TEMPERATURES = (0.6, 1.0)


def progress_bars(quiet: bool) -> Progress:
    """Rich's bars (description, bar, percentage, the estimate of the time left) and the time
    spent; on a terminal only: a pipe or a log gets neither frames nor their end state."""
    return Progress(
        *Progress.get_default_columns(), TimeElapsedColumn(), console=err, disable=quiet
    )


class TrainingProgress:
    """Progress bars for the rollouts (one per split) and the optimiser steps."""

    def __init__(self, progress: Progress, label: str, steps: int) -> None:
        self.progress = progress
        self.label = label
        self.steps = steps
        self.bars: dict[str, TaskID] = {}

    def data(self, what: str, done: int, total: int) -> None:
        """``prepare_data``'s callback: ``done`` of ``total`` rollouts of one split."""
        if what not in self.bars:
            self.bars[what] = self.progress.add_task(what, total=total)
        self.progress.update(self.bars[what], completed=done)

    def _training(self, step: int, description: str) -> None:
        if "training" not in self.bars:  # from the step before: a resumed run's estimate
            self.bars["training"] = self.progress.add_task(  # counts this run's steps only
                description, total=self.steps, completed=step - 1
            )
        self.progress.update(self.bars["training"], completed=step, description=description)

    def step(self, state: TrainState, loss: float) -> None:
        """``sampler.training.distill.train``'s callback after each optimiser step."""
        from sampler.training.distill import reach_summary

        last = state.log[-1]
        note = f" · held-out {reach_summary(last['eval'])}" if "eval" in last else ""
        self._training(state.step, f"training ({self.label}) loss {loss:.3f}{note}")

    def fit_step(self, head: EagleHead, log: TrainLog) -> None:
        """``sampler.training.eagle_distill.fit``'s callback after each optimiser step."""
        self._training(log.steps, f"training ({self.label}) loss {log.log[-1]['loss']:.3f}")


def distill(
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Where the drafter, its checkpoint and logs go (default: the data dir's "
            "drafters/<model fingerprint>/<drafter>, where generate and serve find it).",
        ),
    ] = None,
    drafter: Annotated[
        str, typer.Option(help="heads (parallel heads) or eagle (the eagle head).")
    ] = "heads",
    objective: Annotated[
        str | None,
        typer.Option(help="heads: mdraft (default), rkl, fkl or ce; eagle: ce."),
    ] = None,
    alpha: Annotated[
        float, typer.Option(help="MDraft blending coefficient α in [0, 1] (mdraft only).")
    ] = 0.9,
    proposals: Annotated[
        int, typer.Option("--proposals", "-K", help="MDraft drafts K per context (mdraft only).")
    ] = 4,
    lookahead: Annotated[
        int | None,
        typer.Option(
            "--lookahead", "-L", help="Heads L, or the eagle head's levels (heads 4; eagle 6)."
        ),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="Optimiser steps (heads 300; eagle 2000).")
    ] = None,
    anchors: Annotated[int, typer.Option(help="Contexts per step (heads).")] = 32,
    batch: Annotated[int, typer.Option(help="Roots per step (eagle).")] = 256,
    draft_vocab: Annotated[
        int,
        typer.Option(help="Tokens the eagle head drafts, the most likely ones (0: all)."),
    ] = 16384,
    lr: Annotated[
        float | None, typer.Option(help="AdamW peak learning rate (heads 1e-3; eagle 2e-3).")
    ] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Steps of linear learning-rate warm-up.")] = 20,
    seed: int = 0,
    eval_every: Annotated[
        int, typer.Option(min=0, help="Held-out τ every N steps (0 = off; heads).")
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
    """Train a drafter for the model from its own generations; resumes from OUT/checkpoint.pt.

    --drafter eagle trains the eagle head (one decoder layer drafting level by level),
    --drafter heads parallel heads with MDraft. Without --out it goes where generate and serve
    find it for this model by its fingerprint (--drafter eagle or heads; an eagle head becomes
    the model's default drafter). A rerun continues from the checkpoint, with more --steps too.
    On a terminal progress bars show the rollouts and the training steps with their loss and
    the time left."""
    if drafter not in DRAFTERS:
        fail(f"--drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
    defaults = DEFAULTS[drafter]
    chosen = {
        "objective": objective or defaults["objective"],
        "lookahead": defaults["lookahead"] if lookahead is None else lookahead,
        "steps": defaults["steps"] if steps is None else steps,
        "lr": defaults["lr"] if lr is None else lr,
    }
    files = list(prompts or DEFAULT_PROMPTS)
    if drafter == "eagle":
        if chosen["objective"] != "ce":
            fail("--objective: the eagle head trains by ce; mdraft, rkl and fkl are for heads")
        if init is not None:
            fail("--init: heads to start from are for --drafter heads")
        _distill_eagle(
            out_dir, files, max_new_tokens, model, device, as_json,
            lookahead=chosen["lookahead"], steps=chosen["steps"], batch=batch, lr=chosen["lr"],
            warmup=warmup, seed=seed, draft_vocab=draft_vocab,
        )  # fmt: skip
        return
    _distill_heads(
        out_dir, files, max_new_tokens, model, device, as_json, init,
        objective=chosen["objective"], alpha=alpha, proposals=proposals,
        lookahead=chosen["lookahead"], steps=chosen["steps"], anchors=anchors, lr=chosen["lr"],
        warmup=warmup, seed=seed, eval_every=eval_every,
    )  # fmt: skip


def check_prompts(files: list[Path]) -> None:
    """Raise ValueError naming a prompt file that does not exist."""
    for path in files:
        if not path.is_file():
            raise ValueError(f"--prompts: {path} does not exist")


def default_out(loaded: LoadedModel, home: Path, stem: str) -> Path:
    """``<data dir>/drafters/<fingerprint>/<stem>`` (``sampler.drafters.heads.trained_dir``)."""
    from sampler.drafters.heads import trained_dir

    return trained_dir(home, loaded.model, stem)


def _distill_heads(
    out_dir: Path | None,
    files: list[Path],
    max_new_tokens: int,
    model: str | None,
    device: str | None,
    as_json: bool,
    init: Path | None,
    **options: Any,
) -> None:
    """Parallel heads with MDraft (or a baseline objective); ``options``: ``DistillConfig``'s
    fields, the objective's as ``objective``, ``alpha``, ``proposals``."""
    from sampler.training.distill import DistillConfig, evaluate, reach_summary, train
    from sampler.training.mdraft import Objective
    from sampler.training.rollouts import prepare_data

    settings = read_settings()
    objective = options.pop("objective")
    with errors():
        config = DistillConfig(
            objective=Objective.named(objective, options.pop("alpha"), options.pop("proposals")),
            init=str(init) if init else None,
            **options,
        )
        check_prompts(files)
        loaded = load(settings, model, device, as_json)
        if init is not None:  # fail before the rollouts, not after
            from sampler.drafters.heads import ParallelHeads

            ParallelHeads.load(init, loaded.model)
        found = default_out(loaded, settings.home, "heads")
        out_dir = out_dir or found
        quiet = as_json or not err.is_terminal
        with progress_bars(quiet) as progress:
            bars = TrainingProgress(progress, objective, config.steps)
            data = prepare_data(
                loaded.model, loaded.tokenizer, files, settings.home, max_new_tokens,
                config.seed, bars.data,
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
        "drafter": "heads",
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
    spec = "heads" if out_dir == found else f"heads:{out_dir}"
    out.print(f"[dim]use: poissonmark generate --drafter {spec} …[/]")


def _distill_eagle(
    out_dir: Path | None,
    files: list[Path],
    max_new_tokens: int,
    model: str | None,
    device: str | None,
    as_json: bool,
    draft_vocab: int,
    **options: Any,
) -> None:
    """The eagle head from the model's own rollouts (``sampler.training.rollouts.prepare_data``,
    then ``sampler.training.eagle_distill.distill_eagle``), evaluated on the held-out prompts
    (``sampler.training.eagle_train.evaluate``: τ of one chain of L drafts), with its
    provenance; ``options``: ``EagleDistillConfig``'s fields."""
    from sampler.drafters.heads import target_fingerprint
    from sampler.training.eagle_distill import EagleDistillConfig
    from sampler.training.eagle_distill import distill_eagle as train
    from sampler.training.eagle_train import evaluate
    from sampler.training.rollouts import prepare_data

    settings = read_settings()
    started = time.perf_counter()
    with errors():
        config = EagleDistillConfig(**options)
        if draft_vocab < 0:
            raise ValueError(f"--draft-vocab must be >= 0, got {draft_vocab}")
        check_prompts(files)
        # the float32 transformers weights train (bfloat16 autocast); no serving backend
        loaded = load(settings, model, device, as_json, "float32")
        found = default_out(loaded, settings.home, "eagle")
        out_dir = out_dir or found
        quiet = as_json or not err.is_terminal
        with progress_bars(quiet) as progress:
            bars = TrainingProgress(progress, "eagle, ce", config.steps)
            data = prepare_data(
                loaded.model, loaded.tokenizer, files, settings.home, max_new_tokens,
                config.seed, bars.data,
            )  # fmt: skip
            run = train(
                loaded.model, data.train, data.train_hidden, config, out_dir, draft_vocab,
                bars.fit_step,
            )  # fmt: skip
            status = err.status("evaluating on held-out prompts…")
            with status if not quiet else contextlib.nullcontext():
                result = evaluate(
                    run.head, loaded.model, data.heldout, data.heldout_hidden, config.lookahead,
                    EAGLE_EVAL_TEMPERATURES,
                )  # fmt: skip
        (out_dir / "evaluation.json").write_text(json.dumps(result, indent=1) + "\n")
        provenance = {
            "drafter": "eagle",
            "made_by": "poissonmark distill --drafter eagle",
            "model": loaded.name,
            "target": target_fingerprint(loaded.model),
            "objective": "ce",
            "device": str(loaded.device),
            "prompt_files": [str(f) for f in files],
            "max_new_tokens": max_new_tokens,
            "train_rollouts": len(data.train),
            "heldout_rollouts": len(data.heldout),
            "roots": run.roots,
            "draft_vocab": run.draft_vocab,
            "steps": run.log.steps,
            "train_seconds": round(run.log.seconds, 1),
            "evaluation": result,
        }
        (out_dir / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    payload: dict[str, Any] = {
        "out": str(out_dir),
        "drafter": "eagle",
        "objective": "ce",
        "steps": run.log.steps,
        "resumed_from": run.resumed_from,
        "train_seconds": run.log.seconds,
        "seconds": time.perf_counter() - started,
        "train_rollouts": len(data.train),
        "heldout_rollouts": len(data.heldout),
        "draft_vocab": run.draft_vocab,
        "evaluation": result,
    }
    if as_json:
        emit_json(payload)
        return
    taus = ", ".join(f"{k}: τ={v['tau']:.3f}" for k, v in result.items())
    out.print(
        f"eagle head written to {out_dir} after {run.log.steps} steps "
        f"({run.log.seconds / 60:.1f} min) · held-out {taus}"
    )
    spec = "eagle" if out_dir == found else f"eagle:{out_dir}"
    out.print(f"[dim]use: poissonmark generate --drafter {spec} …[/]")
