"""Drafters: Q_k(·|c), the cheap proposals the keyed race verifies (docs/design.md §3).

``base`` holds the ``Drafter`` protocol, its helpers and the drafters that need no training
(n-gram, ``self:N``, ``model:PATH``, ``fixed:TOKEN``); ``heads`` and ``eagle`` the trained heads
on the target's hidden state (their shipped weights in ``heads_data/`` and ``eagle_data/``);
``specs`` builds a drafter from its spec.

May import: ``keyed``, the targets (``sampler.targets.base``, and ``sampler.targets.transformers``
for ``as_target``, which wraps a bare transformers model as a target, and the ``CachedLM`` a
model drafter runs on), and the decoding core's leaf modules ``sampler.tree`` and
``sampler.processing`` (the draft tree a drafter fills, the processed law it drafts from).
Never the decoder, the loop, the batch or the tree chooser.
"""

from sampler.drafters.base import (
    Drafter,
    FixedTokenDrafter,
    ModelDrafter,
    NgramDrafter,
    draft_law,
    feed_target_hidden,
    fresh_drafter,
    model_drafter,
    self_drafter,
    wants_target_hidden,
)
from sampler.drafters.specs import default_drafter, make_drafter

__all__ = [
    "Drafter",
    "FixedTokenDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "default_drafter",
    "draft_law",
    "feed_target_hidden",
    "fresh_drafter",
    "make_drafter",
    "model_drafter",
    "self_drafter",
    "wants_target_hidden",
]
