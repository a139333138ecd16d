"""Labels, the repeated-context rule and the keyed source Π(k, ℓ) (docs/design.md §2).

Glossary:
- label ℓ(c): the last m token ids of the context c, oldest first; a context shorter than m is
  left-padded with ``SENTINEL``.
- keyed source: the context key (κ0, κ1) from which every clock at a context is drawn.
- repeated context: a position whose label was already used earlier in the same response
  (generation) or already scored in the same text (detection). With masking on, generation
  draws such a position's clocks from the per-request nonce stream keyed by (nonce, position),
  and detection skips it, because reusing clocks would count the same evidence twice and
  invites loops (MPFR paper §4, "repeated-context masking").
- prompt window: the first m response positions, whose labels reach into the prompt. Detection
  sees only the text and never scores them (``no_context``); with masking on, generation draws
  them from the nonce stream too, so two calls with the same key and prompt but different
  nonces are fresh samples (the whole continuation differs). No PRF vector changes, only which
  positions are keyed. With masking off, every position is keyed by its label and the output
  is a function of (key, prompt) alone.

Both the sampler and the detector go through ``KeyedSource.context_key`` and
``detection_plan``; nothing else in the project derives context keys.

Shapes: T tokens of the text (ids int64), m the context width, M scored positions. Skip codes
(T,) int8, scored positions (M,) int64 increasing, labels (M, m) int64 oldest id first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from keyed import _kernel_loader
from keyed.prf import PRF_VERSION, SENTINEL, Secret, label_key, nonce_key

Label = tuple[int, ...]

MAX_CONTEXT_WIDTH = 64


def label_at(tokens: Sequence[int], position: int, width: int) -> Label:
    """Label of ``tokens[position]``: the ``width`` ids before it, ``SENTINEL``-padded on the left.

    Args:
        tokens: token ids (prompt and response together for generation; the text for detection).
        position: 0-based index of the position being labelled, 0 <= position <= len(tokens).
        width: context width m >= 1.
    """
    start = position - width
    if start >= 0:
        return tuple(map(int, tokens[start:position]))
    return (SENTINEL,) * (-start) + tuple(map(int, tokens[:position]))


@dataclass(frozen=True)
class KeyedSource:
    """Where the clocks of a context come from, for one request.

    Attributes:
        secret: the key's 32-byte secret (never printed).
        context_width: m, the number of ids in a label (1..64).
        masking: the repeated-context rule is on (and the prompt window draws from the nonce
            stream).
        nonce: per-request nonce in [0, 2^64) for the clocks of repeated contexts and of the
            prompt window.
        prf_version: must equal ``PRF_VERSION``.
    Raises:
        ValueError: at construction, for out-of-range parameters.
    """

    secret: Secret
    context_width: int = 4
    masking: bool = True
    nonce: int = 0
    prf_version: int = PRF_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.secret, Secret):
            raise ValueError(f"expected secret to be a Secret, got {type(self.secret).__name__}")
        if not 1 <= self.context_width <= MAX_CONTEXT_WIDTH:
            raise ValueError(
                f"expected context_width in [1, {MAX_CONTEXT_WIDTH}], got {self.context_width}"
            )
        if not 0 <= self.nonce < 2**64:
            raise ValueError(f"expected nonce in [0, 2^64), got {self.nonce}")
        if self.prf_version != PRF_VERSION:
            raise ValueError(
                f"unsupported prf_version {self.prf_version}; this build has {PRF_VERSION}"
            )

    def context_key(self, label: Label, position: int, repeated: bool) -> tuple[int, int]:
        """Philox key of the context at response ``position`` (0-based) with ``label``.

        ``repeated`` says the label was already keyed at an earlier response position. With
        masking on, such a context, and one in the prompt window (``position < m``: its label
        reaches into the prompt, and detection never scores it), draws from the nonce stream
        instead of the label's keyed source.
        """
        if self.masking and (repeated or self.in_prompt_window(position)):
            return nonce_key(self.secret, self.nonce, position)
        return label_key(self.secret, label)

    def in_prompt_window(self, position: int) -> bool:
        """Response ``position``'s label reaches into the prompt (the first m positions)."""
        return position < self.context_width


