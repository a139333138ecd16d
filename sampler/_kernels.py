"""Compiled CPU kernel of the decoder's top-k (numba), used only where it equals ``torch.topk``.

Imported by ``sampler.topk`` when it is warmed up (``sampler.topk.warm_up``), never at import
time. Why compiled: right after a llama.cpp forward (precision gguf), whose weights have evicted
the caches, ``torch.topk`` of 50 over a (1, 49152) float32 row took 261 µs and ``top_k`` with
this pass 189 µs (93 and 66 µs warm; Intel Xeon, 2 cores, ``bench/results/gguf_step_costs.json``).

``top_k_distinct_into`` keeps, per row, the k largest values in descending order (insertion
into a sorted buffer). Its answer is unique, hence ``torch.topk``'s, when the k values are
distinct and larger than every other value of the row and the row has no NaN; it reports per
row whether that holds, and the caller runs ``torch.topk`` otherwise (ties: torch's rule).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def top_k_distinct_into(x: np.ndarray, values: np.ndarray, indices: np.ndarray) -> bool:
    """The k = ``values.shape[1]`` largest entries of each row of ``x``, descending.

    Args:
        x: (N, V) float32, C-contiguous; k <= V.
        values: (N, k) float32 out. indices: (N, k) int64 out (columns of ``x``).
    Returns:
        True when every row's top k is unique (no NaN, k distinct values, all above the rest
        of the row), i.e. equal to ``torch.topk(x, k)``; False: the outputs are not that.
    """
    n, v = x.shape
    k = values.shape[1]
    for r in range(n):
        row, val, idx = x[r], values[r], indices[r]
        filled = 0
        for i in range(v):
            value = row[i]
            if value != value:  # NaN: torch orders it above everything
                return False
            if filled < k:
                j = filled
                filled += 1
            elif value > val[k - 1]:
                j = k - 1
            else:
                continue
            while j > 0 and val[j - 1] < value:
                val[j] = val[j - 1]
                idx[j] = idx[j - 1]
                j -= 1
            val[j] = value
            idx[j] = i
        for j in range(k - 1):
            if val[j] == val[j + 1]:
                return False
        at_least = 0  # entries >= the k-th value: exactly k when it is a strict boundary
        for i in range(v):
            if row[i] >= val[k - 1]:
                at_least += 1
        if at_least != k:
            return False
    return True
