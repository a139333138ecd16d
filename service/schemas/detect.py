"""``POST /v1/detect`` and ``/v1/detect/batch``: the requests (the responses are
``service.schemas.detect_result``'s).

A detection tests one text against one key (``key_id``) or, without one, against every key of
the caller's tenant (active ones; revoked too with ``include_revoked``), and reports the best
key's p-value corrected for the number of keys (Bonferroni). The response is the detector's
wire shape (``detector.Detection.to_json``) per key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from detector.combined import REFERENCE_MEAN_SCORE
from detector.options import MIN_REFERENCE_MEAN_SCORE
from detector.scores import SCORE_NAMES
from service.schemas.common import INTEGRAL, ChatMessage, KeyId, RequestModel, Text

if TYPE_CHECKING:
    ScoreName = str
else:
    ScoreName = Literal[SCORE_NAMES]
    """A score family of ``detector.scores.SCORE_NAMES`` (an enum in the schema)."""
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1), INTEGRAL]
"""A token id; the served document bounds it by the served tokenizer's vocabulary."""


def _given(name: str, kind: str) -> JsonDict:
    """The JSON Schema of "the property ``name`` is present and of type ``kind`` (not null)"."""
    return {"required": [name], "properties": {name: {"type": kind}}}


class EntropyProcessing(RequestModel):
    """The processing the text was generated with (entropy weighting reads the target's law
    under it): temperature -> top-k -> top-p, as ``POST /v1/generate``."""

    temperature: float = Field(default=1.0, gt=0.0, le=100.0, description="T > 0.")
    top_k: int = Field(default=50, ge=0, le=2**31 - 1, description="0 = off.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


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
    evidence: bool = Field(
        default=False,
        description="Include the best key's per-token evidence: coarse bands, and raw pivots "
        "and terms with the `evidence` scope for `text` (never for `token_ids`).",
    )
    spans: bool = Field(
        default=False,
        description="Report the span search (the strongest windows of evidence; the verdict's "
        "test scans the windows either way).",
    )
    reference_mean_score: float = Field(
        default=REFERENCE_MEAN_SCORE,
        ge=MIN_REFERENCE_MEAN_SCORE,
        le=100.0,
        description="The per-token mean Aaronson term of a typically watermarked text (human "
        "text averages 1): a result that is not significant is `insufficient_evidence` when the "
        "mean its length would need exceeds it, and `min_scored_tokens` is the length this mean "
        "reaches alpha at. The default 1.5 is SmolLM2 at T = 0.7 with margin (T = 1 averages "
        "about 2.6); set it to your generations' strength.",
    )
    realign: bool = Field(
        default=False,
        description="Also run the edit-tolerant re-aligned test (labels with one token "
        "skipped; exact p; about 5x the per-token key cost): `edit_tolerant` in each result. "
        "Reported beside the verdict, not used by it.",
    )
    entropy_weighting: bool = Field(
        default=False,
        description="Also run the entropy-weighted Aaronson test: each scored position weighed "
        "by the target model's entropy there under `processing` (key-independent weights, exact "
        "null); one forward of the served model over the text (CPU cost: "
        "`bench/results/detector_entropy.json`). `entropy_weighted` in each result, reported "
        "beside the verdict, not used by it.",
    )
    likelihood_ratio: bool = Field(
        default=False,
        description="Also run the likelihood-ratio test: S = Σ w_t·(−ln r_t) with w_t = "
        "1/max(p_t, 0.05) − 1, p_t the target's probability of the text's own token under "
        "`processing` (key-independent weights, exact null; small S is evidence). The most "
        "powerful test where p_t is right, so it pays when the item carries the generation's "
        "`prompt` or `messages` (at T = 0.7: α after 0.67x the plain test's tokens; without "
        "the prompt 0.9-1.0x) and the text is unedited (after 30 % random edits it finds ~10 % of "
        "texts, the plain test 80 %: `bench/results/detector_likelihood_ratio.md`). "
        "One forward of the served model over the prompt and the text. `likelihood_ratio` in "
        "each result, reported beside the verdict, not used by it.",
    )
    edit_filter: bool = Field(
        default=False,
        description="Also run the edit-filtered test: the Aaronson test over the scored "
        "positions whose label and token hold no token the target ranks past 1,000 in its raw "
        "law there (a likely substitution or insertion destroys every label it enters; "
        "key-independent, exact null). After 30 % random edits (held-out, 4 × 200 copies) it "
        "finds 0.84 of the texts against the plain test's 0.79; a perfect detector of foreign "
        "tokens would find 0.905 (`bench/results/detector_edit_oracle.json`). One forward of "
        "the served model over the text. `edit_filtered` in each result, reported beside the "
        "verdict, not used by it.",
    )
    processing: EntropyProcessing | None = Field(
        default=None,
        description="With `entropy_weighting` or `likelihood_ratio`: the generation's "
        "temperature, top-k and top-p (default the generate defaults: 1.0, 50, 1.0). Ignored "
        "without them (a schema-valid request is never refused for it); `edit_filter` reads "
        "the raw law's ranks, which processing does not change.",
    )
    max_results: int = Field(
        default=10,
        ge=1,
        le=100,
        description="Multi-key: how many keys' own results `results` holds, best (smallest "
        "p-value) first. Every key is tested and counted in the correction either way.",
    )

    @property
    def reads_model(self) -> bool:
        """Whether a test that reads the target's law was asked for (the route then passes
        the served model)."""
        return self.entropy_weighting or self.likelihood_ratio or self.edit_filter

    @field_validator("scores")
    @classmethod
    def _once_each(cls, scores: list[str]) -> list[str]:
        # Checked here (a 422 naming the field), not left to the detector's ValueError.
        if len(set(scores)) < len(scores):
            raise ValueError(f"expected names from {list(SCORE_NAMES)}, each at most once")
        return scores


class DetectInput(RequestModel):
    """The text to test: ``text``, exact ``token_ids``, or both. With both, the ids are scored
    and must decode to exactly ``text``, else 422 ``invalid-request`` naming ``token_ids`` and
    ``text``: the verdict is about the ids, and answering one about other ids than the text's
    would read as a verdict about the text. Ids that decode to the text but that re-tokenizing
    it would not give are fine (``retokenization_matches: false`` says so)."""

    # The schema says what the validator below checks: text or token_ids (not null), and not
    # both prompt and messages.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [_given("text", "string"), _given("token_ids", "array")],
            "not": {"allOf": [_given("prompt", "string"), _given("messages", "array")]},
        }
    )

    text: Text | None = None
    token_ids: list[TokenId] | None = None
    prompt: Text | None = Field(
        default=None,
        description="The generation's prompt (one user message, as `POST /v1/generate`), when "
        "you have it: `entropy_weighting`, `likelihood_ratio` and `edit_filter` read the "
        "target's law after it instead of after BOS. Never changes the verdict; ignored "
        "without those tests. With them, at most the server's `max_prompt_tokens` tokens "
        "after the chat template (generate's limit; 422 `limit-exceeded` naming the field).",
    )
    messages: list[ChatMessage] | None = Field(
        default=None,
        min_length=1,
        description="The generation's chat `messages` instead of `prompt` (at most one of "
        "the two).",
    )

    @model_validator(mode="after")
    def _something(self) -> Self:
        if self.text is None and self.token_ids is None:
            raise ValueError("give text, token_ids or both")
        if self.prompt is not None and self.messages is not None:
            raise ValueError("give at most one of prompt or messages")
        return self


class DetectRequest(DetectOptions, DetectInput):
    """One text and the options. Limits: ``POISSONMARK_MAX_TEXT_CHARS``,
    ``..._MAX_TOKEN_IDS``, ``..._MAX_KEYS_PER_DETECT`` (422 ``limit-exceeded``)."""


class DetectBatchRequest(DetectOptions):
    """Several texts, one set of options (every item counts against the rate limit). Limit:
    ``POISSONMARK_MAX_BATCH`` items."""

    items: list[DetectInput] = Field(min_length=1)