class SkipReason(StrEnum):
    """Why the detector does not score a position."""

    NO_CONTEXT = "no_context"
    REPEATED_CONTEXT = "repeated_context"
    SPECIAL_TOKEN = "special_token"


@dataclass(frozen=True)
class PlannedPosition:
    """One position of a text as the detector sees it: scored with its label, or skipped."""

    position: int
    label: Label | None
    skip: SkipReason | None


def detection_plan(
    tokens: Sequence[int],
    width: int,
    masking: bool = True,
    special_ids: frozenset[int] = frozenset(),
) -> list[PlannedPosition]:
    """Which positions of a text are scored, and under which label (docs/design.md §2, detection).

    Position t (0-based) is scored iff its whole window lies in the text (t >= m), the token is
    not a special token, and (with masking) its label has not been scored before in the text.

    Args:
        tokens: (T,) token ids of the text alone (no prompt).
        width: the key's context width m.
        masking: the key's repeated-context masking flag.
        special_ids: ids never scored (BOS/EOS/chat markers).
    Returns:
        one ``PlannedPosition`` per token, in order.
    """
    seen: set[Label] = set()
    plan: list[PlannedPosition] = []
    for t, token in enumerate(tokens):
        if int(token) in special_ids:
            plan.append(PlannedPosition(t, None, SkipReason.SPECIAL_TOKEN))
            continue
        if t < width:
            plan.append(PlannedPosition(t, None, SkipReason.NO_CONTEXT))
            continue
        label = label_at(tokens, t, width)
        if masking and label in seen:
            plan.append(PlannedPosition(t, label, SkipReason.REPEATED_CONTEXT))
            continue
        seen.add(label)
        plan.append(PlannedPosition(t, label, None))
    return plan


# Codes of ``DetectionPlan.skip``: 0 = scored, then one per ``SkipReason`` in this order.
SKIP_CODES: tuple[SkipReason | None, ...] = (
    None,
    SkipReason.NO_CONTEXT,
    SkipReason.REPEATED_CONTEXT,
    SkipReason.SPECIAL_TOKEN,
)


@dataclass(frozen=True)
class DetectionPlan:
    """``detection_plan`` as arrays (the detector's fast path; the same decisions).

    Attributes:
        skip: (T,) int8, 0 where the position is scored, else the index of its reason in
            ``SKIP_CODES``.
        scored: (M,) int64 positions scored, increasing.
        labels: (M, m) int64 labels of the scored positions (``label_at``), oldest id first.
    """

    skip: np.ndarray
    scored: np.ndarray
    labels: np.ndarray


def detection_plan_arrays(
    tokens: np.ndarray, width: int, special_ids: frozenset[int] = frozenset()
) -> DetectionPlan:
    """``detection_plan(tokens, width, masking=True, special_ids)`` on arrays: the detector's path.

    A position t >= m that is not a special token is a candidate; a candidate is scored iff no
    earlier candidate has the same label (its first occurrence), which is exactly the reference
    loop's "not in ``seen``", since ``seen`` collects the labels of scored positions and every
    candidate's label is first seen at a scored position. Two implementations, tested equal to
    the loop: the compiled kernel (``keyed/_kernels.py``: one pass, a hash table of labels
    packed into one uint64) when numba is there and the labels pack (m · bits <= 64), else
    NumPy (a stable sort of the label rows groups repeats; the head of each group is first).

    Args:
        tokens: (T,) integer token ids of the text alone.
        width: the context width m >= 1.
        special_ids: ids never scored.
    Returns:
        a ``DetectionPlan``; checked against ``detection_plan`` in ``tests/keyed``.
    """
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    n = ids.shape[0]
    if n > width and (kernels := _kernel_loader.kernels_for(n)) is not None:
        bits = max(int(ids.max()).bit_length(), 1)
        if ids.min() >= 0 and bits * width <= 64:  # labels pack into one uint64
            skip = np.empty(n, dtype=np.int8)
            chosen = np.empty(n, dtype=np.int64)
            # ids are in [0, 2^63) here: a special id outside cannot match one
            special = np.array([s for s in special_ids if 0 <= s < 2**63], dtype=np.int64)
            text = np.array(ids)  # a writeable copy: one compiled specialisation
            scored = chosen[
                : kernels.plan_into(text, width, bits, special, skip, chosen, kernels.MULTIPLIER)
            ]
            return DetectionPlan(skip, scored, ids[scored[:, None] + _LABEL_OFFSETS[width]])
    return _plan_numpy(ids, width, special_ids)


