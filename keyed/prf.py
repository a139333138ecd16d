"""The keyed PRF: secret x label x token x arrival -> uniform in (0, 1); its CPU path.

This module is the only home of keyed randomness (docs/design.md §2). The sampler (on any device)
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
   Arrival j is its own counter, so ``G_{u,1}`` does not depend on how many arrivals (drafts
   B) are requested.

Where each part lives (no module here imports torch but ``keyed.tensor``):
- here: the version, ``Secret``, the context keys (step 1), and the CPU uniforms — the
  detector's ``pivot_array`` and the CPU branch of the sampler's clocks;
- ``keyed.philox``: step 2 in NumPy (the fallback, and the reference for the others);
- ``keyed._kernels`` (numba), loaded and checked by ``keyed._kernel_loader``: step 2 compiled,
  used on the CPU whenever it serves, and steps 1-2 together for many secrets
  (``pivot_matrix``, multi-key detection);
- ``keyed.tensor``: step 2 in torch integer ops, identical on CPU and CUDA — the sampler's
  clocks (``clock_uniforms``, ``exponential_clocks``). Imported by the sampler only.

Shapes: T positions; keys (T, 2) int64 uint32 words, tokens (T,) int64, pivots (T,) float64.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import struct
from collections.abc import Sequence
from types import ModuleType
from typing import Final, cast

import numpy as np

from keyed import _kernel_loader
from keyed.philox import MASK32, uniforms_numpy

PRF_VERSION: Final = 1
SECRET_BYTES: Final = 32
SENTINEL: Final = 0xFFFFFFFF  # pads labels of positions with fewer than m tokens before them

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
        if not 0 <= t <= MASK32:
            raise ValueError(f"expected label ids in [0, 2^32), got {t}")
    payload = struct.pack(f"<I{len(ids)}I", len(ids), *ids)
    return _derive(secret, TAG_CLOCK, payload)


def label_key_words(secret: Secret, labels: np.ndarray) -> np.ndarray:
    """``label_key`` of each row of an (N, m) array of labels: the detector's path.

    The same words as ``label_key``, bit for bit: the payloads ``m ‖ ids`` (uint32 LE) are laid
    out by NumPy in one buffer and each is hashed from a copy of the keyed BLAKE2b state after
    the length-prefixed tag (built once: hashing is streaming, so each digest is that of the
    full message).

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
    if labels.size and (labels.min() < 0 or labels.max() > MASK32):
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


