"""The logit processing parameters (temperature, top-k, top-p), without torch.

Apart from ``sampler.processing``, which applies them, so that the table of methods
(``sampler.methods``) and the CLI's help can be imported without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Processing:
    """Logit processing shared by target and drafter.

    Attributes:
        temperature: T >= 0; T = 0 is greedy (the keyed race is then a no-op).
        top_k: keep the k most likely tokens; 0 keeps the whole vocabulary.
        top_p: keep the smallest most-likely set with mass >= top_p, in (0, 1].
    Raises:
        ValueError: at construction, naming the field and its range.
    """

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
