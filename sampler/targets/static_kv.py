"""One sequence's KV cache on the static-layout target (``sampler.targets.static``): a slot of
its static cache, with ``CachedLM``'s interface.

Shapes: q new tokens, P cached positions, V vocabulary, d hidden size.
"""

from __future__ import annotations

import torch

from sampler.targets.base import Target
from sampler.targets.masks import chain_visible

__all__ = ["StaticCache"]


class SlotTarget(Target):
    """What a ``StaticCache`` needs of its target: a slot of the static cache to take and give
    back, and a keep within it. ``sampler.targets.static.StaticLlama`` is the one
    implementation; it is declared here so that the cache never imports the target that
    imports it."""

    def acquire_slot(self) -> int:
        """A free slot of the static cache."""
        raise NotImplementedError

    def release_slot(self, slot: int) -> None:
        """Give ``slot`` back."""
        raise NotImplementedError

    def keep(self, cache: StaticCache, prefix: int, slots: list[int]) -> None:
        """Keep a cache's positions [0, prefix) and then its positions ``slots``."""
        raise NotImplementedError


class StaticCache:
    """One sequence's KV cache on a ``StaticLlama`` (``CachedLM``'s interface): a slot of the
    target's static cache, freed when the cache is dropped.

    Attributes:
        cached: P, the number of positions in the cache.
        forward_calls: forwards that included this sequence (prefill included).
        keep_hidden: when set, ``last_hidden`` holds the final (normed) hidden states.
        last_hidden: (q, d) work dtype on the target's device, of the latest forward.
    """

    def __init__(self, target: SlotTarget) -> None:
        self.target = target
        self.cached = 0
        self.forward_calls = 0
        self.keep_hidden = False
        self.last_hidden: torch.Tensor | None = None
        self.slot = target.acquire_slot()

    def __del__(self) -> None:
        slot = getattr(self, "slot", None)
        if slot is not None:
            self.target.release_slot(slot)

    def forward(
        self, tokens: list[int], depths: list[int], visible: torch.Tensor, base: int
    ) -> torch.Tensor:
        """``CachedLM.forward``: (q, V) logits of q new tokens over the cache, on the CPU."""
        return self.target.forward([self], [tokens], [depths], [visible], [base])[0]

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Causal forward of a token chain after the cache; returns (q, V) logits."""
        q = len(tokens)
        return self.forward(tokens, list(range(q)), chain_visible(self.cached, q), self.cached)

    def keep(self, prefix: int, slots: list[int]) -> None:
        """Keep positions [0, prefix) and then the cached positions ``slots`` (increasing)."""
        self.target.keep(self, prefix, slots)
