"""Coarse evidence bands: where in a text the watermark shows, without the keyed PRF.

A token's pivot r_t and its per-token terms are outputs of the keyed PRF: returned for every
token they say exactly which tokens carry the mark (what to edit to remove it) and, collected,
help to forge it. The bands say where the evidence is strong at the grain of a block of
scored tokens, never of one token.

Glossary (T tokens, M scored):
- **block**: ``BAND_BLOCK`` consecutive scored tokens (skipped tokens in between belong to no
  block); the last ``M mod BAND_BLOCK`` scored tokens join the block before them, so every
  block holds at least ``BAND_BLOCK`` of them (a text with fewer scored tokens is one block).
- **band**: the block's mean Aaronson term −ln(1 − r_t) cut at ``BAND_EDGES``: 0 (at most
  1.25: what text without the watermark averages, 1), 1 (up to 1.75), 2 (up to 2.5), 3 (above
  2.5). Every scored token of a block carries the block's band.

Under H0 a block's mean is Gamma(b, 1/b) (b its size); for b = 8 it exceeds 1.25 with
probability 0.22 and 2.5 with 0.0008.

Shapes: T tokens of the text, M of them scored. Skip codes (T,) int8 (0: scored), Aaronson
terms (M,) float64 in text order, bands (T,) int8 (``NO_BAND`` where skipped).
"""

from __future__ import annotations

from typing import Final

import numpy as np

BAND_BLOCK: Final = 8
"""Scored tokens per block (the last block takes the remainder too)."""
BAND_EDGES: Final = (1.25, 1.75, 2.5)
"""Upper edges of bands 0, 1, 2 of a block's mean Aaronson term (nats); band 3 is above."""
NUM_BANDS: Final = len(BAND_EDGES) + 1
NO_BAND: Final = -1
"""The band of a skipped token."""


def evidence_bands(skip: np.ndarray, aaronson: np.ndarray, block: int = BAND_BLOCK) -> np.ndarray:
    """Each token's band (module docstring).

    Args:
        skip: (T,) int codes, 0 for a scored token (``detector.evidence.TokenColumns.skip``).
        aaronson: (M,) float64 Aaronson terms of the scored tokens, in text order.
        block: scored tokens per block, >= 1.
    Returns:
        (T,) int8: the band in [0, ``NUM_BANDS``) of each scored token, ``NO_BAND`` for each
        skipped one.
    Raises:
        ValueError: shapes that do not match, or ``block`` < 1.
    """
    if block < 1:
        raise ValueError(f"expected block >= 1, got {block}")
    if skip.ndim != 1 or aaronson.ndim != 1:
        raise ValueError(f"expected 1-D skip and terms, got {skip.shape} and {aaronson.shape}")
    scored = skip == 0
    m = int(np.count_nonzero(scored))
    if aaronson.shape != (m,):
        raise ValueError(
            f"expected ({m},) Aaronson terms for the scored tokens, got {aaronson.shape}"
        )
    out = np.full(skip.shape, NO_BAND, dtype=np.int8)
    if m == 0:
        return out
    blocks = max(1, m // block)
    which = np.minimum(np.arange(m) // block, blocks - 1)  # (M,) block of each scored token
    sums = np.bincount(which, weights=aaronson.astype(np.float64), minlength=blocks)  # (blocks,)
    sizes = np.bincount(which, minlength=blocks)  # (blocks,)
    bands = np.searchsorted(np.asarray(BAND_EDGES), sums / sizes, side="left")  # (blocks,)
    out[scored] = bands[which].astype(np.int8)
    return out
