"""Compiled CPU kernels of the keyed PRF (numba): the same bits as ``keyed.philox`` (NumPy).

Imported by ``keyed._kernel_loader`` on first use, never at import time (numba takes ~0.2 s to
import and compiles each kernel once, then loads it from its on-disk cache); the CPU paths fall
back to NumPy when numba is absent. Why compiled: the detector's arrays are a few hundred
long, where a vectorised Philox4x32-10 is ~55 NumPy calls whose fixed cost is most of the time
(~80 µs for a 512-token text); one pass over the elements here takes a few µs.

``uniforms_into`` runs Philox4x32-10 (Salmon et al., SC'11) at counter (c0, c1, 0, 0) with key
(k0, k1) and maps the output words to U = min((top 53 bits + 0.5) / 2^53, 1 − 2^-53), exactly
as ``keyed.prf`` documents (the sampler's CPU clocks and the detector's pivots, arrival 1);
``clock_uniforms_into`` the same for the sampler's (N, K, B) clocks; ``plan_into`` is the
repeated-context plan; ``pivots_many_into`` the pivots of one text under
many secrets (keyed BLAKE2b context keys, then Philox: multi-key detection).
``keyed._kernel_loader`` checks them against the NumPy paths and hashlib when it loads them,
and ``tests/keyed`` against the tensor path and the known-answer vectors.
Inputs are int64 arrays of uint32 words; ``nogil``: service threads detect in parallel.

Shapes: N contexts (or labels), K tokens per context, B arrivals, T tokens of a text, S special
ids. Context keys k0, k1, tokens and arrivals (N,) int64 -> uniforms (N,) float64; the
sampler's tokens (N, K) int64 -> clocks (N, K, B) float64; a text's ids (T,) int64 and special
ids (S,) int64 -> skip codes (T,) int8 and chosen positions (T,) int64; the label hash table
uint64 keys and bool used flags.
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
def clock_uniforms_into(keys: np.ndarray, tokens: np.ndarray, out: np.ndarray) -> None:
    """out[n, k, j] = U((keys[n, 0], keys[n, 1]), tokens[n, k], j + 1): the sampler's clock
    uniforms of N contexts (``keyed.tensor.clock_uniforms``) in one call; keys (N, 2) and
    tokens (N, K) int64, out (N, K, B) float64."""
    for n in range(out.shape[0]):
        k0, k1 = _U64(keys[n, 0]), _U64(keys[n, 1])
        for k in range(out.shape[1]):
            token = _U64(tokens[n, k])
            for j in range(out.shape[2]):
                out[n, k, j] = _uniform(token, _U64(j + 1), k0, k1)


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


# --- Many secrets at once: keyed BLAKE2b context keys, then the pivots ------------------------
# BLAKE2b (RFC 7693) in uint64 words, keyed, 8-byte digest: the same bits as hashlib.blake2b(
# key=secret, digest_size=8) over the message ``keyed.prf`` hashes for a label. The key block is
# compressed once per secret; each label's message (at most 3 blocks for m <= 64) once per
# (secret, label). ``keyed/_kernel_loader.py`` checks it against hashlib when it loads.

_IV = np.array(
    [0x6A09E667F3BCC908, 0xBB67AE8584CAA73B, 0x3C6EF372FE94F82B, 0xA54FF53A5F1D36F1,
     0x510E527FADE682D1, 0x9B05688C2B3E6C1F, 0x1F83D9ABFB41BD6B, 0x5BE0CD19137E2179],
    dtype=np.uint64,
)  # fmt: skip
_PARAM_KEYED_8 = _U64(0x01010000 | (32 << 8) | 8)  # fanout 1, depth 1, 32-byte key, 8-byte digest
_R32, _R24, _R16, _R63 = _U64(32), _U64(24), _U64(16), _U64(63)
_L32, _L40, _L48, _L1 = _U64(32), _U64(40), _U64(48), _U64(1)
_ALL_ONES = _U64(0xFFFFFFFFFFFFFFFF)


@numba.njit(cache=True, nogil=True, inline="always")
def _g(
    a: np.uint64, b: np.uint64, c: np.uint64, d: np.uint64, x: np.uint64, y: np.uint64
) -> tuple[np.uint64, np.uint64, np.uint64, np.uint64]:
    """BLAKE2b's mixing function G (RFC 7693 §3.1) on four state words."""
    a = a + b + x
    d ^= a
    d = (d >> _R32) | (d << _L32)
    c = c + d
    b ^= c
    b = (b >> _R24) | (b << _L40)
    a = a + b + y
    d ^= a
    d = (d >> _R16) | (d << _L48)
    c = c + d
    b ^= c
    b = (b >> _R63) | (b << _L1)
    return a, b, c, d


