"""What a detection returns: the verdict, p-values and per-token evidence (docs/design.md §4).

Frozen dataclasses validated at construction. The per-token evidence is kept in columns
(``TokenColumns``: NumPy arrays of ids, offsets, skip codes, pivots and terms — cheap to build
and to pickle to and from corpus workers); ``Detection.tokens`` turns them into
``TokenEvidence`` named tuples on first use (their invariants are checked by
``TokenEvidence.check`` in the detector's tests rather than per construction);
``Detection.to_json()`` is the wire shape the
service and the CLI return, and contains only finite numbers (no NaN/Infinity) and no key
material.

Shapes: T tokens of the text, M of them scored. Token ids, character offsets (T,) int64; skip
codes (T,) int8 into ``keyed.SKIP_CODES``; pivots and each score family's per-token terms (M,)
float64 in text order.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal, NamedTuple

import numpy as np

from detector.canonical import ReadingReport
from detector.combined import CombinedTest
from detector.realign import RealignedTest
from detector.scores import anlppt
from detector.spans import SpanSearch
from detector.stats import PValue
from keyed import SKIP_CODES, SkipReason

TokenStatus = Literal["scored", "skipped"]
SKIP_REASONS: Final[frozenset[str]] = frozenset(reason.value for reason in SkipReason)


class Verdict(StrEnum):
    """The decision at level α.

    p is the verdict's test, whole text and spans together (``detector.combined``).

    - ``watermarked``: p < α.
    - ``insufficient_evidence``: p >= α and M is below the tokens a typically watermarked text
      (mean term ``reference_mean_score``) needs to reach α, i.e. the minimum detectable mean
      score at this M exceeds the reference (so "not significant" says little).
    - ``not_detected``: p >= α with enough scored tokens.
    """

    WATERMARKED = "watermarked"
    NOT_DETECTED = "not_detected"
    INSUFFICIENT_EVIDENCE = "insufficient_evidence"


class TokenEvidence(NamedTuple):
    """One token of the input as the detector saw it.

    Attributes:
        id: token id. text: its piece of the text, ``text[start:end]`` (may be empty for a token
            holding part of a multi-token character). start, end: character offsets.
        status: ``"scored"`` or ``"skipped"``. skip_reason: a ``SkipReason`` value when skipped.
        pivot: r_t in (0, 1) when scored. score: its Aaronson term −ln(1 − r_t) when scored
            (kept for backwards compatibility; also ``terms["aaronson"]``).
        terms: when scored, each computed score family's per-token term h(r_t) by name
            (``detector.scores``); None when skipped.
    """

    id: int
    text: str
    start: int
    end: int
    status: TokenStatus
    skip_reason: str | None
    pivot: float | None
    score: float | None
    terms: dict[str, float] | None = None

    def check(self) -> None:
        """Raise ``ValueError`` unless the fields are consistent (status, pivot, score, reason).

        Not run per construction (the detector builds one per token on its hot path); the
        detector's tests run it on every token it returns.
        """
        if not 0 <= self.start <= self.end:
            raise ValueError(f"expected 0 <= start <= end, got ({self.start}, {self.end})")
        if self.status == "scored":
            if self.skip_reason is not None or self.pivot is None or self.score is None:
                raise ValueError("a scored token has a pivot and a score and no skip_reason")
            if not 0.0 < self.pivot < 1.0 or not math.isfinite(self.score):
                raise ValueError(f"expected a pivot in (0, 1) and a finite score, got {self}")
            # Finiteness of the per-score terms is checked once per text on the whole term
            # matrix (``detect_tokenized``), not per token: this runs for every token.
        elif self.status == "skipped":
            if self.skip_reason not in SKIP_REASONS:
                raise ValueError(f"expected a skip_reason in {sorted(SKIP_REASONS)}, got {self}")
            if self.pivot is not None or self.score is not None or self.terms is not None:
                raise ValueError("a skipped token has no pivot, score or terms")
        else:
            raise ValueError(f"expected status 'scored' or 'skipped', got {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        """``{"id", "text", "start", "end", "status", "skip_reason", "pivot", "score",
        "terms"}``."""
        return {
            "id": self.id,
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "status": self.status,
            "skip_reason": self.skip_reason,
            "pivot": self.pivot,
            "score": self.score,
            "terms": None if self.terms is None else dict(self.terms),
        }


_REASONS: Final = [None if code is None else code.value for code in SKIP_CODES]


@dataclass(frozen=True, eq=False)
class TokenColumns:
    """Per-token evidence of one text, in columns (T tokens, M scored).

    Attributes:
        text: the text the offsets index.
        ids: (T,) int64 token ids.
        starts, ends: (T,) int64 character offsets (a partition of the text).
        skip: (T,) int8 codes into ``keyed.SKIP_CODES``: 0 scored, else the skip reason.
        pivots: (M,) float64 r_t of the scored tokens, in text order.
        terms: per computed score family, its (M,) float64 per-token terms h(r_t) (Aaronson's
            −ln(1 − r_t) first).
    """

    text: str
    ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    skip: np.ndarray
    pivots: np.ndarray
    terms: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        n = self.ids.shape[0]
        if not (self.starts.shape == self.ends.shape == self.skip.shape == (n,)):
            raise ValueError("expected ids, starts, ends and skip of one length")
        scored = int(np.count_nonzero(self.skip == 0))
        if self.pivots.shape != (scored,) or any(t.shape != (scored,) for t in self.terms.values()):
            raise ValueError(f"expected pivots and terms for the {scored} scored tokens")
        if "aaronson" not in self.terms:
            raise ValueError("expected the Aaronson terms")

    @property
    def num_scored(self) -> int:
        return int(self.pivots.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenColumns):
            return NotImplemented
        arrays = ("ids", "starts", "ends", "skip", "pivots")
        return (
            self.text == other.text
            and all(np.array_equal(getattr(self, a), getattr(other, a)) for a in arrays)
            and list(self.terms) == list(other.terms)
            and all(np.array_equal(self.terms[k], other.terms[k]) for k in self.terms)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside

    def rows(self) -> list[TokenEvidence]:
        """One ``TokenEvidence`` per token, in order."""
        text, make = self.text, tuple.__new__  # named tuples without the keyword layer
        names = list(self.terms)
        aaronson = self.terms["aaronson"].tolist()
        if len(names) == 1:
            term_dicts = [{"aaronson": v} for v in aaronson]
        else:
            columns = [self.terms[name].tolist() for name in names]
            term_dicts = [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
        pivots = self.pivots.tolist()
        out: list[TokenEvidence] = []
        m = 0  # index of the next scored token
        fields: tuple[object, ...]
        for token, start, end, code in zip(
            self.ids.tolist(),
            self.starts.tolist(),
            self.ends.tolist(),
            self.skip.tolist(),
            strict=True,
        ):
            if code == 0:
                fields = (token, text[start:end], start, end, "scored", None,
                          pivots[m], aaronson[m], term_dicts[m])  # fmt: skip
                m += 1
            else:
                fields = (token, text[start:end], start, end, "skipped", _REASONS[code],
                          None, None, None)  # fmt: skip
            out.append(make(TokenEvidence, fields))
        return out


@dataclass(frozen=True)
class Detection:
    """The result of testing one text against one key.

    Attributes:
        key_id: the key's public id (never its secret), or None.
        num_tokens: T, tokens in the input. num_scored: M, tokens scored.
        verdict: the decision at ``alpha`` on ``test``.
        scores: p-value per score family (``"aaronson"`` first and always, then the requested
            families in order).
        evidence: the per-token evidence in columns (``tokens`` is its row view).
        skipped: count per skip reason (every ``SkipReason``, zeros included).
        retokenization_matches: with ids and text supplied, whether tokenizing the text gives
            the ids; else None.
        alpha: the level in (0, 0.5]. min_scored_tokens: the M below which a non-significant
            result is ``insufficient_evidence`` (``detector.combined.needed_tokens``).
        spans: the span search (``detect(..., spans=True)``), else None.
        score_params: each family's parameters by name (e.g. ``{"li": {"delta": 0.1}}``).
        test: the verdict's test, whole text and windows in one p (``detector.combined``);
            None only for a hand-made Detection (then the verdict's p is the Aaronson one).
        min_detectable_mean_score: μ*(M), the per-token mean Aaronson term that would reach
            the whole-text level at this M (None when M = 0: nothing is detectable).
        reference_mean_score: the typical watermarked mean term the verdict compares μ* to.
        realigned: the edit-tolerant re-aligned test (``detect(..., realign=True)``), else
            None; reported, not used by the verdict.
        context_width: m of the key the text was tested under (None: a hand-made Detection).
        reading: which reading of a submitted text carried the evidence and what the
            canonical reading changed (``detector.readings``); None for exact token ids.
    """

    key_id: str | None
    num_tokens: int
    num_scored: int
    verdict: Verdict
    scores: dict[str, PValue]
    evidence: TokenColumns
    skipped: dict[str, int]
    retokenization_matches: bool | None
    alpha: float
    min_scored_tokens: int
    spans: SpanSearch | None = None
    score_params: dict[str, dict[str, float]] | None = None
    test: CombinedTest | None = None
    min_detectable_mean_score: float | None = None
    reference_mean_score: float = 1.5
    realigned: RealignedTest | None = None
    context_width: int | None = None
    reading: ReadingReport | None = None

    def __post_init__(self) -> None:
        if self.num_tokens != len(self.evidence.ids):
            raise ValueError(f"num_tokens {self.num_tokens} != {len(self.evidence.ids)} tokens")
        scored = self.evidence.num_scored
        if self.num_scored != scored:
            raise ValueError(f"num_scored {self.num_scored} != {scored} scored tokens")
        if sum(self.skipped.values()) != self.num_tokens - self.num_scored:
            raise ValueError(f"skipped counts {self.skipped} do not add up to the skipped tokens")
        if "aaronson" not in self.scores:
            raise ValueError(f"expected an 'aaronson' score, got {sorted(self.scores)}")
        if not 0.0 < self.alpha <= 0.5:
            raise ValueError(f"expected alpha in (0, 0.5], got {self.alpha}")
        m = self.context_width
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"expected context_width None or an int >= 1, got {m!r}")

    @functools.cached_property
    def tokens(self) -> tuple[TokenEvidence, ...]:
        """(T,) per-token evidence, in order (built from ``evidence`` on first use)."""
        return tuple(self.evidence.rows())

    @property
    def p_value(self) -> PValue:
        """The plain whole-text Aaronson p-value (the verdict's test also scans windows:
        ``test``, ``verdict_log10_p_value``)."""
        return self.scores["aaronson"]

    @property
    def verdict_log10_p_value(self) -> float:
        """log10 of the p the verdict uses: the combined test's (the Aaronson p without one)."""
        return self.p_value.log10_p_value if self.test is None else self.test.log10_p_value

    def power_json(self) -> dict[str, Any]:
        """``{"min_detectable_mean_score", "reference_mean_score", "detectable"}``: what this
        M could detect (``detectable``: a typically watermarked text would reach α)."""
        mu = self.min_detectable_mean_score
        return {
            "min_detectable_mean_score": mu,
            "reference_mean_score": self.reference_mean_score,
            "detectable": mu is not None and mu <= self.reference_mean_score,
        }

    def to_json(self, tokens: bool = True) -> dict[str, Any]:
        """The wire shape: plain JSON types, finite numbers only, no key material.

        ``{"key_id", "num_tokens", "num_scored", "verdict", "alpha", "p_value",
        "log10_p_value", "test", "power", "edit_tolerant", "scores": {name: {"score",
        "p_value", "log10_p_value", "method", "anlppt", "params"}}, "tokens": [...],
        "skipped": {...}, "retokenization_matches", "spans", "reading"}``; ``p_value`` is the
        verdict's (``test``: whole text and windows, ``CombinedTest.to_json``); ``power``:
        ``power_json``; ``edit_tolerant`` is null unless the re-aligned test ran; ``spans`` is
        null unless the span search ran; ``tokens`` is null when ``tokens=False``; ``reading``
        is ``ReadingReport.to_json`` (null for exact token ids).
        """
        params = self.score_params or {}
        log10_p = self.verdict_log10_p_value
        return {
            "key_id": self.key_id,
            "num_tokens": self.num_tokens,
            "num_scored": self.num_scored,
            "verdict": self.verdict.value,
            "alpha": self.alpha,
            "p_value": 10.0**log10_p,
            "log10_p_value": log10_p,
            "test": None if self.test is None else self.test.to_json(),
            "power": self.power_json(),
            "edit_tolerant": None if self.realigned is None else self.realigned.to_json(),
            "scores": {
                name: {
                    "score": p.score,
                    "p_value": p.p_value,
                    "log10_p_value": p.log10_p_value,
                    "method": p.method,
                    "anlppt": anlppt(p, self.num_scored),
                    "params": dict(params.get(name, {})),
                }
                for name, p in self.scores.items()
            },
            "tokens": [t.to_json() for t in self.tokens] if tokens else None,
            "skipped": dict(self.skipped),
            "retokenization_matches": self.retokenization_matches,
            "spans": None if self.spans is None else self.spans.to_json(),
            "reading": None if self.reading is None else self.reading.to_json(),
        }


def verdict(p: PValue, num_scored: int, alpha: float, needed: int) -> Verdict:
    """``watermarked`` if p < α; else ``insufficient_evidence`` if M < needed; else
    ``not_detected`` (docs/design.md §4). ``p`` is the verdict's test's (``detector.combined``) and
    ``needed`` its ``needed_tokens(α)``."""
    if p.p_value < alpha:
        return Verdict.WATERMARKED
    if num_scored < needed:
        return Verdict.INSUFFICIENT_EVIDENCE
    return Verdict.NOT_DETECTED
