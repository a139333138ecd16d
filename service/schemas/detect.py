"""``POST /v1/detect`` and ``/v1/detect/batch``: requests and responses.

A detection tests one text against one key (``key_id``) or, without one, against every key of
the caller's tenant (active ones; revoked too with ``include_revoked``), and reports the best
key's p-value corrected for the number of keys (Bonferroni). The response is the detector's
wire shape (``detector.Detection.to_json``) per key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from detector.scores import SCORE_NAMES
from service.schemas.common import INTEGRAL, KeyId, RequestModel, Text

if TYPE_CHECKING:
    ScoreName = str
else:
    ScoreName = Literal[SCORE_NAMES]
    """A score family of ``detector.scores.SCORE_NAMES`` (an enum in the schema)."""
Verdict = Literal["watermarked", "not_detected", "insufficient_evidence"]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1), INTEGRAL]
"""A token id; the served document bounds it by the served tokenizer's vocabulary."""


def _given(name: str, kind: str) -> JsonDict:
    """The JSON Schema of "the property ``name`` is present and of type ``kind`` (not null)"."""
    return {"required": [name], "properties": {name: {"type": kind}}}


class DetectOptions(RequestModel):
    """What to test against and what to report."""

    key_id: KeyId | None = Field(
        default=None, description="Omit to test every key of your tenant (multi-key)."
    )
    include_revoked: bool = Field(default=False, description="Multi-key: test revoked keys too.")
    alpha: float = Field(default=0.01, gt=0.0, le=0.5, description="Level of the verdict.")
    scores: list[ScoreName] = Field(
        default_factory=list,
        max_length=len(SCORE_NAMES),
        json_schema_extra={"uniqueItems": True},
        description="Score families besides `aaronson` (always computed): `u`, `li`, `lattimore`.",
    )
    evidence: bool = Field(default=False, description="Include per-token evidence.")
    spans: bool = Field(default=False, description="Run the span search (windows of evidence).")
    max_results: int = Field(
        default=10,
        ge=1,
        le=100,
        description="Multi-key: how many keys' own results `results` holds, best (smallest "
        "p-value) first. Every key is tested and counted in the correction either way.",
    )

    @field_validator("scores")
    @classmethod
    def _once_each(cls, scores: list[str]) -> list[str]:
        # Checked here (a 422 naming the field), not left to the detector's ValueError.
        if len(set(scores)) < len(scores):
            raise ValueError(f"expected names from {list(SCORE_NAMES)}, each at most once")
        return scores


class DetectInput(RequestModel):
    """The text to test: ``text``, exact ``token_ids``, or both (then the ids are scored and
    ``retokenization_matches`` says whether tokenizing the text gives them)."""

    # The schema says what the validator below checks: at least one of them, not null.
    model_config = ConfigDict(
        json_schema_extra={"anyOf": [_given("text", "string"), _given("token_ids", "array")]}
    )

    text: Text | None = None
    token_ids: list[TokenId] | None = None

    @model_validator(mode="after")
    def _something(self) -> Self:
        if self.text is None and self.token_ids is None:
            raise ValueError("give text, token_ids or both")
        return self


class DetectRequest(DetectOptions, DetectInput):
    """One text and the options. Limits: ``POISSONMARK_MAX_TEXT_CHARS``,
    ``..._MAX_TOKEN_IDS``, ``..._MAX_KEYS_PER_DETECT`` (422 ``limit-exceeded``)."""


class DetectBatchRequest(DetectOptions):
    """Several texts, one set of options (every item counts against the rate limit). Limit:
    ``POISSONMARK_MAX_BATCH`` items."""

    items: list[DetectInput] = Field(min_length=1)


class ScoreOut(BaseModel):
    score: float = Field(description="The score's statistic over the scored tokens.")
    p_value: float = Field(description="May print 0 beside a finite log10_p_value.")
    log10_p_value: float
    method: str = Field(description="`exact` or `chernoff_bound`.")
    anlppt: float = Field(description="−ln p / M, nats per scored token.")
    params: dict[str, float] = Field(default_factory=dict)


class TokenEvidenceOut(BaseModel):
    id: int
    text: str
    start: int
    end: int
    status: Literal["scored", "skipped"]
    skip_reason: str | None
    pivot: float | None
    score: float | None
    terms: dict[str, float] | None = None


class SpanOut(BaseModel):
    start: int
    end: int
    token_start: int
    token_end: int
    num_scored: int
    score: float
    p_value: float
    log10_p_value: float
    corrected_p_value: float
    corrected_log10_p_value: float


class SpanSearchOut(BaseModel):
    windows_scanned: int
    lengths: list[int]
    spans: list[SpanOut]


class KeyDetectionOut(BaseModel):
    """One key's result, uncorrected for the number of keys."""

    key_id: str
    verdict: Verdict
    alpha: float
    num_tokens: int
    num_scored: int
    min_scored_tokens: int
    scores: dict[str, ScoreOut]
    skipped: dict[str, int]
    retokenization_matches: bool | None
    tokens: list[TokenEvidenceOut] | None = Field(description="With `evidence: true`.")
    spans: SpanSearchOut | None = Field(description="With `spans: true`.")


class DetectResponse(BaseModel):
    """The verdict at ``alpha`` on the best key's p-value corrected for ``num_keys`` keys."""

    verdict: Verdict
    alpha: float
    best_key_id: str
    num_keys: int
    p_value: float
    log10_p_value: float
    min_scored_tokens: int = Field(
        description="Scored tokens a typical watermarked text needs to reach alpha / num_keys "
        "(below it, a result that is not significant is `insufficient_evidence`)."
    )
    results: list[KeyDetectionOut] = Field(
        description="The own, uncorrected results of the best `max_results` keys, best first."
    )


class DetectBatchResponse(BaseModel):
    results: list[DetectResponse]