@numba.njit(cache=True, nogil=True)
def _compress(h: np.ndarray, block: np.ndarray, counter: np.uint64, last: bool) -> None:
    """BLAKE2b's F (RFC 7693 §3.2) on state h (8,) uint64 with block (16,) uint64, in place.

    The working vector and the message words live in scalars and the twelve rounds are spelled
    out with their σ rows (RFC 7693 §2.7) so that LLVM can keep everything in registers (a
    loop over rounds indexing ``block[σ[i]]`` gives the same bits; it was slower in a one-off
    timing, not a committed benchmark)."""
    v0, v1, v2, v3, v4, v5, v6, v7 = h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
    v8, v9, v10, v11 = _IV[0], _IV[1], _IV[2], _IV[3]
    v12, v13, v14, v15 = _IV[4] ^ counter, _IV[5], _IV[6], _IV[7]
    if last:
        v14 ^= _ALL_ONES
    m0, m1, m2, m3, m4, m5, m6, m7 = block[0], block[1], block[2], block[3], block[4], \
        block[5], block[6], block[7]  # fmt: skip
    m8, m9, m10, m11, m12, m13, m14, m15 = block[8], block[9], block[10], block[11], \
        block[12], block[13], block[14], block[15]  # fmt: skip
    # round 0: σ_0
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m0, m1)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m2, m3)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m4, m5)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m6, m7)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m8, m9)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m10, m11)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m12, m13)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m14, m15)
    # round 1: σ_1
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m14, m10)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m4, m8)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m9, m15)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m13, m6)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m1, m12)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m0, m2)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m11, m7)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m5, m3)
    # round 2: σ_2
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m11, m8)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m12, m0)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m5, m2)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m15, m13)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m10, m14)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m3, m6)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m7, m1)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m9, m4)
    # round 3: σ_3
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m7, m9)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m3, m1)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m13, m12)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m11, m14)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m2, m6)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m5, m10)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m4, m0)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m15, m8)
    # round 4: σ_4
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m9, m0)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m5, m7)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m2, m4)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m10, m15)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m14, m1)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m11, m12)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m6, m8)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m3, m13)
    # round 5: σ_5
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m2, m12)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m6, m10)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m0, m11)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m8, m3)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m4, m13)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m7, m5)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m15, m14)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m1, m9)
    # round 6: σ_6
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m12, m5)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m1, m15)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m14, m13)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m4, m10)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m0, m7)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m6, m3)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m9, m2)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m8, m11)
    # round 7: σ_7
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m13, m11)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m7, m14)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m12, m1)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m3, m9)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m5, m0)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m15, m4)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m8, m6)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m2, m10)
    # round 8: σ_8
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m6, m15)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m14, m9)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m11, m3)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m0, m8)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m12, m2)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m13, m7)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m1, m4)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m10, m5)
    # round 9: σ_9
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m10, m2)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m8, m4)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m7, m6)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m1, m5)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m15, m11)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m9, m14)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m3, m12)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m13, m0)
    # round 10: σ_0
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m0, m1)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m2, m3)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m4, m5)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m6, m7)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m8, m9)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m10, m11)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m12, m13)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m14, m15)
    # round 11: σ_1
    v0, v4, v8, v12 = _g(v0, v4, v8, v12, m14, m10)
    v1, v5, v9, v13 = _g(v1, v5, v9, v13, m4, m8)
    v2, v6, v10, v14 = _g(v2, v6, v10, v14, m9, m15)
    v3, v7, v11, v15 = _g(v3, v7, v11, v15, m13, m6)
    v0, v5, v10, v15 = _g(v0, v5, v10, v15, m1, m12)
    v1, v6, v11, v12 = _g(v1, v6, v11, v12, m0, m2)
    v2, v7, v8, v13 = _g(v2, v7, v8, v13, m11, m7)
    v3, v4, v9, v14 = _g(v3, v4, v9, v14, m5, m3)
    h[0] ^= v0 ^ v8
    h[1] ^= v1 ^ v9
    h[2] ^= v2 ^ v10
    h[3] ^= v3 ^ v11
    h[4] ^= v4 ^ v12
    h[5] ^= v5 ^ v13
    h[6] ^= v6 ^ v14
    h[7] ^= v7 ^ v15


@numba.njit(cache=True, nogil=True)
def pivots_many_into(
    key_blocks: np.ndarray, messages: np.ndarray, length: int, tokens: np.ndarray, out: np.ndarray
) -> None:
    """out[k, n] = U(κ(secret k, label n), tokens[n], 1): ``label_key_words`` then ``uniforms``.

    Args:
        key_blocks: (K, 16) uint64, each secret zero-padded to a 128-byte block (LE words).
        messages: (N, 16·B) uint64, each label's message (length-prefixed tag ‖ payload),
            zero-padded to B blocks. length: the message's bytes, in (128·(B − 1), 128·B].
        tokens: (N,) int64 observed ids. out: (K, N) float64.
    """
    blocks = messages.shape[1] // 16
    h = np.empty(8, dtype=np.uint64)
    keyed_h = np.empty(8, dtype=np.uint64)
    for k in range(key_blocks.shape[0]):
        for i in range(8):
            keyed_h[i] = _IV[i]
        keyed_h[0] ^= _PARAM_KEYED_8
        _compress(keyed_h, key_blocks[k], _U64(128), False)
        for n in range(messages.shape[0]):
            for i in range(8):
                h[i] = keyed_h[i]
            for b in range(blocks - 1):
                _compress(h, messages[n, 16 * b : 16 * b + 16], _U64(128 * (b + 2)), False)
            final = messages[n, 16 * (blocks - 1) :]
            _compress(h, final, _U64(128 + length), True)
            digest = h[0]  # the 8-byte digest, little-endian: κ0 = low word, κ1 = high word
            out[k, n] = _uniform(_U64(tokens[n]), _U64(1), digest & _MASK32, digest >> _S32)