def pivot_matrix(secrets: Sequence[Secret], labels: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Pivots of one text under many secrets at once: multi-key detection's path.

    Row k is ``pivot_array(label_key_words(secrets[k], labels), tokens)`` bit for bit (tested):
    the labels' messages are laid out once, then the compiled kernel (``keyed._kernels``) runs
    keyed BLAKE2b and Philox per (secret, label) with no Python in between — the key block
    once per secret, one compression per label for m <= 28. Without the kernels, the one-key
    path per secret.

    Args:
        secrets: K secrets. labels: (N, m) integer label ids in [0, 2^32), m >= 1.
        tokens: (N,) integer observed ids.
    Returns:
        (K, N) float64 pivots in (0, 1).
    Raises:
        ValueError: shapes as above, a label id outside [0, 2^32), or a non-``Secret``.
    """
    labels = np.asarray(labels)
    tokens = np.asarray(tokens)
    if labels.ndim != 2 or labels.shape[1] < 1 or tokens.shape != (labels.shape[0],):
        raise ValueError(
            f"expected labels (N, m) and tokens (N,), got {labels.shape} and {tokens.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() > MASK32):
        raise ValueError("expected label ids in [0, 2^32)")
    if not all(isinstance(secret, Secret) for secret in secrets):
        raise ValueError("expected every secret to be a keyed.prf.Secret")
    kernels = _kernel_loader.kernels_for(len(secrets) * labels.shape[0])
    if kernels is None:
        rows = [pivot_array(label_key_words(secret, labels), tokens) for secret in secrets]
        return np.stack(rows) if rows else np.empty((0, labels.shape[0]), dtype=np.float64)
    messages, length = label_messages(labels)
    blocks = key_blocks(secrets)
    out = np.empty((len(secrets), labels.shape[0]), dtype=np.float64)
    try:
        kernels.pivots_many_into(blocks, messages, length, as_int64_words(tokens), out)
    finally:
        blocks.fill(0)  # no copy of key material outlives the call
    return out


def key_blocks(secrets: Sequence[Secret]) -> np.ndarray:
    """(K, 16) uint64: each secret zero-padded to BLAKE2b's 128-byte key block (LE words).
    Key material: the caller zeroes it after use."""
    raw = np.zeros((len(secrets), 128), dtype=np.uint8)
    for row, secret in zip(raw, secrets, strict=True):
        row[:SECRET_BYTES] = np.frombuffer(secret.reveal(), dtype=np.uint8)
    blocks = raw.view("<u8").astype(np.uint64)  # (K, 16) host-order words
    raw.fill(0)
    return blocks


def label_messages(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """The messages ``label_key_words`` hashes (length-prefixed ``TAG_CLOCK`` ‖ m ‖ ids, all
    uint32 LE) as (N, 16·B) uint64 words zero-padded to B 128-byte blocks, and their length in
    bytes (the same for every row)."""
    n, m = labels.shape
    prefix = struct.pack("<I", len(TAG_CLOCK)) + TAG_CLOCK
    length = len(prefix) + 4 * (m + 1)
    blocks = max(1, -(-length // 128))
    raw = np.zeros((n, 128 * blocks), dtype=np.uint8)
    raw[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    payload = np.empty((n, m + 1), dtype="<u4")
    payload[:, 0] = m
    payload[:, 1:] = labels
    raw[:, len(prefix) : length] = payload.view(np.uint8).reshape(n, 4 * (m + 1))
    return raw.view("<u8").astype(np.uint64), length  # (N, 16·B)


def nonce_key(secret: Secret, nonce: int, position: int) -> tuple[int, int]:
    """Philox key for the nonce stream at a response position (repeated-context rule).

    Args:
        nonce: the request nonce in [0, 2^64). position: 0-based index in the response.
    Raises:
        ValueError: nonce or position out of range.
    """
    if not 0 <= nonce < 2**64:
        raise ValueError(f"expected a nonce in [0, 2^64), got {nonce}")
    if not 0 <= position <= MASK32:
        raise ValueError(f"expected a position in [0, 2^32), got {position}")
    return _derive(secret, TAG_NONCE_CLOCK, struct.pack("<QI", nonce, position))


def pivot_array(keys: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Pivots r_t = U(κ_t, w_t, 1) of observed tokens: the detector's path (docs/design.md §4), the
    same bits as the sampler's first-arrival clocks (``keyed.tensor.clock_uniforms``).

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
    c0, k0, k1 = (as_int64_words(words) for words in (tokens, keys[:, 0], keys[:, 1]))
    ones = np.ones(tokens.shape[0], dtype=np.int64)  # arrival j = 1
    return uniforms_cpu(c0, ones, k0, k1)


def as_int64_words(words: np.ndarray) -> np.ndarray:
    """``words`` as a writeable C-contiguous int64 array, copied only when it is not one (the
    kernels then run one compiled version whatever the caller had)."""
    if words.dtype == np.int64 and words.flags.c_contiguous and words.flags.writeable:
        return words
    return np.array(words, dtype=np.int64, order="C")


def uniforms_cpu(c0: np.ndarray, c1: np.ndarray, k0: np.ndarray, k1: np.ndarray) -> np.ndarray:
    """U at counter (c0, c1, 0, 0) under key (k0, k1), on the CPU: the compiled kernel when it
    serves (``keyed._kernel_loader``), else NumPy (``keyed.philox``); the same bits.

    Args:
        c0, c1, k0, k1: (N,) writeable C-contiguous int64 words in [0, 2^32)
            (``as_int64_words``).
    Returns:
        (N,) float64 uniforms in (0, 1).
    """
    kernels = _kernel_loader.kernels_for(c0.shape[0])
    if kernels is None:
        return uniforms_numpy(c0, c1, k0, k1)
    out = np.empty(c0.shape[0], dtype=np.float64)
    kernels.uniforms_into(c0, c1, k0, k1, out)
    return out


def _pivots_many_agree(module: ModuleType) -> bool:
    """``pivots_many_into`` (compiled BLAKE2b + Philox) against hashlib's BLAKE2b and the NumPy
    Philox, for one- and three-block messages (m = 4 and m = 64)."""
    rng = np.random.default_rng(0)
    secrets = [Secret(bytes(range(32))), Secret(bytes(32))]
    for width in (4, 64):
        labels = rng.integers(0, 2**32, size=(3, width), dtype=np.int64)
        tokens = rng.integers(0, 2**32, size=3, dtype=np.int64)
        messages, length = label_messages(labels)
        got = np.empty((2, 3), dtype=np.float64)
        module.pivots_many_into(key_blocks(secrets), messages, length, tokens, got)
        for row, secret in zip(got, secrets, strict=True):
            words = label_key_words(secret, labels)  # hashlib, no kernel
            ones = np.ones(3, dtype=np.int64)
            if not np.array_equal(row, uniforms_numpy(tokens, ones, words[:, 0], words[:, 1])):
                return False
    return True


_kernel_loader.add_check(_pivots_many_agree)
