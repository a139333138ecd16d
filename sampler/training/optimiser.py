"""The optimisation every drafter trainer shares (``sampler.training.distill``,
``sampler.training.eagle_train``).

AdamW over the drafter's parameters, a cosine schedule with linear warm-up
(``transformers.get_cosine_schedule_with_warmup``), gradient-norm clipping, and one seed for the
training randomness (nothing here is keyed). ``Checkpoint`` makes a run resumable: the weights,
the optimiser, the schedule, the training generator and the log in one file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import get_cosine_schedule_with_warmup


@dataclass(frozen=True, kw_only=True)
class Optimisation:
    """The settings every drafter training run shares (the optimiser's, the depth and the seed).

    Attributes:
        lookahead: L levels (or heads) trained per context.
        steps: optimiser steps.
        lr, weight_decay: AdamW's learning rate and decoupled weight decay.
        warmup: linear warm-up steps of the cosine schedule.
        clip: the gradient-norm clip.
        seed: the run's training randomness (data order, anchors, sampled chains, fresh weights).
    Raises:
        ValueError: naming the field and its range.
    """

    lookahead: int = 4
    steps: int = 200
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 10
    clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        self.at_least(lookahead=1, steps=1, warmup=0)
        for name in ("lr", "clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.weight_decay >= 0:  # NaN too
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")

    def at_least(self, **lows: int) -> None:
        """Raise ValueError naming the first integer field below its lower bound."""
        for name, low in lows.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")


class Optimiser:
    """AdamW + cosine warm-up schedule + grad-norm clipping over ``module``'s parameters."""

    def __init__(self, module: torch.nn.Module, config: Optimisation) -> None:
        self.parameters = list(module.parameters())  # frozen ones get no gradient and stay put
        self.clip = config.clip
        self.adamw = torch.optim.AdamW(
            self.parameters, lr=config.lr, weight_decay=config.weight_decay
        )
        self.schedule = get_cosine_schedule_with_warmup(self.adamw, config.warmup, config.steps)

    def step(self, loss: torch.Tensor) -> dict[str, float]:
        """One optimiser step on scalar ``loss``; returns the log entry's loss, the gradient
        norm before clipping and the learning rate the step used."""
        lr = self.schedule.get_last_lr()[0]
        self.adamw.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, self.clip))
        self.adamw.step()
        self.schedule.step()
        return {"loss": float(loss.detach()), "grad_norm": grad_norm, "lr": lr}

    def state_dict(self) -> dict[str, Any]:
        """The AdamW moments and the schedule's position, for a checkpoint."""
        return {"optimiser": self.adamw.state_dict(), "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict``'s output."""
        self.adamw.load_state_dict(state["optimiser"])
        self.schedule.load_state_dict(state["schedule"])


@dataclass
class TrainLog:
    """What a run did: steps, wall seconds of the optimiser steps, per-step entries."""

    steps: int = 0
    seconds: float = 0.0
    log: list[dict[str, Any]] = field(default_factory=list)


class Checkpoint:
    """A resumable run's state in one file (written atomically: a temporary file, then a rename).

    ``run`` describes what was trained (the config as JSON, a hash of the data…); a file
    written for another ``run`` is refused, except for ``steps``: a run resumed with more steps
    continues from the saved step (the cosine schedule stretched to the new total).
    """

    def __init__(self, path: Path, run: dict[str, Any]) -> None:
        self.path = path
        self.run = json.loads(json.dumps(run))
        self.resumed_from = 0

    @staticmethod
    def _comparable(run: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in run.items() if k != "steps"}

    def restore(
        self, module: torch.nn.Module, optimiser: Optimiser, generator: torch.Generator
    ) -> TrainLog:
        """Load the saved state into ``module``, ``optimiser`` and ``generator`` and return its
        log (``resumed_from`` = its step), or a fresh log where there is no file.

        Raises:
            ValueError: the file was written for another run (naming the path).
        """
        if not self.path.is_file():
            return TrainLog()
        saved = torch.load(self.path, weights_only=True)
        if self._comparable(saved.get("run", {})) != self._comparable(self.run):
            raise ValueError(
                f"{self.path} was written for another config or other data; use a new --out"
            )
        module.load_state_dict(saved["module"])
        optimiser.load_state_dict(saved)
        generator.set_state(saved["generator"])
        log = TrainLog(**saved["log"])
        self.resumed_from = log.steps
        return log

    def save(
        self,
        module: torch.nn.Module,
        optimiser: Optimiser,
        generator: torch.Generator,
        log: TrainLog,
    ) -> None:
        """Write the run's state after ``log.steps`` steps."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        state = {
            "run": self.run,
            "module": module.state_dict(),
            **optimiser.state_dict(),
            "generator": generator.get_state(),
            "log": asdict(log),
        }
        torch.save(state, partial)
        partial.replace(self.path)
