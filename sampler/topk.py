"""The decoder's top-k: ``torch.topk``, or a compiled pass where its answer is the same.

``top_k`` returns exactly ``torch.topk(logits, k, dim=-1)`` (sorted, descending; ties broken
by torch). On the CPU, for float32 rows and k <= ``KERNEL_MAX_K``, it first runs the numba
kernel of ``sampler._kernels`` once that is loaded (``warm_up``; ``sampler.models.load_model``
loads it beside the model): where every row's top k is unique (no NaN, k distinct values above
the rest) that is torch's answer; otherwise, and whenever the kernel is not loaded, numba is
absent or the kernel failed its check, torch runs. So the kernel never changes a result, only
its time (189 against 261 µs for a 49152-wide row right after a llama.cpp forward,
``bench/results/gguf_step_costs.json``).

Shapes: N rows, V vocabulary, k kept per row. Logits (N, V), any device and float dtype ->
values (N, k) in the logits' dtype and indices (N, k) int64, descending per row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

from sampler import compiled

KERNEL_MAX_K = 256
"""Largest k the kernel runs (insertion into a sorted buffer; top-k is 50 by default)."""

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], bool]


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(logits, k, dim=-1)`` (module docstring).

    Args:
        logits: (N, V) float logits, any device and dtype; 1 <= k <= V.
    Returns:
        (N, k) values (the logits' dtype) and (N, k) int64 indices, descending.
    """
    kernel = _loaded() if _fits(logits, k) else None
    if kernel is not None:
        x = logits.numpy()
        values = np.empty((x.shape[0], k), dtype=np.float32)
        indices = np.empty((x.shape[0], k), dtype=np.int64)
        if kernel(x, values, indices):
            return torch.from_numpy(values), torch.from_numpy(indices)
    values_t, indices_t = torch.topk(logits, k, dim=-1)
    return values_t, indices_t


def warm_up() -> bool:
    """Compile (or load from numba's on-disk cache) and check the kernel now; True when it is
    in use. Safe from any thread; until it returns ``top_k`` runs torch alone."""
    return _kernel() is not None


def _fits(logits: torch.Tensor, k: int) -> bool:
    return (
        logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.ndim == 2
        and logits.is_contiguous()
        and not logits.requires_grad  # torch keeps the graph
        and 1 <= k <= min(KERNEL_MAX_K, logits.shape[1])
    )


def _loaded() -> Kernel | None:
    """The kernel if ``warm_up`` has loaded it, else None (never loads it: the first
    generation of a process must not pay for a compile)."""
    return _kernel() if _kernel.cache_info().currsize else None


@functools.cache
def _kernel() -> Kernel | None:
    return compiled.checked("top-k", lambda module: module.top_k_distinct_into, _agrees)


def _agrees(kernel: Kernel) -> bool:
    """The kernel against ``torch.topk`` on random rows (distinct: True and the same answer)
    and on rows it must refuse (a tie at the boundary, a NaN)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((3, 4099), generator=generator)
    values, indices = np.empty((3, 50), np.float32), np.empty((3, 50), np.int64)
    expected = torch.topk(x, 50, dim=-1)
    if not kernel(x.numpy(), values, indices) or not (
        np.array_equal(values, expected.values.numpy())
        and np.array_equal(indices, expected.indices.numpy())
    ):
        return False
    tied = x.clone()
    tied[0, 7] = expected.values[0, 49]  # another entry equal to the 50th value
    nan = x.clone()
    nan[1, 3] = torch.nan
    return not kernel(tied.numpy(), values, indices) and not kernel(nan.numpy(), values, indices)
