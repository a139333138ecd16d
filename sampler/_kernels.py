"""Compiled CPU kernels of the decoder (numba): its top-k, log-softmax and keyed race.

Imported by ``sampler.compiled`` (for ``sampler.topk``, ``sampler.processing`` and
``sampler.race``), never at import time. Why compiled: right after a llama.cpp forward
(precision gguf), whose weights have evicted the caches, every small torch op costs 2-4x its
warm time: ``torch.topk`` of 50 over a (1, 49152) float32 row took 261 µs and ``top_k`` with
this pass 189 µs (93 and 66 µs warm; Intel Xeon, 2 cores, ``bench/results/gguf_step_costs.json``).

``top_k_distinct_into`` keeps, per row, the k largest values in descending order (a vectorised
pass over block maxima, then insertion into a sorted buffer of the entries that can be among
them). Its answer is unique, hence ``torch.topk``'s, when the k values are
distinct and larger than every other value of the row and the row has no NaN; it reports per
row whether that holds, and the caller runs ``torch.topk`` otherwise (ties: torch's rule).

``support_logp_into`` (temperature, log-softmax, top-p over the top-k slots) and
``race_winners_of_uniforms_into`` (argmin ln(−ln U) − ln P) compute the laws of their torch
paths in one pass per row; their last bits may differ from torch's, so ``sampler.compiled``
fixes one path per process.

Shapes: N rows (contexts), V vocabulary, K kept tokens per row (top-k). Logits (N, V) float32
C-contiguous -> top-k values (N, K) float32 and indices (N, K) int64; processed
log-probabilities (N, K) float64 (−inf off the support); clock uniforms (N, K) float64; race
winners (N,) int64.
"""

from __future__ import annotations

import numba
import numpy as np

_CHUNK = 64
"""Entries per block of ``top_k_distinct_into``'s first pass."""
_LOWEST = np.int32(-(2**31))


@numba.njit(cache=True, nogil=True, inline="always")
def _order(word: np.int32) -> np.int32:
    """A float32's bits as an int32 in the floats' order (−0.0 just below +0.0; NaN bits
    outside ±inf's): the sign bit flips the other bits of a negative value. An involution."""
    return word ^ ((word >> 31) & 0x7FFFFFFF)


@numba.njit(cache=True, nogil=True)
def top_k_distinct_into(x: np.ndarray, values: np.ndarray, indices: np.ndarray) -> bool:
    """The k = ``values.shape[1]`` largest entries of each row of ``x``, descending.

    Two passes per row. The first takes each block of ``_CHUNK`` entries' largest value (as an
    ordered int32, a loop the compiler vectorises) and notes any NaN; the k-th largest block
    maximum is a floor for the row's k-th value (k blocks hold an entry at least that large),
    so the second pass inserts into a sorted buffer only the entries of blocks that reach the
    floor and are not below it. An entry below the floor is below the k-th value: it is neither
    kept nor a tie (a floor of +0.0 keeps the blocks topped by -0.0, which equals it).

    Args:
        x: (N, V) float32, C-contiguous; k <= V.
        values: (N, k) float32 out. indices: (N, k) int64 out (columns of ``x``).
    Returns:
        True when every row's top k is unique (no NaN, k distinct values, all above the rest
        of the row), i.e. equal to ``torch.topk(x, k)``; False: the outputs are not that.
    """
    n, v = x.shape
    k = values.shape[1]
    bits = x.view(np.int32)
    blocks = (v + _CHUNK - 1) // _CHUNK
    full = v // _CHUNK
    tops = np.empty(blocks, dtype=np.int32)
    word = np.empty(1, dtype=np.int32)
    for r in range(n):
        row, words, val, idx = x[r], bits[r], values[r], indices[r]
        nan = np.int32(0)
        for c in range(full):  # a fixed trip count: vectorised
            top = _LOWEST
            base = c * _CHUNK
            for j in range(_CHUNK):
                w = words[base + j]
                nan |= np.int32((w & 0x7FFFFFFF) > 0x7F800000)
                top = max(top, _order(w))
            tops[c] = top
        if full < blocks:
            top = _LOWEST
            for j in range(full * _CHUNK, v):
                w = words[j]
                nan |= np.int32((w & 0x7FFFFFFF) > 0x7F800000)
                top = max(top, _order(w))
            tops[full] = top
        if nan:  # torch orders NaN above everything
            return False
        floor = -np.inf
        bar = _LOWEST
        if blocks > k:
            bar = np.partition(tops, blocks - k)[blocks - k]
            word[0] = _order(bar)
            floor = word.view(np.float32)[0]
            if bar == 0:  # +0.0: a block whose largest entry is -0.0 may hold a tie
                bar = np.int32(-1)
        filled = 0
        # the largest entry left out of the buffer (dropped or never kept) among those at least
        # the floor: the top k is strictly above the rest iff this is below the k-th value
        excluded = -np.inf
        any_excluded = False
        for c in range(blocks):
            if tops[c] < bar:
                continue
            for i in range(c * _CHUNK, min(c * _CHUNK + _CHUNK, v)):
                value = row[i]
                if value < floor:
                    continue
                if filled < k:
                    j = filled
                    filled += 1
                elif value > val[k - 1]:
                    any_excluded = True
                    if val[k - 1] > excluded:
                        excluded = val[k - 1]
                    j = k - 1
                else:
                    any_excluded = True
                    if value > excluded:
                        excluded = value
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
        if any_excluded and excluded >= val[k - 1]:  # another entry ties the k-th
            return False
    return True


