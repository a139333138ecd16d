"""The drafter trainers' shared optimisation (``sampler.training.optimiser``): configs refuse values
out of range naming the field, and the logged learning rate follows the warm-up and cosine."""

from __future__ import annotations

import re

import pytest
import torch

from sampler.training.eagle_distill import EagleDistillConfig
from sampler.training.eagle_train import EagleTrainConfig
from sampler.training.optimiser import Optimiser


@pytest.mark.parametrize(
    ("make", "field", "bound"),
    [
        (lambda: EagleDistillConfig(batch=0), "batch", ">= 1"),
        (lambda: EagleDistillConfig(level_decay=0.0), "level_decay", "in (0, 1]"),
        (lambda: EagleTrainConfig(anchors=0), "anchors", ">= 1"),
        (lambda: EagleTrainConfig(lr=0.0), "lr", "> 0"),
        (lambda: EagleTrainConfig(lookahead=0), "lookahead", ">= 1"),
        (lambda: EagleDistillConfig(weight_decay=-1.0), "weight_decay", ">= 0"),
        (lambda: EagleDistillConfig(clip=0.0), "clip", "> 0"),
        (lambda: EagleTrainConfig(weight_decay=float("nan")), "weight_decay", ">= 0"),
    ],
)
def test_training_configs_name_the_field_out_of_range(make, field, bound):
    with pytest.raises(ValueError, match=rf"^{field} must be {re.escape(bound)}"):
        make()


def test_the_optimiser_logs_the_rate_each_step_used_and_follows_the_warmup():
    """Linear warm-up from 0 to lr over ``warmup`` steps, then a cosine decay towards 0: the
    rate each entry logs is the one its step applied."""
    module = torch.nn.Linear(3, 1)
    optimiser = Optimiser(module, EagleTrainConfig(lr=0.1, warmup=2, steps=4, clip=10.0))
    rates = []
    for _ in range(4):
        loss = module(torch.ones(1, 3)).sum()
        rates.append(optimiser.step(loss)["lr"])
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.05])
