"""What a generation returns: the completion and its counters (docs/design.md §3, Stats)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sampler.methods import Method

FinishReason = Literal["eos", "length"]


@dataclass(frozen=True)
class StepSeconds:
    """Where a generation's decoding time went, summed over its steps (wall-clock seconds):
    ``draft`` the drafter's levels and their races (the draft tree), ``forward`` the target's
    verification forwards (in a batch, the shared forward's full time: what the request
    waited for), ``walk`` the target's processing, race and walk, the KV keep and the drafter's
    finish. The rest of ``GenerationStats.seconds`` is the loop's own Python. On an
    accelerator a forward is launched asynchronously: its time shows up in ``walk``, where the
    processing waits for the logits."""

    draft: float = 0.0
    forward: float = 0.0
    walk: float = 0.0


@dataclass(frozen=True)
class GenerationStats:
    """Counters of one generation. Seconds are wall-clock; prefill is reported separately."""

    emitted_tokens: int
    target_forward_passes: int
    drafter_calls: int
    accepted_per_level: tuple[int, ...]
    drafted_per_level: tuple[int, ...]
    prefill_seconds: float
    seconds: float
    tree_choices: tuple[tuple[int, int, int], ...] = ()
    """With tree ``auto``: (B, ℓ, steps) per tree size chosen, ℓ = 0 a one-token step."""
    step_seconds: StepSeconds = field(default_factory=StepSeconds)
    """The decoding time by part (``StepSeconds``)."""

    @property
    def aatps(self) -> float:
        """Average accepted tokens per step: emitted tokens per target forward pass."""
        return self.emitted_tokens / max(self.target_forward_passes, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.emitted_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class GenerationResult:
    """A completion without the prompt (case C3); EOS is not included in ``token_ids``."""

    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    method: Method
    watermark_applied: bool
    stats: GenerationStats


def count_at(counts: list[int], index: int) -> None:
    """``counts[index] += 1``, growing ``counts`` with zeros (per-level counters)."""
    while len(counts) <= index:
        counts.append(0)
    counts[index] += 1
