"""Attention masks shared by the target backends (``sampler.targets.transformers``,
``sampler.targets.cpu_bf16``, ``sampler.targets.llamacpp``) and the step loop.

Shapes: P cached positions, q new tokens.
"""

from __future__ import annotations

import torch

__all__ = ["chain_visible"]


def chain_visible(cached: int, q: int) -> torch.Tensor:
    """(q, P + q) bool: a causal chain of q new tokens after P cached ones, each token seeing
    the whole cache, itself and the new tokens before it."""
    visible = torch.ones((q, cached + q), dtype=torch.bool)
    visible[:, cached:] = torch.tril(torch.ones((q, q), dtype=torch.bool))
    return visible
