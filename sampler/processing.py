"""Processed laws P_k, Q_k: temperature -> top-k -> top-p, in log space (docs/design.md §3).

The same processing is applied to target and drafter logits, before any race, so the keyed race
samples the processed law (case C6: watermarking before warping biases the output).

Shapes: N contexts, V vocabulary, K support slots (K = top-k, or V when top-k is off).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from sampler import compiled
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
    kernel = _logp_kernel() if values.device.type == "cpu" and not processing.greedy else None
    if kernel is not None and not values.requires_grad:
        # one compiled pass per row instead of ~12 torch ops (sampler.compiled: the path is
        # fixed per process, so every row of every step shares its arithmetic)
        out = np.empty(values.shape, dtype=np.float64)
        wide = values if values.dtype in (torch.float32, torch.float64) else values.double()
        kernel(
            wide.contiguous().numpy(), float(processing.temperature), float(processing.top_p), out
        )
        return Support(tokens=tokens, logp=torch.from_numpy(out))
    values = values.to(torch.float64)
    if processing.greedy:
        logp = torch.where(torch.isneginf(values), values, torch.zeros_like(values))
        return Support(tokens=tokens, logp=logp)
    logp = _torch_logp(values, processing.temperature, processing.top_p)
    return Support(tokens=tokens, logp=logp)


LogpKernel = Callable[[np.ndarray, float, float, np.ndarray], None]


def _logp_kernel() -> LogpKernel | None:
    """``sampler._kernels.support_logp_into`` once it passes its check, or None (torch), decided
    on the first call of the process (``sampler.compiled.once``)."""
    return compiled.once("log-softmax", _get_logp, _logp_agrees)


def _get_logp(module: ModuleType) -> LogpKernel:
    kernel: LogpKernel = module.support_logp_into
    return kernel


def _logp_agrees(kernel: LogpKernel) -> bool:
    """The kernel's law within 1e-12 of the torch path's on random float32 and float64 rows
    (top-p on and off, temperature 0.7, -inf slots, an empty row)."""
    generator = torch.Generator().manual_seed(0)
    x = (
        (3 * torch.randn((4, 64), generator=generator, dtype=torch.float64))
        .sort(dim=-1, descending=True)
        .values
    )
    x[1, 40:] = -torch.inf
    x[2] = -torch.inf
    for dtype in (torch.float32, torch.float64):
        values = x.to(dtype)
        for top_p in (1.0, 0.9):
            expected = _torch_logp(values.to(torch.float64), 0.7, top_p)
            got = np.empty(values.shape, dtype=np.float64)
            kernel(values.numpy(), 0.7, top_p, got)
            same_support = np.array_equal(np.isneginf(got), torch.isneginf(expected).numpy())
            if not same_support or not np.allclose(
                got, expected.numpy(), rtol=0, atol=1e-12, equal_nan=False
            ):
                return False
    return True


def _torch_logp(values: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The torch path of ``process`` after top-k: (N, K) float64 values -> log-probabilities."""
    values = values / temperature
    empty = torch.isneginf(values).all(dim=-1, keepdim=True)  # (N, 1)
    safe = torch.where(empty, torch.zeros_like(values), values)
    logp = torch.log_softmax(safe, dim=-1)
    if top_p < 1.0:
        probs = logp.exp()
        mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better slots
        keep = mass_before < top_p  # first slot always kept
        logp = torch.where(keep, logp, torch.full_like(logp, -torch.inf))
        logp = torch.log_softmax(logp, dim=-1)
    return torch.where(empty | torch.isneginf(values), torch.full_like(logp, -torch.inf), logp)


def dense_logp(support: Support, vocab_size: int) -> torch.Tensor:
    """(N, V) float64 log-probabilities with -inf off the support (for tests and enumeration)."""
    out = torch.full(
        (support.tokens.shape[0], vocab_size),
        -torch.inf,
        dtype=torch.float64,
        device=support.logp.device,
    )
    return out.scatter(1, support.tokens, support.logp)
