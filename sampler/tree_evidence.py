"""What tree steps showed, one request's or a process's (``sampler.autotree``): per B the
levels reached and accepted, and running means of the drafter's seconds per level, the fill,
the proposal rate, the step's other seconds and the forward scales; a process keeps one
``TreeMemory`` per target, drafter and processing, from which a new request starts.

Shapes: B drafts; levels 1..L (lists indexed by level − 1).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Final

from sampler.targets.profile import ForwardProfile

MEMORY_COST_STEPS: Final = 64.0  # a new request's start: the process's costs, as this many steps
MEMORY_ACCEPTANCE_STEPS: Final = 16.0  # ... and its acceptance and proposal rate


@dataclass
class _Mean:
    """A running mean (``None`` until the first value)."""

    total: float = 0.0
    count: float = 0.0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    def get(self, default: float) -> float:
        return self.total / self.count if self.count else default

    def capped(self, count: float) -> _Mean:
        """The same mean, weighing at most ``count`` values."""
        if self.count <= count:
            return _Mean(self.total, self.count)
        return _Mean(self.total * count / self.count, count)


@dataclass
class Evidence:
    """What tree steps showed: per B the levels reached and accepted, and running means of
    the drafter's seconds per level, the fill f, the proposal rate π, the other seconds o and
    the forward scales (module docstring). One request's (``TreeChooser``) or a process's
    (``TreeMemory``)."""

    reached: dict[int, list[float]] = field(default_factory=dict)
    accepted: dict[int, list[float]] = field(default_factory=dict)
    draft_level: _Mean = field(default_factory=_Mean)  # seconds per drafted level
    fill: _Mean = field(default_factory=_Mean)  # proposed nodes / planned B·ℓ
    proposing: _Mean = field(default_factory=_Mean)  # tree steps with a proposal: 1, else 0
    other: _Mean = field(default_factory=_Mean)  # seconds of a step besides forward + drafts
    scale: dict[tuple[bool, bool], _Mean] = field(
        default_factory=lambda: {(t, s): _Mean() for t in (False, True) for s in (False, True)}
    )  # measured / profiled forward seconds by (tree step, node count changed from the last)

    def add(
        self,
        profile: ForwardProfile,
        drafts: int,
        depth: int,
        proposed: int,
        accepted: int,
        stopped: bool,
        draft_seconds: float,
        other_seconds: float,
        forward_seconds: float | None,
        max_depth: int,
        switched: bool = False,
        drafting: bool = True,
    ) -> None:
        """Count one step (``TreeChooser.observe``'s arguments; ``switched``: its node count
        differs from the step before's; ``drafting`` False: its drafting seconds are a share
        of a batch's and not counted)."""
        self.other.add(other_seconds)
        if forward_seconds is not None:
            ratio = forward_seconds / profile.cost(1 + proposed)
            self.scale[(proposed > 0, switched)].add(ratio)
        if depth == 0:
            return
        if drafting:
            self.draft_level.add(draft_seconds / depth)
        self.fill.add(proposed / (drafts * depth))
        self.proposing.add(1.0 if proposed else 0.0)
        if not proposed:  # nothing to accept: the acceptance rates count proposals only
            return
        reached = self.reached.setdefault(drafts, [])
        hits = self.accepted.setdefault(drafts, [])
        if len(reached) < max_depth:  # a process's requests may differ in L
            reached.extend([0.0] * (max_depth - len(reached)))
            hits.extend([0.0] * (max_depth - len(hits)))
        for level in range(1, min(accepted + (0 if stopped else 1), depth, max_depth) + 1):
            reached[level - 1] += 1
            if level <= accepted:
                hits[level - 1] += 1

    def seed(self, max_depth: int) -> Evidence:
        """A new request's start from a process's evidence (module docstring): costs weighing
        at most ``MEMORY_COST_STEPS`` steps, acceptance and proposal rate
        ``MEMORY_ACCEPTANCE_STEPS``, levels beyond ``max_depth`` dropped."""
        out = Evidence(
            draft_level=self.draft_level.capped(MEMORY_COST_STEPS),
            fill=self.fill.capped(MEMORY_COST_STEPS),
            proposing=self.proposing.capped(MEMORY_ACCEPTANCE_STEPS),
            other=self.other.capped(MEMORY_COST_STEPS),
            scale={k: v.capped(MEMORY_COST_STEPS) for k, v in self.scale.items()},
        )
        for drafts, reached in self.reached.items():
            weight = min(1.0, MEMORY_ACCEPTANCE_STEPS / reached[0]) if reached[0] else 1.0
            levels = [0.0] * max_depth
            hits = [0.0] * max_depth
            for level in range(min(max_depth, len(reached))):
                levels[level] = reached[level] * weight
                hits[level] = self.accepted[drafts][level] * weight
            out.reached[drafts], out.accepted[drafts] = levels, hits
        return out


@dataclass
class TreeMemory:
    """A process's tree evidence for one target, drafter and processing (module docstring);
    ``memory_for`` gives the shared one. Thread-safe: the service's workers step requests from
    several threads."""

    evidence: Evidence = field(default_factory=Evidence)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def seed(self, max_depth: int) -> Evidence:
        with self.lock:
            return self.evidence.seed(max_depth)


_MEMORIES: weakref.WeakKeyDictionary[object, dict[tuple[object, ...], TreeMemory]] = (
    weakref.WeakKeyDictionary()
)
_MEMORIES_LOCK = threading.Lock()


def memory_for(target: object, drafter: str, processing: object) -> TreeMemory:
    """The process's ``TreeMemory`` for ``target`` (held weakly: it goes with the target),
    the drafter's name and the request's processing (acceptance moves with T, top-k, top-p)."""
    with _MEMORIES_LOCK:
        memories = _MEMORIES.setdefault(target, {})
        return memories.setdefault((drafter, processing), TreeMemory())
