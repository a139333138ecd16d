"""Processed distributions P_k, Q_k: temperature -> top-k -> top-p, in log space (DESIGN §3).

The same processing is applied to target and drafter logits, before any race, so the keyed race
samples the processed law (case C6: watermarking before warping biases the output).

Shapes: N contexts, V vocabulary, K support slots (K = top-k, or V when top-k is off).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sampler.processing_config import Processing
from sampler.topk import top_k

__all__ = ["Processing", "Support", "dense_logp", "process"]


@dataclass(frozen=True)
class Support:
    """A processed distribution restricted to its candidate slots.

    Attributes:
        tokens: (N, K) int64 token ids of the candidate slots.
        logp: (N, K) float64 log-probabilities; -inf marks a slot outside the support.
    """

    tokens: torch.Tensor
    logp: torch.Tensor

    def empty_rows(self) -> torch.Tensor:
        """(N,) bool: rows with no token in the support (e.g. an n-gram drafter with no match)."""
        return torch.isneginf(self.logp).all(dim=-1)


def process(logits: torch.Tensor, processing: Processing) -> Support:
    """Apply temperature, top-k and top-p to raw logits.

    Args:
        logits: (N, V) float logits (any float dtype; computed in float64). Rows that are all
            -inf stay empty.
        processing: the shared ``Processing``.
    Returns:
        ``Support`` with (N, K) tokens and float64 log-probabilities normalised over the support.
    """
    if logits.ndim != 2:
        raise ValueError(f"expected logits of shape (N, V), got {tuple(logits.shape)}")
    v = logits.shape[1]
    k = v if processing.top_k == 0 else min(processing.top_k, v)
    if processing.greedy:
        k = 1
    # top-k (sorted descending, so top-p can cut a prefix); ties broken by torch.topk
    # (``sampler.topk``: a compiled pass where its answer is the same). It runs on the logits
    # as given and only the K kept values become float64: widening a float is exact and keeps
    # every comparison, so the slots are the ones topk picks in float64 (tested with forced
    # ties), and a (1, 49152) float32 row skips a 393 KB copy.
    values, tokens = top_k(logits, k)  # (N, K)
    values = values.to(torch.float64)
    if processing.greedy:
        logp = torch.where(torch.isneginf(values), values, torch.zeros_like(values))
        return Support(tokens=tokens, logp=logp)
    values = values / processing.temperature
    empty = torch.isneginf(values).all(dim=-1, keepdim=True)  # (N, 1)
    safe = torch.where(empty, torch.zeros_like(values), values)
    logp = torch.log_softmax(safe, dim=-1)
    if processing.top_p < 1.0:
        probs = logp.exp()
        mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better slots
        keep = mass_before < processing.top_p  # first slot always kept
        logp = torch.where(keep, logp, torch.full_like(logp, -torch.inf))
        logp = torch.log_softmax(logp, dim=-1)
    logp = torch.where(empty | torch.isneginf(values), torch.full_like(logp, -torch.inf), logp)
    return Support(tokens=tokens, logp=logp)


def dense_logp(support: Support, vocab_size: int) -> torch.Tensor:
    """(N, V) float64 log-probabilities with -inf off the support (for tests and enumeration)."""
    out = torch.full(
        (support.tokens.shape[0], vocab_size),
        -torch.inf,
        dtype=torch.float64,
        device=support.logp.device,
    )
    return out.scatter(1, support.tokens, support.logp)
