"""Test references for the keyed PRF: plain versions of production paths, to compare against.

These have no caller in the packages (the detector uses ``keyed.pivot_array`` and
``keyed.label_key_words``), so they live here rather than in ``keyed/``:

- ``pivots``: the detector's pivots r_t = U(κ_t, w_t, 1) through the tensor path
  (``keyed.tensor.uniforms_from_keys``, arrival 1), i.e. the sampler's first-arrival clock.
- ``label_keys``: ``label_key`` of many labels from one keyed BLAKE2b state (copied per label),
  a second derivation to hold ``label_key_words`` to.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import torch

from keyed.prf import TAG_CLOCK, Secret
from keyed.tensor import uniforms_from_keys


def pivots(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Pivots of observed tokens on tensors.

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


def label_keys(secret: Secret, labels: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """``label_key`` of many labels: the keyed state after the length-prefixed ``b"clock"`` tag
    is built once and copied for each label (hashing is streaming, so each digest is that of the
    full message).

    Args:
        secret: the key's secret. labels: (N,) labels of m token ids in [0, 2^32) each.
    Returns:
        (N,) ``(κ0, κ1)`` pairs.
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
            bad = next((t for t in label if not (isinstance(t, int) and 0 <= t < 2**32)), label)
            raise ValueError(f"expected label ids in [0, 2^32), got {bad}") from None
        k0, k1 = struct.unpack("<II", h.digest())
        keys.append((k0, k1))
    return keys
