"""Detection without a key id: test every candidate key, correct for their number (DESIGN §4).

Glossary:
- K: the number of candidate keys tested; p_k: key k's Aaronson p-value (exact under H0).
- best key: the key with the smallest p_k (ties: the first in the caller's order).
- corrected p: min(1, K·min_k p_k), the Bonferroni bound. Under H0 (the text carries none of
  the keys' watermarks) P(min_k p_k <= α/K) <= Σ_k P(p_k <= α/K) = α whatever the dependence
  between keys, so the corrected p is a valid p-value for "one of these keys marked the text".

Which keys are candidates is the caller's business: the service passes the caller's tenant's
active keys, and revoked keys only when asked (a revoked key can no longer generate, but text
it watermarked earlier still carries its mark). Every extra key costs a factor in the
corrected p, so pass no more keys than the question needs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from detector.detect import (
    DEFAULT_OPTIONS,
    check_options,
    detect_tokenized,
    tokenize_input,
    verdict,
)
from detector.evidence import Detection, Verdict
from detector.options import DetectOptions
from detector.spans import bonferroni_log
from detector.stats import LN10, PValue
from detector.tokens import Tokenizer
from keyed import KeyedSource

MAX_KEYS = 10_000


@dataclass(frozen=True)
class MultiKeyDetection:
    """The result of testing one text against K candidate keys.

    Attributes:
        results: each key's own ``Detection`` by key id, in the caller's order. Their
            verdicts and p-values are per key, *uncorrected*.
        best_key_id: the key with the smallest Aaronson p-value.
        num_keys: K.
        p_value, log10_p_value: the best key's p-value corrected for K keys (Bonferroni),
            min(1, K·p_best); log10 always finite.
        verdict: at ``alpha`` on the corrected p (``insufficient_evidence`` when it is not
            significant and the best key scored fewer than ``min_scored_tokens(α)`` tokens).
        alpha: the level.
    """

    results: dict[str, Detection]
    best_key_id: str
    num_keys: int
    p_value: float
    log10_p_value: float
    verdict: Verdict
    alpha: float

    def __post_init__(self) -> None:
        if self.num_keys != len(self.results) or self.best_key_id not in self.results:
            raise ValueError("expected num_keys results including the best key")
        if not (math.isfinite(self.log10_p_value) and self.log10_p_value <= 0.0):
            raise ValueError(f"expected a finite log10 p <= 0, got {self.log10_p_value}")

    @property
    def best(self) -> Detection:
        """The best key's own detection (uncorrected)."""
        return self.results[self.best_key_id]

    def to_json(self) -> dict[str, Any]:
        """``{"best_key_id", "num_keys", "verdict", "alpha", "p_value", "log10_p_value",
        "uncorrected_log10_p_value", "keys": {key_id: detection JSON}}``: plain JSON types,
        finite numbers, no key material."""
        return {
            "best_key_id": self.best_key_id,
            "num_keys": self.num_keys,
            "verdict": self.verdict.value,
            "alpha": self.alpha,
            "p_value": self.p_value,
            "log10_p_value": self.log10_p_value,
            "uncorrected_log10_p_value": self.best.p_value.log10_p_value,
            "keys": {key_id: result.to_json() for key_id, result in self.results.items()},
        }


def best_key_corrected(log_p: ArrayLike) -> tuple[int, float]:
    """Index of the smallest p and its Bonferroni-corrected natural-log p-value.

    Args:
        log_p: (K,) float64 natural-log p-values of the K keys, K >= 1.
    Returns:
        (argmin, ln min(1, K·p_min)).
    """
    values = np.asarray(log_p, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"expected log_p of shape (K,) with K >= 1, got {values.shape}")
    best = int(np.argmin(values))
    return best, bonferroni_log(float(values[best]), int(values.size))


def detect_multi(
    tokenizer: Tokenizer,
    sources: Mapping[str, KeyedSource],
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    options: DetectOptions = DEFAULT_OPTIONS,
) -> MultiKeyDetection:
    """Test a text against every candidate key and correct the best p-value for their number.

    Args:
        tokenizer: the keys' tokenizer (all candidates must share it: check each key's
            fingerprint with ``check_tokenizer`` first).
        sources: key id -> keyed source, 1..``MAX_KEYS`` keys (the caller chooses them: active
            keys of the tenant; revoked ones only when asked).
        text, token_ids: as ``detect``; the text is tokenized once.
        options: as ``detect``, for every key, with ``key_id`` None (each result carries its
            key's id from ``sources``).
    Returns:
        a ``MultiKeyDetection``: per-key results and the corrected verdict.
    Raises:
        ValueError: no keys or more than ``MAX_KEYS``, a key id that is not a string, a source
            that is not a ``KeyedSource``, ``options.key_id`` set, or any ``detect`` input
            error.
    """
    check_options(options)
    if options.key_id is not None:
        raise ValueError(
            f"expected options.key_id None (ids come from sources), got {options.key_id!r}"
        )
    if not isinstance(sources, Mapping) or not 1 <= len(sources) <= MAX_KEYS:
        size = len(sources) if isinstance(sources, Mapping) else type(sources).__name__
        raise ValueError(f"expected a mapping of 1..{MAX_KEYS} key ids to sources, got {size}")
    for key_id, source in sources.items():
        if not isinstance(key_id, str):
            raise ValueError(f"expected key ids to be strings, got {key_id!r}")
        if not isinstance(source, KeyedSource):
            raise ValueError(
                f"expected sources[{key_id!r}] to be a KeyedSource, got {type(source).__name__}"
            )
    tokenized = tokenize_input(tokenizer, text, token_ids)
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    results = {
        key_id: detect_tokenized(
            tokenized, special, source, dataclasses.replace(options, key_id=key_id)
        )
        for key_id, source in sources.items()
    }
    ids = list(results)
    best, corrected = best_key_corrected([results[k].p_value.log_p_value for k in ids])
    best_result = results[ids[best]]
    corrected_p = PValue.from_log(best_result.p_value.score, corrected, "exact")
    return MultiKeyDetection(
        results=results,
        best_key_id=ids[best],
        num_keys=len(ids),
        p_value=corrected_p.p_value,
        log10_p_value=corrected / LN10,
        verdict=verdict(
            corrected_p, best_result.num_scored, options.alpha, best_result.min_scored_tokens
        ),
        alpha=options.alpha,
    )
