"""Compiled CPU kernels of the keyed PRF (numba): the same bits as ``keyed.philox`` (NumPy).

Imported by ``keyed._kernel_loader`` on first use, never at import time (numba takes ~0.2 s to
import and compiles each kernel once, then loads it from its on-disk cache); the CPU paths fall
back to NumPy when numba is absent. Why compiled: the detector's arrays are a few hundred
long, where a vectorised Philox4x32-10 is ~55 NumPy calls whose fixed cost is most of the time
(~80 µs for a 512-token text); one pass over the elements here takes a few µs.

``uniforms_into`` runs Philox4x32-10 (Salmon et al., SC'11) at counter (c0, c1, 0, 0) with key
(k0, k1) and maps the output words to U = min((top 53 bits + 0.5) / 2^53, 1 − 2^-53), exactly
as ``keyed.prf`` documents (the sampler's CPU clocks and the detector's pivots, arrival 1);
``plan_into`` is the repeated-context plan. ``keyed._kernel_loader`` checks both against the
NumPy paths when it loads them, and ``tests/keyed`` against the tensor path and the
known-answer vectors.
Inputs are int64 arrays of uint32 words; ``nogil``: service threads detect in parallel.
"""

from __future__ import annotations

import os

import numba
import numpy as np

_U64 = np.uint64
_M0 = _U64(0xD2511F53)
_M1 = _U64(0xCD9E8D57)
_W0 = _U64(0x9E3779B9)
_W1 = _U64(0xBB67AE85)
_MASK32 = _U64(0xFFFFFFFF)
_S32 = _U64(32)
_S21 = _U64(21)
_S11 = _U64(11)
_TWO_POW_53 = float(2**53)
_BELOW_ONE = 1.0 - 2.0**-53


@numba.njit(cache=True, nogil=True, inline="always")
def _uniform(c0: np.uint64, c1: np.uint64, k0: np.uint64, k1: np.uint64) -> float:
    """U of one (counter, key): ten Philox rounds in uint64 (products < 2^64, exact)."""
    x0, x1, x2, x3 = c0, c1, _U64(0), _U64(0)
    for _ in range(10):
        p0 = x0 * _M0
        p1 = x2 * _M1
        x0, x1, x2, x3 = (p1 >> _S32) ^ x1 ^ k0, p1 & _MASK32, (p0 >> _S32) ^ x3 ^ k1, p0 & _MASK32
        k0 = (k0 + _W0) & _MASK32
        k1 = (k1 + _W1) & _MASK32
    top = (x1 << _S21) | (x0 >> _S11)  # < 2^53: exact in float64
    u = (np.float64(top) + 0.5) / _TWO_POW_53
    return u if u < _BELOW_ONE else _BELOW_ONE


@numba.njit(cache=True, nogil=True)
def uniforms_into(
    tokens: np.ndarray, arrivals: np.ndarray, k0: np.ndarray, k1: np.ndarray, out: np.ndarray
) -> None:
    """out[i] = U((k0[i], k1[i]), tokens[i], arrivals[i]); all (N,) int64, out (N,) float64."""
    for i in range(out.shape[0]):
        out[i] = _uniform(_U64(tokens[i]), _U64(arrivals[i]), _U64(k0[i]), _U64(k1[i]))


MULTIPLIER = _U64(int.from_bytes(os.urandom(8), "little") | 1)
"""The plan's hash, h(key) = (key · a mod 2^64) >> (64 − log2 size), takes a random odd ``a``
per process (multiply-shift hashing, Dietzfelbinger et al. 1997): nobody can craft a text whose
labels all land in one slot (long probe chains, quadratic time). It moves only where a label
sits in the table, never which positions are scored."""


@numba.njit(cache=True, nogil=True)
def plan_into(
    ids: np.ndarray, width: int, bits: int, special: np.ndarray, skip: np.ndarray,
    chosen: np.ndarray, multiplier: np.uint64,
) -> int:  # fmt: skip
    """The repeated-context plan of ``keyed.detection_plan_arrays`` in one pass.

    Each label (the ``width`` ids before t, each below 2^bits, ``width * bits <= 64``) is
    packed into one uint64 and looked up in an open-addressing table of the labels scored so
    far: a repeat is skipped (code 2), a first occurrence is scored. Codes as ``SKIP_CODES``:
    special tokens first (3), then the first ``width`` positions (1).

    Args:
        ids: (T,) int64 token ids >= 0. special: (S,) int64 ids never scored.
        skip: (T,) int8 output codes. chosen: (T,) int64 output, scored positions first.
        multiplier: the odd hash multiplier (``MULTIPLIER``; tests pass fixed ones).
    Returns:
        M, the number of scored positions written to ``chosen[:M]``.
    """
    n = ids.shape[0]
    size, log_size = 16, 4  # a power of two >= 2T: the table stays at most half full
    while size < 2 * n:
        size <<= 1
        log_size += 1
    shift = _U64(64 - log_size)
    keys = np.empty(size, dtype=np.uint64)
    used = np.zeros(size, dtype=np.bool_)
    count = 0
    for t in range(n):
        token = ids[t]
        is_special = False
        for s in special:
            if token == s:
                is_special = True
        if is_special:
            skip[t] = 3
            continue
        if t < width:
            skip[t] = 1
            continue
        key = _U64(0)
        for j in range(t - width, t):
            key = (key << _U64(bits)) | _U64(ids[j])
        slot = (key * multiplier) >> shift
        repeated = False
        while used[slot]:
            if keys[slot] == key:
                repeated = True
                break
            slot = (slot + _U64(1)) & _U64(size - 1)
        if repeated:
            skip[t] = 2
            continue
        used[slot] = True
        keys[slot] = key
        skip[t] = 0
        chosen[count] = t
        count += 1
    return count
