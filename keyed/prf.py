"""The keyed PRF: secret x label x token x arrival -> uniform in (0, 1).

This module is the only home of keyed randomness (DESIGN §2). The sampler (on any device)
and the detector (on the CPU) call the same functions and get the same bits.

Construction, fixed by ``PRF_VERSION = 1`` and pinned by ``tests/goldens/``:

1. context key ``κ = BLAKE2b(key=secret, digest_size=8)(tag ‖ payload)``, read as two
   little-endian uint32 words ``(κ0, κ1)``. For a label: ``tag = b"clock"``,
   ``payload = m:uint32le ‖ label ids:uint32le``. For the per-request nonce stream used at
   repeated contexts: ``tag = b"nonce-clock"``, ``payload = nonce:uint64le ‖ position:uint32le``.
   Tags are length-prefixed so one tag can never be the prefix of another's payload.
2. per (token u, arrival j): Philox4x32-10 (Salmon et al., SC'11, "Random123") keyed by
   ``(κ0, κ1)`` at counter ``(u, j, 0, 0)``; output words ``(x0, x1)`` give 64 bits and
   ``U = min((top 53 bits + 0.5) / 2^53, 1 − 2^-53)`` in float64 — strictly inside (0, 1).

Philox is written in int64 tensor ops whose every intermediate stays below 2^63 (the 32x32-bit
products are split into 16-bit halves), so there is no signed overflow and CPU and CUDA give
identical bits. Arrival j is its own counter, so ``G_{u,1}`` does not depend on how many
arrivals (drafts B) are requested.

Shapes: any broadcastable integer tensors; dtype int64 inside, float64 uniforms out.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import importlib
import itertools
import logging
import struct
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, cast

import numpy as np

if TYPE_CHECKING:
    import torch
else:

    class _TorchOnFirstUse:
        """Stands for the ``torch`` module until a tensor function first reads an attribute,
        then imports it and puts the real module in its place. The detector's path (BLAKE2b
        keys, NumPy Philox, pivots) never does, so detection processes — corpus workers
        above all — start without importing torch."""

        def __getattr__(self, name: str) -> Any:
            module = importlib.import_module("torch")
            globals()["torch"] = module
            return getattr(module, name)

    torch = _TorchOnFirstUse()

PRF_VERSION: Final = 1
SECRET_BYTES: Final = 32
SENTINEL: Final = 0xFFFFFFFF  # pads labels of positions with fewer than m tokens before them

_MASK32: Final = 0xFFFFFFFF
_MASK16: Final = 0xFFFF
_PHILOX_M0: Final = 0xD2511F53
_PHILOX_M1: Final = 0xCD9E8D57
_PHILOX_W0: Final = 0x9E3779B9
_PHILOX_W1: Final = 0xBB67AE85
_PHILOX_ROUNDS: Final = 10
_TWO_POW_53: Final = float(2**53)
_BELOW_ONE: Final = 1.0 - 2.0**-53

_MULTIPLIERS: Final = np.array([[_PHILOX_M0], [_PHILOX_M1]], dtype=np.uint64)  # (2, 1)
_BUMPS: Final = np.array([[_PHILOX_W0], [_PHILOX_W1]], dtype=np.uint64)  # (2, 1)
_ROUND_BUMPS: Final = (np.arange(_PHILOX_ROUNDS, dtype=np.uint64)[:, None] * _BUMPS[:, 0])[
    :, :, None
]  # (ROUNDS, 2, 1): r·W, the Weyl schedule's offset in round r (masked after the add)
_BLOCK: Final = 8192  # elements per block of the NumPy Philox (1.3 MB of round keys)

TAG_CLOCK: Final = b"clock"
TAG_NONCE_CLOCK: Final = b"nonce-clock"


class Secret:
    """32 bytes of key material that never shows itself.

    ``repr``/``str`` print a placeholder, so a secret cannot leak through a log line, a
    traceback or an f-string. Raises ``ValueError`` when the material is not 32 bytes.
    """

    __slots__ = ("_material",)

    def __init__(self, material: bytes) -> None:
        if not isinstance(material, bytes | bytearray) or len(material) != SECRET_BYTES:
            size = len(material) if isinstance(material, bytes | bytearray) else "non-bytes"
            raise ValueError(f"expected a secret of {SECRET_BYTES} bytes, got {size}")
        self._material = bytes(material)

    def reveal(self) -> bytes:
        """The raw 32 bytes, for the key store and the context-key derivation only."""
        return self._material

    def __repr__(self) -> str:
        return "Secret(**********)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        import hmac

        return isinstance(other, Secret) and hmac.compare_digest(self._material, other._material)

    def __hash__(self) -> int:
        return hash(hashlib.blake2b(self._material, digest_size=8).digest())

    def __reduce__(self) -> tuple[object, ...]:
        # Allow pickling to worker processes (never to logs); keeps the placeholder repr.
        return (Secret, (self._material,))


def _derive(secret: Secret, tag: bytes, payload: bytes) -> tuple[int, int]:
    h = hashlib.blake2b(key=secret.reveal(), digest_size=8)
    h.update(struct.pack("<I", len(tag)))
    h.update(tag)
    h.update(payload)
    k0, k1 = struct.unpack("<II", h.digest())
    return k0, k1


def label_key(secret: Secret, label: Sequence[int]) -> tuple[int, int]:
    """Philox key ``(κ0, κ1)`` of a label (the m token ids before a position).

    Args:
        secret: the key's secret.
        label: m token ids in [0, 2^32), oldest first; ``SENTINEL`` pads a short prefix.
    Returns:
        two uint32 words as Python ints.
    Raises:
        ValueError: a label id outside [0, 2^32).
    """
    ids = list(label)
    for t in ids:
        if not 0 <= t <= _MASK32:
            raise ValueError(f"expected label ids in [0, 2^32), got {t}")
    payload = struct.pack(f"<I{len(ids)}I", len(ids), *ids)
    return _derive(secret, TAG_CLOCK, payload)


def label_keys(secret: Secret, labels: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """``label_key`` of many labels: the same words, bit for bit, faster (one keyed init).

    The keyed BLAKE2b state after the length-prefixed ``b"clock"`` tag is built once and copied
    for each label (hashing is streaming, so the digest is that of the full message); the
    detector derives one context key per scored position with it.

    Args:
        secret: the key's secret. labels: (N,) labels of m token ids in [0, 2^32) each.
    Returns:
        (N,) ``(κ0, κ1)`` pairs, equal to ``[label_key(secret, label) for label in labels]``.
    Raises:
        ValueError: a label id outside [0, 2^32).
    """
    base = hashlib.blake2b(key=secret.reveal(), digest_size=8)
    base.update(struct.pack("<I", len(TAG_CLOCK)))
    base.update(TAG_CLOCK)
    keys: list[tuple[int, int]] = []
    for label in labels:
        h = base.copy()
        try:
            h.update(struct.pack(f"<I{len(label)}I", len(label), *label))
        except struct.error:
            bad = next((t for t in label if not (isinstance(t, int) and 0 <= t <= _MASK32)), label)
            raise ValueError(f"expected label ids in [0, 2^32), got {bad}") from None
        k0, k1 = struct.unpack("<II", h.digest())
        keys.append((k0, k1))
    return keys


def label_key_words(secret: Secret, labels: np.ndarray) -> np.ndarray:
    """``label_keys`` of an (N, m) array of labels, as an (N, 2) array: the detector's path.

    The same words as ``label_key``, bit for bit: the payloads ``m ‖ ids`` (uint32 LE) are laid
    out by NumPy in one buffer and each is hashed from a copy of the keyed state after the tag.

    Args:
        secret: the key's secret.
        labels: (N, m) integer array of token ids in [0, 2^32), oldest first, m >= 1.
    Returns:
        (N, 2) int64 array of (κ0, κ1) uint32 words.
    Raises:
        ValueError: a label id outside [0, 2^32), or not a 2-D array.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2 or labels.shape[1] < 1:
        raise ValueError(f"expected an (N, m) array of labels, got shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > _MASK32):
        raise ValueError("expected label ids in [0, 2^32)")
    n, m = labels.shape
    payload = np.empty((n, m + 1), dtype="<u4")
    payload[:, 0] = m
    payload[:, 1:] = labels
    rows = payload.view(np.dtype((np.void, 4 * (m + 1)))).reshape(-1)  # (N,) void rows
    messages = cast("list[bytes]", rows.tolist())  # N bytes objects of 4(m + 1) bytes
    base = hashlib.blake2b(key=secret.reveal(), digest_size=8)
    base.update(struct.pack("<I", len(TAG_CLOCK)))
    base.update(TAG_CLOCK)
    # C-level loops (map over the hash type's methods): no Python bytecode per label
    blake2b = type(base)
    states = list(map(blake2b.copy, itertools.repeat(base, n)))
    collections.deque(map(blake2b.update, states, messages), maxlen=0)
    digests = b"".join(map(blake2b.digest, states))
    return np.frombuffer(digests, dtype="<u4").astype(np.int64).reshape(n, 2)


def nonce_key(secret: Secret, nonce: int, position: int) -> tuple[int, int]:
    """Philox key for the nonce stream at a response position (repeated-context rule).

    Args:
        nonce: the request nonce in [0, 2^64). position: 0-based index in the response.
    Raises:
        ValueError: nonce or position out of range.
    """
    if not 0 <= nonce < 2**64:
        raise ValueError(f"expected a nonce in [0, 2^64), got {nonce}")
    if not 0 <= position <= _MASK32:
        raise ValueError(f"expected a position in [0, 2^32), got {position}")
    return _derive(secret, TAG_NONCE_CLOCK, struct.pack("<QI", nonce, position))


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of the 64-bit product a * m, a and m < 2^32, without overflow."""
    p_lo = (a & _MASK16) * m  # < 2^48
    p_hi = (a >> 16) * m  # < 2^48
    t = p_lo + ((p_hi & _MASK16) << 16)  # < 2^49
    lo = t & _MASK32
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
    for r in range(_PHILOX_ROUNDS):
        if r:
            k0 = (k0 + _PHILOX_W0) & _MASK32
            k1 = (k1 + _PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo(c0, _PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, _PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def _philox4x32_10_numpy(
    c0: np.ndarray, c1: np.ndarray, k0: np.ndarray, k1: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Words (x0, x1) of Philox4x32-10 at counter (c0, c1, 0, 0): the CPU fast path.

    uint64 arithmetic: a 32x32-bit product is below 2^64, so it is exact and needs no split.
    Arrays longer than ``_BLOCK`` run block by block (bounded memory, cache-sized work).
    Equal, bit for bit, to ``philox4x32_10`` (tested on random inputs across the block size and
    on the KATs).

    Args:
        c0, c1: (N,) uint64 counter words 0 and 1 in [0, 2^32). k0, k1: (N,) uint64 key words.
    Returns:
        (N,) uint64 output words x0 and x1.
    """
    n = c0.shape[0]
    if n <= _BLOCK:
        return _philox_block(c0, c1, k0, k1)
    x0, x1 = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
    for start in range(0, n, _BLOCK):
        part = slice(start, start + _BLOCK)
        x0[part], x1[part] = _philox_block(c0[part], c1[part], k0[part], k1[part])
    return x0, x1


def _philox_block(
    c0: np.ndarray, c1: np.ndarray, k0: np.ndarray, k1: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``_philox4x32_10_numpy`` on at most ``_BLOCK`` elements (the NumPy fallback).

    Few NumPy calls, since on short arrays their fixed cost is most of the time: the two lanes
    of a round, c0·M0 and c2·M1, run stacked as one (2, N) array, every operation writes in
    place, and the ten round keys are made in two calls.
    """
    n = c0.shape[0]
    mask, shift = np.uint64(_MASK32), np.uint64(32)
    round_keys = np.empty((_PHILOX_ROUNDS, 2, n), dtype=np.uint64)  # Weyl schedule: k + r·W
    np.add(k0, _ROUND_BUMPS[:, 0], out=round_keys[:, 0])
    np.add(k1, _ROUND_BUMPS[:, 1], out=round_keys[:, 1])
    round_keys[1:] &= mask  # round 0 uses the key as given, as the tensor path and the kernel
    even = np.zeros((2, n), dtype=np.uint64)  # words (c0, c2): c2 = 0
    odd = np.zeros((2, n), dtype=np.uint64)  # words (c1, c3): c3 = 0
    even[0] = c0
    odd[0] = c1
    product = np.empty((2, n), dtype=np.uint64)
    for r in range(_PHILOX_ROUNDS):
        np.multiply(even, _MULTIPLIERS, out=product)  # (c0·M0, c2·M1)
        swapped = product[::-1]  # (c2·M1, c0·M0)
        np.right_shift(swapped, shift, out=even)  # c0' = hi(c2·M1) ^ c1 ^ k0,
        even ^= odd  #                               c2' = hi(c0·M0) ^ c3 ^ k1
        even ^= round_keys[r]
        np.bitwise_and(swapped, mask, out=odd)  # c1' = lo(c2·M1), c3' = lo(c0·M0)
    return even[0], odd[0]


def uniforms_from_keys(
    k0: torch.Tensor, k1: torch.Tensor, tokens: torch.Tensor, arrivals: torch.Tensor
) -> torch.Tensor:
    """Uniforms U(κ, u, j) for broadcastable tensors of context keys, tokens and arrivals.

    Args:
        k0, k1: int64 context-key words (from ``label_key``/``nonce_key``).
        tokens: int64 token ids u >= 0. arrivals: int64 arrival indices j >= 1.
    Returns:
        float64 tensor of the broadcast shape, values in (0, 1) (never 0 or 1).
    """
    shape = torch.Size(np.broadcast_shapes(k0.shape, k1.shape, tokens.shape, arrivals.shape))
    device = tokens.device
    if device.type == "cpu":
        words = [_c_int64(np.broadcast_to(t.numpy(), shape).reshape(-1))
                 for t in (tokens, arrivals, k0, k1)]  # fmt: skip
        return torch.from_numpy(_uniforms_cpu(*words)).reshape(shape)
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
    return torch.clamp((top53.to(torch.float64) + 0.5) / _TWO_POW_53, max=_BELOW_ONE)


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
    keys = keys.to(tokens.device)
    j = torch.arange(1, num_arrivals + 1, dtype=torch.int64, device=tokens.device)
    return uniforms_from_keys(
        keys[:, 0, None, None], keys[:, 1, None, None], tokens[:, :, None], j[None, None, :]
    )  # (N, K, B)


def exponential_clocks(keys: torch.Tensor, tokens: torch.Tensor, num_arrivals: int) -> torch.Tensor:
    """Exp(1) clock increments E_{u,j} = −ln U(κ, u, j); same shapes as ``clock_uniforms``."""
    return -torch.log(clock_uniforms(keys, tokens, num_arrivals))


def pivot_array(keys: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``pivots`` on NumPy arrays (the detector's CPU path; the same bits).

    Args:
        keys: (T, 2) integer context keys (uint32 words). tokens: (T,) integer observed ids.
    Returns:
        (T,) float64 pivots in (0, 1).
    """
    keys = np.asarray(keys)
    tokens = np.asarray(tokens)
    if keys.ndim != 2 or keys.shape[1] != 2 or tokens.shape != (keys.shape[0],):
        raise ValueError(
            f"expected keys (T, 2) and tokens (T,), got {keys.shape} and {tokens.shape}"
        )
    ones = np.ones(tokens.shape[0], dtype=np.int64)  # arrival j = 1
    return _uniforms_cpu(_c_int64(tokens), ones, _c_int64(keys[:, 0]), _c_int64(keys[:, 1]))


def _c_int64(words: np.ndarray) -> np.ndarray:
    """``words`` as a writeable C-contiguous int64 array, copied only when it is not one (the
    kernels then run one compiled version whatever the caller had)."""
    if words.dtype == np.int64 and words.flags.c_contiguous and words.flags.writeable:
        return words
    return np.array(words, dtype=np.int64, order="C")


def _uniforms_cpu(c0: np.ndarray, c1: np.ndarray, k0: np.ndarray, k1: np.ndarray) -> np.ndarray:
    """U at counter (c0, c1, 0, 0) under key (k0, k1), on the CPU: the compiled kernel when it
    serves (``_kernels``), else NumPy; the same bits.

    Args:
        c0, c1, k0, k1: (N,) writeable C-contiguous int64 words in [0, 2^32) (``_c_int64``).
    Returns:
        (N,) float64 uniforms in (0, 1).
    """
    kernels = _kernels()
    if kernels is None:
        return _uniforms_numpy(c0, c1, k0, k1)
    out = np.empty(c0.shape[0], dtype=np.float64)
    kernels.uniforms_into(c0, c1, k0, k1, out)
    return out


def _uniforms_numpy(c0: np.ndarray, c1: np.ndarray, k0: np.ndarray, k1: np.ndarray) -> np.ndarray:
    """``_uniforms_cpu`` in NumPy alone (the fallback, and the reference the kernel is checked
    against): Philox words, then (top 53 bits + 0.5) / 2^53 clamped below 1."""
    u64 = np.uint64
    x0, x1 = _philox4x32_10_numpy(*(w.astype(u64) for w in (c0, c1, k0, k1)))
    top = ((x1 << u64(21)) | (x0 >> u64(11))).astype(np.float64)  # < 2^53: exact
    return np.minimum((top + 0.5) / _TWO_POW_53, _BELOW_ONE)


@functools.cache
def _kernels() -> ModuleType | None:
    """``keyed._kernels``, compiled (or loaded from numba's disk cache) and checked against the
    NumPy paths on this machine, or None: then every CPU path runs the NumPy code, the same
    bits. None silently when numba is not installed; with a warning (once per process) when it
    is but cannot serve — an import error (e.g. a NumPy newer than it supports), no writable
    cache location, a compile failure, or kernels that disagree with NumPy."""
    try:
        module = importlib.import_module("keyed._kernels")
        _check_kernels(module)
    except ModuleNotFoundError as exc:
        if exc.name == "numba":
            return None
        problem: Exception = exc
    except Exception as exc:  # detection must work whatever numba does here
        problem = exc
    else:
        return module
    logging.getLogger(__name__).warning(
        "keyed kernels unavailable (%s: %s); using the NumPy paths", type(problem).__name__,
        problem,
    )  # fmt: skip
    return None


def _check_kernels(module: ModuleType) -> None:
    """Run each kernel once (this compiles it, or loads it from the cache) and compare it with
    the NumPy path on 64 random words and a small plan. Raises ``RuntimeError`` on a mismatch.
    """
    rng = np.random.default_rng(0)
    c0, c1, k0, k1 = rng.integers(0, 2**32, size=(4, 64), dtype=np.int64)
    got = np.empty(64, dtype=np.float64)
    module.uniforms_into(c0, c1, k0, k1, got)
    ids = np.array([1, 2, 1, 2, 1, 3, 3], dtype=np.int64)  # m = 2: scored 2, 3, 6; repeats 4, 5
    skip, chosen = np.empty(7, dtype=np.int8), np.empty(7, dtype=np.int64)
    count = module.plan_into(ids, 2, 2, np.array([9], np.int64), skip, chosen, module.MULTIPLIER)
    if not (
        np.array_equal(got, _uniforms_numpy(c0, c1, k0, k1))
        and skip.tolist() == [1, 1, 0, 0, 2, 2, 0]
        and chosen[:count].tolist() == [2, 3, 6]
    ):
        raise RuntimeError("compiled keyed kernels disagree with the NumPy paths")


def pivots(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Pivots r_t = U(κ_t, w_t, 1) of observed tokens, for the detector.

    Args:
        keys: (T, 2) int64 context keys per scored position. tokens: (T,) int64 observed ids.
    Returns:
        (T,) float64 pivots in (0, 1).
    """
    if keys.ndim != 2 or keys.shape[1] != 2 or tokens.shape != (keys.shape[0],):
        raise ValueError(
            f"expected keys (T, 2) and tokens (T,), got {tuple(keys.shape)} and "
            f"{tuple(tokens.shape)}"
        )
    one = torch.ones((), dtype=torch.int64, device=tokens.device)
    return uniforms_from_keys(keys[:, 0], keys[:, 1], tokens.to(torch.int64), one)