@numba.njit(cache=True, nogil=True)
def support_logp_into(
    values: np.ndarray, temperature: float, top_p: float, logp: np.ndarray
) -> None:
    """Processed log-probabilities of top-k values: temperature, log-softmax over the slots,
    then top-p (``sampler.processing.process``'s law, one row at a time).

    Args:
        values: (N, K) float32 or float64 top-k logits, descending per row; -inf: no token.
        temperature: T > 0. top_p: in (0, 1]; 1 keeps every slot.
        logp: (N, K) float64 out; -inf off the support, an all -inf row stays so.
    Each row is computed alone, in slot order, so a row's bits do not depend on N.
    """
    n, k = values.shape
    for r in range(n):
        out = logp[r]
        top = -np.inf
        for j in range(k):
            v = np.float64(values[r, j]) / temperature
            out[j] = v
            if v > top:
                top = v
        if top == -np.inf:  # empty row
            continue
        total = 0.0
        for j in range(k):
            total += np.exp(out[j] - top)
        norm = top + np.log(total)
        for j in range(k):
            out[j] = out[j] - norm  # -inf stays -inf
        if top_p >= 1.0:
            continue
        mass = 0.0  # of the slots before j (slots are sorted, best first)
        keep = 0
        for j in range(k):
            if mass >= top_p or out[j] == -np.inf:
                break
            mass += np.exp(out[j])
            keep = j + 1
        for j in range(keep, k):
            out[j] = -np.inf
        top = out[0]
        total = 0.0
        for j in range(keep):
            total += np.exp(out[j] - top)
        norm = top + np.log(total)
        for j in range(keep):
            out[j] = out[j] - norm


@numba.njit(cache=True, nogil=True)
def race_winners_of_uniforms_into(
    logp: np.ndarray, tokens: np.ndarray, uniforms: np.ndarray, winners: np.ndarray
) -> None:
    """The keyed race per row: the token of the first slot minimising ln E − ln P with the
    clock E = −ln U taken here from its uniform (``sampler.race.race_winner_of_uniforms``'s
    law), -1 for a row with no support; one pass per row, each slot's arithmetic the same
    wherever it sits.

    Args:
        logp: (N, K) float64, -inf off the support. tokens: (N, K) int64.
        uniforms: (N, K) float64 in (0, 1). winners: (N,) int64 out.
    """
    n, k = logp.shape
    for r in range(n):
        best = -1
        best_score = np.inf
        for j in range(k):
            if logp[r, j] == -np.inf:
                continue
            score = np.log(-np.log(uniforms[r, j])) - logp[r, j]
            if best < 0 or score < best_score:
                best = j
                best_score = score
        winners[r] = tokens[r, best] if best >= 0 else -1
