"""An edit-tolerant test for the keyed race: label re-alignment.

An edit destroys the labels after it: the m tokens after an inserted token carry a label that
contains it, so their pivots are no longer the race's. Re-alignment scores every position t
also under the labels its token would have had if one of the m + 1 tokens before it had been
inserted by an editor — the label of t with that token skipped — and combines the candidates
of t with an exact per-position law.

Glossary (m the context width, ids w_0..w_{T−1}):
- candidates of t (t >= m, w_t not special): the plain label (w_{t−m}, …, w_{t−1}) first,
  then for t >= m + 1 the labels of (w_{t−m−1}, …, w_{t−1}) without one of w_{t−m}, …,
  w_{t−1} (the token an editor may have inserted), earliest skipped first. All are
  (label, w_t) pairs of the same token.
- de-duplication: a label is used at most once in the whole text (its first occurrence, in
  the order (t, plain first, then the skips in that order)); later candidates with that
  label are dropped, and a position with none left is not scored. Labels are compared by
  their label keys κ(k, ℓ) (``keyed.label_key_words``, 128 bits; the pivots are computed
  from them), so the m-wide labels of all (m + 1)·T candidates are never held at once (O(T·m)
  memory, not O(T·m²)). Every kept candidate has a distinct κ, so under H0 (the text
  independent of the key) their pivots r are i.i.d. U(0, 1) (the PRF, docs/design.md §2). Which are
  kept depends on the text, and on the key only where two distinct labels share a κ (a
  128-bit collision: those two pivots would be one race's, so dropping one is what keeps the
  rest independent).
- weights: the plain candidate gets ``PLAIN_WEIGHT`` = 0.8 of position t's weight when it is
  kept and the skip candidates share the rest evenly (each of n kept candidates 1/n when the
  plain one was dropped; a lone candidate weight 1).
- per-position statistic: u_t = min_i (1 − r_i)/w_i, a weighted minimum; its exact H0 law is
  F(u) = 1 − Π_i (1 − min(1, w_i u)), continuous, so v_t = F(u_t) ~ U(0, 1) exactly and the
  term x_t = −ln v_t ~ Exp(1). A position with its plain candidate alone has x_t = −ln(1 − r),
  the Aaronson term.
- p-value: the terms of the M' scored positions are independent, Σ x_t ~ Gamma(M', 1):
  p = Q(M', Σ x_t), exact (``method`` ``"exact"``).

What it buys and costs (bench/results/detector.md, bench/results/detector_decision.md): an
intact watermarked position loses ln(1/0.8) ≈ 0.22 nats of its term (≈ 2.6 at T = 1); a
position behind an inserted token is recovered at ln((m)/0.2) ≈ 3 nats. It cannot recover
what a substitution or a deletion destroyed (the label needs the unknown original token).
CPU: m + 1 label keys per position (one keyed BLAKE2b each) instead of one; the whole
detection costs 1.9-2.2× as much per scored token (``bench/results/detector_realign_cost.json``);
the plain test stays the verdict's.

Shapes: T tokens, N kept candidates, M' scored positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from detector.stats import LN10, aaronson_log_sf
from keyed import Secret, label_key_words, pivot_array

PLAIN_WEIGHT: Final = 0.8
"""The plain label's share of a position's weight (chosen on the 40 design generations of
``bench/results/detector_generations.jsonl``, before the held-out set was generated)."""


@dataclass(frozen=True)
class RealignedTest:
    """The re-aligned test of one text under one key.

    Attributes:
        log_p: ln p, exact Gamma(M', 1) tail of ``score``, <= 0.
        score: Σ x_t over the scored positions.
        num_scored: M', positions with at least one kept candidate.
        num_candidates: N, (label, token) pairs whose pivots were computed.
    """

    log_p: float
    score: float
    num_scored: int
    num_candidates: int

    @property
    def p_value(self) -> float:
        return math.exp(self.log_p)

    @property
    def log10_p_value(self) -> float:
        return self.log_p / LN10

    def to_json(self) -> dict[str, Any]:
        """``{"name", "score", "p_value", "log10_p_value", "method", "num_scored",
        "num_candidates", "plain_weight"}``."""
        return {
            "name": "realigned",
            "score": self.score,
            "p_value": self.p_value,
            "log10_p_value": self.log10_p_value,
            "method": "exact",
            "num_scored": self.num_scored,
            "num_candidates": self.num_candidates,
            "plain_weight": PLAIN_WEIGHT,
        }


def _kept(
    ids: NDArray[np.int64], width: int, special: frozenset[int], secret: Secret
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """The kept candidates (module docstring), in (t, j) order: (skip (N,) int64 j (0: the
    plain label; j >= 1: the label of w_{t−m−1} .. w_{t−1} without its j-th token), owner (N,)
    int64 t, words (N, 2) int64 their label keys under ``secret``). Memory O(T·m): one j's
    labels at a time."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    t_count = ids.shape[0]
    m = width
    none = np.zeros(0, np.int64)
    empty = (none, none, np.zeros((0, 2), np.int64))
    if t_count <= m:
        return empty
    positions = np.arange(m, t_count, dtype=np.int64)  # (P,)
    if special:
        positions = positions[~np.isin(ids[positions], np.fromiter(special, np.int64))]
    if positions.size == 0:
        return empty
    # ext[p] = w_{t−m−1} .. w_{t−1} (w_{−1} stands for "none" at t = m: only j = 0 is valid)
    offsets = np.arange(-m - 1, 0, dtype=np.int64)  # (m + 1,)
    ext = ids[np.maximum(positions[:, None] + offsets[None, :], 0)]  # (P, m + 1)
    words = np.empty((positions.size, m + 1, 2), dtype=np.int64)  # (P, m + 1, 2)
    for j in range(m + 1):
        words[:, j] = label_key_words(secret, ext[:, _columns(m, j)])
    valid = np.ones((positions.size, m + 1), dtype=bool)
    valid[positions == m, 1:] = False  # no token before the window at t = m
    flat = np.flatnonzero(valid.reshape(-1))  # (N0,) into (P, m + 1), in (t, j) order
    all_words = words.reshape(-1, 2)[flat]  # (N0, 2)
    _, first = np.unique(all_words, axis=0, return_index=True)
    first.sort()
    slot, skip = np.divmod(flat[first], m + 1)
    return skip, positions[slot], all_words[first]


def _columns(m: int, j: int) -> NDArray[np.int64]:
    """The columns of w_{t−m−1} .. w_{t−1} in the label that skips column j (0: the plain
    label w_{t−m} .. w_{t−1})."""
    return np.delete(np.arange(m + 1, dtype=np.int64), j)


def candidates(
    ids: NDArray[np.int64], width: int, special: frozenset[int], secret: Secret
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.bool_]]:
    """The kept candidates of a text under a key, in order (module docstring).

    Args:
        ids: (T,) int64 token ids. width: m >= 1. special: ids never scored. secret: the key's.
    Returns:
        (labels (N, m) int64, owners (N,) int64 the position t of each, plain (N,) bool);
        owners non-decreasing, each position's plain candidate (if kept) first.
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    skip, owner, _ = _kept(ids, width, special, secret)
    offsets = np.arange(-width - 1, 0, dtype=np.int64)  # (m + 1,)
    labels = np.zeros((owner.size, width), dtype=np.int64)  # (N, m)
    for j in range(width + 1):
        rows = np.flatnonzero(skip == j)
        labels[rows] = ids[owner[rows][:, None] + offsets[_columns(width, j)][None, :]]
    return labels, owner, skip == 0


def realigned_test(
    ids: NDArray[np.int64], width: int, special: frozenset[int], secret: Secret
) -> RealignedTest:
    """The re-aligned p-value of a text under a key (module docstring).

    Args:
        ids: (T,) int64 the text's token ids. width: the key's context width m.
        special: ids never scored. secret: the key's secret.
    Memory O(T·m); CPU: (m + 1) label keys of m ids per scorable position.
    """
    skip, owner, words = _kept(ids, width, special, secret)
    n = int(owner.size)
    if n == 0:
        return RealignedTest(0.0, 0.0, 0, 0)
    tokens = np.asarray(ids, dtype=np.int64).reshape(-1)[owner]  # (N,)
    r = pivot_array(words, tokens)  # (N,)
    terms = position_terms(r, owner, skip == 0)
    score = float(np.sum(terms))
    return RealignedTest(aaronson_log_sf(int(terms.size), score), score, int(terms.size), n)


def position_terms(
    r: NDArray[np.float64], owner: NDArray[np.int64], plain: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """x_t = −ln F(u_t) per position: (N,) pivots, owners, plain flags -> (M',) float64."""
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])  # (M',) group heads
    sizes = np.diff(np.r_[starts, owner.size])  # (M',)
    size_of = np.repeat(sizes, sizes)  # (N,)
    has_plain = np.repeat(plain[starts], sizes)  # the plain candidate is its group's head
    weights = np.where(
        size_of == 1,
        1.0,
        np.where(
            has_plain,
            np.where(plain, PLAIN_WEIGHT, (1.0 - PLAIN_WEIGHT) / np.maximum(size_of - 1, 1)),
            1.0 / size_of,
        ),
    )  # (N,)
    ratio = (1.0 - r) / weights  # (N,)
    u = np.minimum.reduceat(ratio, starts)  # (M',)
    wu = np.minimum(1.0, weights * np.repeat(u, sizes))  # (N,)
    log_survive = np.add.reduceat(np.log1p(-np.minimum(wu, 1.0 - 2.0**-53)), starts)
    saturated = np.maximum.reduceat(wu, starts) >= 1.0  # some factor is 0: F(u) = 1
    v = np.where(saturated, 1.0, -np.expm1(log_survive))  # (M',) F(u_t) in (0, 1]
    return np.asarray(np.maximum(-np.log(v), 0.0), dtype=np.float64)
