"""Labels, the repeated-context rule and the keyed source Π(k, ℓ) (DESIGN §2).

Glossary:
- label ℓ(c): the last m token ids of the context c, oldest first; a context shorter than m is
  left-padded with ``SENTINEL``.
- keyed source: the context key (κ0, κ1) from which every clock at a context is drawn.
- repeated context: a position whose label was already used earlier in the same response
  (generation) or already scored in the same text (detection). With masking on, generation
  draws such a position's clocks from the per-request nonce stream keyed by (nonce, position),
  and detection skips it, because reusing clocks would count the same evidence twice and
  invites loops (MPFR paper §4, "repeated-context masking").

Both the sampler and the detector go through ``KeyedSource.context_key`` and
``detection_plan``; nothing else in the project derives context keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

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
        masking: the repeated-context rule is on.
        nonce: per-request nonce in [0, 2^64) for the clocks of repeated contexts.
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
        """Philox key of the context at response ``position`` with ``label``.

        ``repeated`` says the label was already used earlier in this response; with masking on
        such a context draws from the nonce stream instead of the label's keyed source.
        """
        if repeated and self.masking:
            return nonce_key(self.secret, self.nonce, position)
        return label_key(self.secret, label)


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
    """Which positions of a text are scored, and under which label (DESIGN §2, detection).

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
