"""The keyed PRF on tensors: the sampler's clocks on any device (docs/design.md §2-§3).

The construction is ``keyed.prf``'s (context keys there); this module gives its step 2 —
Philox4x32-10 at counter ``(u, j, 0, 0)``, then ``U`` — over torch tensors, for a top-k gather
or the whole vocabulary at once. On the CPU it hands the words to ``keyed.prf.uniforms_cpu``
(the compiled kernel or NumPy); elsewhere it runs Philox in int64 tensor ops whose every
intermediate stays below 2^63 (the 32x32-bit products are split into 16-bit halves), so there
is no signed overflow and CPU and CUDA give identical bits.

Imported by the sampler only: ``import keyed`` (and so the detector) never loads torch.

Shapes: N contexts, K tokens per context, B arrivals; keys (N, 2) int64, tokens (N, K) int64,
uniforms and clocks (N, K, B) float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from keyed import _kernel_loader
from keyed.philox import (
    BELOW_ONE,
    MASK32,
    PHILOX_M0,
    PHILOX_M1,
    PHILOX_ROUNDS,
    PHILOX_W0,
    PHILOX_W1,
    TWO_POW_53,
    uniforms_numpy,
)
from keyed.prf import as_int64_words, uniforms_cpu

_MASK16 = 0xFFFF


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of the 64-bit product a * m, a and m < 2^32, without overflow."""
    p_lo = (a & _MASK16) * m  # < 2^48
    p_hi = (a >> 16) * m  # < 2^48
    t = p_lo + ((p_hi & _MASK16) << 16)  # < 2^49
    lo = t & MASK32
    hi = (p_hi >> 16) + (t >> 32)  # < 2^32 exactly
    return hi, lo


