"""What tree steps showed, one request's or a process's (``sampler.autotree``): per B the
levels reached and accepted, and running means of the drafter's seconds per level, the fill,
the proposal rate, the step's other seconds and the forward scales; a process keeps one
``TreeMemory`` per target, drafter and processing, from which a new request starts, and keeps
it on disk beside the target's forward profile (``TreeMemory.save``: the evidence a request
starts from, capped as ``Evidence.seed`` caps it), so that a new process — each command-line
generation is one — starts from what the machine's last ones learnt instead of the priors.

Shapes: B drafts; levels 1..L (lists indexed by level − 1).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from sampler.processing_config import Processing
from sampler.targets.base import Target
from sampler.targets.profile import ForwardProfile, cache_path, machine_fingerprint, write_json

log = logging.getLogger("poissonmark.autotree")

MEMORY_COST_STEPS: Final = 64.0  # a new request's start: the process's costs, as this many steps
MEMORY_ACCEPTANCE_STEPS: Final = 16.0  # ... and its acceptance and proposal rate
SAVE_EVERY_S: Final = 30.0  # a memory is written when a request ends, at most this often
FILE_FORMAT: Final = "poissonmark-tree-memory/1"
MAX_FILES: Final = 64  # memories kept on disk per profile dir (clients choose the processing)


@dataclass
class _Mean:
    """A running mean (``get``'s default until the first value)."""

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

    def to_json(self) -> dict[str, Any]:
        """The evidence as JSON (``from_json`` reads it back)."""
        means = {name: [m.total, m.count] for name, m in self._means().items()}
        scale = {f"{int(t)}{int(c)}": [m.total, m.count] for (t, c), m in self.scale.items()}
        return {
            "means": means,
            "scale": scale,
            "reached": {str(b): v for b, v in self.reached.items()},
            "accepted": {str(b): v for b, v in self.accepted.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Evidence:
        """``to_json``'s evidence. Raises ValueError (or KeyError, TypeError) on anything else:
        a number that is not finite and >= 0, a list of levels of another length, B < 1."""

        def number(value: Any) -> float:
            x = float(value)
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"tree memory: {value!r} is not a finite count or sum")
            return x

        out = cls()
        for name, mean in out._means().items():
            mean.total, mean.count = (number(x) for x in data["means"][name])
        for key in out.scale:
            total, count = data["scale"][f"{int(key[0])}{int(key[1])}"]
            out.scale[key] = _Mean(number(total), number(count))
        for b, reached in data["reached"].items():
            levels, hits = [number(x) for x in reached], [number(x) for x in data["accepted"][b]]
            if int(b) < 1 or not levels or len(hits) != len(levels):
                raise ValueError("tree memory: malformed levels")
            if any(h > r for h, r in zip(hits, levels, strict=True)):
                raise ValueError("tree memory: more accepted than reached")
            out.reached[int(b)], out.accepted[int(b)] = levels, hits
        return out

    def _means(self) -> dict[str, _Mean]:
        return {
            "draft_level": self.draft_level,
            "fill": self.fill,
            "proposing": self.proposing,
            "other": self.other,
        }

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
    several threads.

    Attributes:
        path: its file (``memory_for``), None: kept in memory only.
    """

    evidence: Evidence = field(default_factory=Evidence)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    path: Path | None = None
    _saved: float | None = None  # time.monotonic() of the last write

    def seed(self, max_depth: int) -> Evidence:
        with self.lock:
            return self.evidence.seed(max_depth)

    def save(self) -> None:
        """Write the evidence a request would start from (``Evidence.seed``) to ``path``, at
        most every ``SAVE_EVERY_S`` seconds (the first time at once); atomically (a temporary
        file renamed), so concurrent processes leave one whole file. An unwritable directory
        keeps the memory in the process (logged)."""
        now = time.monotonic()
        if self.path is None or (self._saved is not None and now - self._saved < SAVE_EVERY_S):
            return
        self._saved = now
        with self.lock:
            depth = max((len(v) for v in self.evidence.reached.values()), default=0)
            body = {"format": FILE_FORMAT, "evidence": self.evidence.seed(depth).to_json()}
        if not self.path.exists() and len(list(self.path.parent.glob("trees-*.json"))) >= MAX_FILES:
            log.warning("tree memory not saved: %d files in %s", MAX_FILES, self.path.parent)
            return
        write_json(self.path, body, "tree memory")


def _load(path: Path) -> TreeMemory:
    """The memory in ``path``; a fresh one where there is none or it does not read back as
    ``Evidence.to_json`` wrote it (logged)."""
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FILE_FORMAT:
            raise ValueError(f"format {data.get('format')!r}")
        return TreeMemory(Evidence.from_json(data["evidence"]), path=path)
    except FileNotFoundError:
        return TreeMemory(path=path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("tree memory %s ignored: %s", path.name, exc)
        return TreeMemory(path=path)


_MEMORIES: weakref.WeakKeyDictionary[object, dict[tuple[object, ...], TreeMemory]] = (
    weakref.WeakKeyDictionary()
)
_MEMORIES_LOCK = threading.Lock()


def memory_for(target: object, drafter: str, processing: Processing) -> TreeMemory:
    """The process's ``TreeMemory`` for ``target`` (held weakly: it goes with the target),
    the drafter's name and the request's processing (acceptance moves with T, top-k, top-p);
    where the target has a profile dir (``sampler.targets.profile.set_profile_dir``), first
    read from the file for this machine fingerprint (``machine_fingerprint``), drafter and
    processing there."""
    with _MEMORIES_LOCK:
        memories = _MEMORIES.setdefault(target, {})
        memory = memories.get((drafter, processing))
        if memory is None:
            path = _memory_path(target, drafter, processing)
            memory = _load(path) if path is not None else TreeMemory()
            memories[(drafter, processing)] = memory
        return memory


def _memory_path(target: object, drafter: str, processing: Processing) -> Path | None:
    if not isinstance(target, Target):
        return None
    settings = {  # 1 and 1.0 are one setting
        k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else repr(v)
        for k, v in dataclasses.asdict(processing).items()
    }
    key = {"machine": machine_fingerprint(target), "drafter": drafter, "processing": settings}
    return cache_path(target, "trees", key)
