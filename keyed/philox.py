"""The PRF's counter generator in NumPy: Philox4x32-10 words, the U mapping (docs/design.md §2).

Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC'11) at counter ``(c0, c1, 0, 0)`` under key ``(k0, k1)`` gives the words ``(x0, x1)``, and
``U = min((top 53 bits of x1·2^32 + x0 + 0.5) / 2^53, 1 − 2^-53)`` in float64, strictly inside
(0, 1). Three implementations give these bits: this one (the CPU fallback, and the reference
the others are checked against), the compiled kernels (``keyed/_kernels.py``, checked by
``keyed/_kernel_loader.py`` before use) and the tensor path for any device
(``keyed/tensor.py``); ``tests/keyed`` holds them equal and to the published known answers.

uint64 arithmetic: a 32x32-bit product is below 2^64, so it is exact and needs no split.

Shapes: N elements; every array (N,).
"""

from __future__ import annotations

from typing import Final

import numpy as np

MASK32: Final = 0xFFFFFFFF
PHILOX_M0: Final = 0xD2511F53
PHILOX_M1: Final = 0xCD9E8D57
PHILOX_W0: Final = 0x9E3779B9
PHILOX_W1: Final = 0xBB67AE85
PHILOX_ROUNDS: Final = 10
TWO_POW_53: Final = float(2**53)
BELOW_ONE: Final = 1.0 - 2.0**-53
"""The largest double below 1: ``U`` is clamped to it (top53 = 2^53 − 1 would round to 1)."""

BLOCK: Final = 8192
"""Elements per block of ``philox4x32_10_numpy`` (1.3 MB of round keys)."""

_MULTIPLIERS: Final = np.array([[PHILOX_M0], [PHILOX_M1]], dtype=np.uint64)  # (2, 1)
_BUMPS: Final = np.array([[PHILOX_W0], [PHILOX_W1]], dtype=np.uint64)  # (2, 1)
_ROUND_BUMPS: Final = (np.arange(PHILOX_ROUNDS, dtype=np.uint64)[:, None] * _BUMPS[:, 0])[
    :, :, None
]  # (ROUNDS, 2, 1): r·W, the Weyl schedule's offset in round r (masked after the add)


def philox4x32_10_numpy(
    c0: np.ndarray, c1: np.ndarray, k0: np.ndarray, k1: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Words (x0, x1) of Philox4x32-10 at counter (c0, c1, 0, 0) under key (k0, k1).

    Arrays longer than ``BLOCK`` run block by block (bounded memory, cache-sized work).
    Equal, bit for bit, to ``keyed.tensor.philox4x32_10`` (tested on random inputs across the
    block size and on the KATs).

    Args:
        c0, c1: (N,) uint64 counter words 0 and 1 in [0, 2^32). k0, k1: (N,) uint64 key words.
    Returns:
        (N,) uint64 output words x0 and x1.
    """
    n = c0.shape[0]
    if n <= BLOCK:
        return _philox_block(c0, c1, k0, k1)
    x0, x1 = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
    for start in range(0, n, BLOCK):
        part = slice(start, start + BLOCK)
        x0[part], x1[part] = _philox_block(c0[part], c1[part], k0[part], k1[part])
    return x0, x1


def _philox_block(
    c0: np.ndarray, c1: np.ndarray, k0: np.ndarray, k1: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``philox4x32_10_numpy`` on at most ``BLOCK`` elements.

    Few NumPy calls, since on short arrays their fixed cost is most of the time: the two lanes
    of a round, c0·M0 and c2·M1, run stacked as one (2, N) array, every operation writes in
    place, and the ten round keys are made in two calls.
    """
    n = c0.shape[0]
    mask, shift = np.uint64(MASK32), np.uint64(32)
    round_keys = np.empty((PHILOX_ROUNDS, 2, n), dtype=np.uint64)  # Weyl schedule: k + r·W
    np.add(k0, _ROUND_BUMPS[:, 0], out=round_keys[:, 0])
    np.add(k1, _ROUND_BUMPS[:, 1], out=round_keys[:, 1])
    round_keys[1:] &= mask  # round 0 uses the key as given, as the tensor path and the kernel
    even = np.zeros((2, n), dtype=np.uint64)  # words (c0, c2): c2 = 0
    odd = np.zeros((2, n), dtype=np.uint64)  # words (c1, c3): c3 = 0
    even[0] = c0
    odd[0] = c1
    product = np.empty((2, n), dtype=np.uint64)
    for r in range(PHILOX_ROUNDS):
        np.multiply(even, _MULTIPLIERS, out=product)  # (c0·M0, c2·M1)
        swapped = product[::-1]  # (c2·M1, c0·M0)
        np.right_shift(swapped, shift, out=even)  # c0' = hi(c2·M1) ^ c1 ^ k0,
        even ^= odd  #                               c2' = hi(c0·M0) ^ c3 ^ k1
        even ^= round_keys[r]
        np.bitwise_and(swapped, mask, out=odd)  # c1' = lo(c2·M1), c3' = lo(c0·M0)
    return even[0], odd[0]


def uniforms_numpy(c0: np.ndarray, c1: np.ndarray, k0: np.ndarray, k1: np.ndarray) -> np.ndarray:
    """U at counter (c0, c1, 0, 0) under key (k0, k1), in NumPy alone: Philox words, then
    (top 53 bits + 0.5) / 2^53 clamped below 1.

    Args:
        c0, c1, k0, k1: (N,) integer words in [0, 2^32) (any integer dtype; cast to uint64).
    Returns:
        (N,) float64 uniforms in (0, 1).
    """
    u64 = np.uint64
    x0, x1 = philox4x32_10_numpy(*(w.astype(u64) for w in (c0, c1, k0, k1)))
    top = ((x1 << u64(21)) | (x0 >> u64(11))).astype(np.float64)  # < 2^53: exact
    return np.minimum((top + 0.5) / TWO_POW_53, BELOW_ONE)