def _plan_numpy(ids: np.ndarray, width: int, special_ids: frozenset[int]) -> DetectionPlan:
    """``detection_plan_arrays`` without the compiled kernel (or for labels too wide to pack)."""
    n = ids.shape[0]
    skip = np.zeros(n, dtype=np.int8)
    skip[:width] = 1  # no_context
    for special in special_ids:  # a handful of ids: cheaper than np.isin's sort
        skip[ids == special] = 3  # special tokens first, as the reference loop checks them first
    if n <= width:
        return DetectionPlan(skip, np.zeros(0, np.int64), np.zeros((0, width), np.int64))
    candidates = np.flatnonzero(skip[width:] == 0) + width  # positions t >= m, not special
    labels = ids[candidates[:, None] + _LABEL_OFFSETS[width]]  # (C, m): ids[t - m : t]
    row_keys = _label_row_keys(ids, labels, candidates, width)  # (C,)
    # First occurrence of each label among the candidates: a stable sort groups equal keys
    # in text order, so the head of each group is the earliest (np.unique's return_index,
    # without its generic overhead on a few hundred rows).
    order = np.argsort(row_keys, kind="stable")
    ordered = row_keys[order]
    head = np.empty(order.shape[0], dtype=bool)
    head[:1] = True
    head[1:] = ordered[1:] != ordered[:-1]
    is_first = np.zeros(order.shape[0], dtype=bool)
    is_first[order[head]] = True
    skip[candidates[~is_first]] = 2  # repeated_context
    return DetectionPlan(skip, candidates[is_first], labels[is_first])


_LABEL_OFFSETS = {m: np.arange(-m, 0, dtype=np.int64) for m in range(1, MAX_CONTEXT_WIDTH + 1)}


def _label_row_keys(
    ids: np.ndarray, labels: np.ndarray, candidates: np.ndarray, width: int
) -> np.ndarray:
    """One comparable value per label row, equal iff the rows are equal.

    The ids packed into one uint64 when they fit (m * bits <= 64: m = 4 with a vocabulary
    below 2^16, as SmolLM2's), built from shifted slices of the whole text; otherwise the raw
    bytes of each row (a void scalar).

    Args:
        ids: (T,) int64 text. labels: (C, m) int64 rows ``ids[t - m : t]`` of the candidates.
        candidates: (C,) positions t. width: m.
    """
    bits = max(int(ids.max()).bit_length(), 1)
    if ids.min() >= 0 and bits * width <= 64:
        words = ids.view(np.uint64)  # non-negative: the same bits
        span = ids.shape[0] - width
        packed = np.zeros(span, dtype=np.uint64)  # packed[i]: label of position i + m
        shift = np.uint64(bits)
        for j in range(width):
            packed <<= shift
            packed |= words[j : j + span]
        keys: np.ndarray = packed[candidates - width]
        return keys
    rows = np.ascontiguousarray(labels)
    voids: np.ndarray = rows.view(np.dtype((np.void, rows.dtype.itemsize * width))).reshape(-1)
    return voids