def philox4x32_10(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 block function (Random123), vectorised.

    Args:
        counter: four int64 tensors holding uint32 words c0..c3 (word 0 first), broadcastable.
        key: two int64 tensors holding uint32 words k0, k1, broadcastable with the counter.
    Returns:
        four int64 tensors with the output words x0..x3 in [0, 2^32).
    Source: Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11;
    checked against the published known-answer vectors (``tests/keyed/test_prf.py``).
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def uniforms_from_keys(
    k0: torch.Tensor, k1: torch.Tensor, tokens: torch.Tensor, arrivals: torch.Tensor
) -> torch.Tensor:
    """Uniforms U(κ, u, j) for broadcastable tensors of context keys, tokens and arrivals.

    Args:
        k0, k1: int64 context-key words (from ``label_key``/``nonce_key``).
        tokens: int64 token ids u >= 0. arrivals: int64 arrival indices j >= 1.
    Returns:
        float64 tensor of the broadcast shape, on the tokens' device, values in (0, 1) (never
        0 or 1).
    """
    shape = torch.Size(np.broadcast_shapes(k0.shape, k1.shape, tokens.shape, arrivals.shape))
    device = tokens.device
    if device.type == "cpu":
        words = [as_int64_words(np.broadcast_to(t.numpy(), shape).reshape(-1))
                 for t in (tokens, arrivals, k0, k1)]  # fmt: skip
        return torch.from_numpy(uniforms_cpu(*words)).reshape(shape)
    zero = torch.zeros((), dtype=torch.int64, device=device)
    c0 = tokens.to(torch.int64).expand(shape)
    c1 = arrivals.to(device=device, dtype=torch.int64).expand(shape)
    x0, x1, _, _ = philox4x32_10(
        (c0, c1, zero.expand(shape), zero.expand(shape)),
        (k0.to(device).expand(shape), k1.to(device).expand(shape)),
    )
    return _to_unit_interval((x1 << 21) | (x0 >> 11))


def _to_unit_interval(top53: torch.Tensor) -> torch.Tensor:
    """(top 53 bits + 0.5) / 2^53 as float64, clamped below 1."""
    # top53 + 0.5 needs 54 bits: in the upper half it rounds (to even, identically on every IEEE
    # device), and at top53 = 2^53 - 1 it would round to 2^53, i.e. U = 1. The clamp maps that
    # single value to the largest double below 1, so U is always strictly inside (0, 1).
    return torch.clamp((top53.to(torch.float64) + 0.5) / TWO_POW_53, max=BELOW_ONE)


def keys_tensor(
    keys: Sequence[tuple[int, int]], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Stack context keys into an int64 tensor of shape (N, 2)."""
    if not keys:
        return torch.zeros((0, 2), dtype=torch.int64, device=device)
    return torch.tensor(keys, dtype=torch.int64, device=device)


def clock_uniforms(keys: torch.Tensor, tokens: torch.Tensor, num_arrivals: int) -> torch.Tensor:
    """Uniforms for the first ``num_arrivals`` arrivals of each token of each context.

    Args:
        keys: (N, 2) int64 context keys, one per context.
        tokens: (N, K) int64 token ids per context (a top-k gather or the full vocabulary).
        num_arrivals: B >= 1.
    Returns:
        (N, K, B) float64 uniforms U(κ_n, tokens[n, k], j) for j = 1..B.
    Raises:
        ValueError: mismatched shapes or num_arrivals < 1.
    """
    if keys.ndim != 2 or keys.shape[1] != 2:
        raise ValueError(f"expected keys of shape (N, 2), got {tuple(keys.shape)}")
    if tokens.ndim != 2 or tokens.shape[0] != keys.shape[0]:
        raise ValueError(
            f"expected tokens of shape ({keys.shape[0]}, K), got {tuple(tokens.shape)}"
        )
    if num_arrivals < 1:
        raise ValueError(f"expected num_arrivals >= 1, got {num_arrivals}")
    if tokens.device.type == "cpu":
        return torch.from_numpy(
            clock_uniforms_cpu(keys.cpu().numpy(), tokens.numpy(), num_arrivals)
        )
    keys = keys.to(tokens.device)
    j = torch.arange(1, num_arrivals + 1, dtype=torch.int64, device=tokens.device)
    return uniforms_from_keys(
        keys[:, 0, None, None], keys[:, 1, None, None], tokens[:, :, None], j[None, None, :]
    )  # (N, K, B)


def clock_uniforms_cpu(keys: np.ndarray, tokens: np.ndarray, num_arrivals: int) -> np.ndarray:
    """``clock_uniforms`` on NumPy arrays: the compiled kernel in one call when it serves
    (``keyed._kernel_loader``), else the NumPy Philox over the broadcast grid; the same bits.

    Args:
        keys: (N, 2) integer context keys. tokens: (N, K) integer token ids. num_arrivals: B >= 1.
    Returns:
        (N, K, B) float64 uniforms.
    """
    n, k = tokens.shape
    kernels = _kernel_loader.kernels_for(n * k * num_arrivals)
    if kernels is not None:  # one call, no broadcasting (~20 NumPy calls otherwise)
        out = np.empty((n, k, num_arrivals), dtype=np.float64)
        kernels.clock_uniforms_into(as_int64_words(keys), as_int64_words(tokens), out)
        return out
    shape = (n, k, num_arrivals)
    grid = [
        np.broadcast_to(words, shape).reshape(-1)
        for words in (
            tokens[:, :, None],
            np.arange(1, num_arrivals + 1, dtype=np.int64)[None, None, :],
            keys[:, None, None, 0],
            keys[:, None, None, 1],
        )
    ]
    return uniforms_numpy(*grid).reshape(shape)


def exponential_clocks(keys: torch.Tensor, tokens: torch.Tensor, num_arrivals: int) -> torch.Tensor:
    """Exp(1) clock increments E_{u,j} = −ln U(κ, u, j); same shapes as ``clock_uniforms``."""
    return -torch.log(clock_uniforms(keys, tokens, num_arrivals))
