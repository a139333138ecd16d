"""``POST /v1/generate``: request and response."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sampler.decoder import MAX_DRAFTS, MAX_LOOKAHEAD
from sampler.methods import DEFAULT_TREE, HTTP_METHODS, TreeMode
from service.schemas.common import ChatMessage, DrafterSpec, KeyId, RequestModel, Text

if TYPE_CHECKING:
    from sampler.methods import Method
else:
    Method = Literal[HTTP_METHODS]
    """The methods the API serves: the ``http`` rows of ``sampler.methods.METHODS``."""
MIN_TEMPERATURE = 0.01
"""Below this (and above 0, greedy) logits / T overflow float64 softmax; refused."""


class GenerateRequest(RequestModel):
    """A completion to sample: exactly one of ``prompt`` (sent as one user message) or
    ``messages`` (through the model's chat template). Limits beyond the hard ones below are the
    server's settings (``POISSONMARK_MAX_NEW_TOKENS``, ``..._MAX_DRAFTS``,
    ``..._MAX_LOOKAHEAD``, ``..._MAX_PROMPT_CHARS``, ``..._MAX_PROMPT_TOKENS``,
    ``..._MAX_MESSAGES``); exceeding one is a 422 ``limit-exceeded`` naming it. The served
    document states those limits (``service.contract``)."""

    # The schema says what ``_one_prompt`` checks: exactly one of them, not null.
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
            ]
        }
    )

    key_id: KeyId
    prompt: Text | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    method: Method = "mpfr"
    drafter: DrafterSpec | None = Field(
        default=None,
        description="`eagle` (the shipped autoregressive draft head for SmolLM2-135M-Instruct), "
        "`ngram` (prompt lookup), `heads` (the shipped parallel heads) or `self:N` (the "
        "target's first N layers). Omitted: `eagle` where the served model has it, else "
        "`ngram`. It changes the speed, never the text.",
    )
    drafts: int = Field(default=4, ge=1, le=MAX_DRAFTS, description="B, drafts per step.")
    lookahead: int = Field(default=4, ge=1, le=MAX_LOOKAHEAD, description="L, draft length.")
    tree: TreeMode = Field(
        default=DEFAULT_TREE,
        description="`auto`: for mpfr and pfr, B and L are caps and each step's tree is the "
        "one a cost model of this machine expects fastest (none where trees do not pay); the "
        "tokens are the same as with `fixed` (B drafts of depth L every step).",
    )
    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(
        default=1.0,
        ge=0.0,
        le=100.0,
        description="0 = greedy (no watermark), else >= 0.01.",
        json_schema_extra={"anyOf": [{"const": 0}, {"minimum": MIN_TEMPERATURE}]},
    )
    top_k: int = Field(default=50, ge=0, le=2**31 - 1, description="0 = off.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    # lt 2^63, not le 2^63 - 1: the document's bounds are floats, and 2^63 is exact in one
    nonce: Annotated[int, Field(ge=0, lt=2**63)] | None = Field(
        default=None, description="Request nonce; random when omitted."
    )
    stream: bool = Field(default=False, description="Answer with server-sent events.")

    @field_validator("temperature")
    @classmethod
    def _greedy_or_sampled(cls, temperature: float) -> float:
        if 0.0 < temperature < MIN_TEMPERATURE:
            raise ValueError(f"expected 0 or >= {MIN_TEMPERATURE}")
        return temperature

    @model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class TreeChoiceOut(BaseModel):
    drafts: int
    lookahead: int = Field(description="The depth chosen; 0 = a one-token step.")
    steps: int


class StepSecondsOut(BaseModel):
    """The decoding seconds by part; the rest of ``seconds`` is the decoder's own Python."""

    draft: float = Field(description="Drafting the draft trees (the drafter and its races).")
    forward: float = Field(
        description="Target forwards; in a batch, the whole shared forward the request waited "
        "for. On a GPU the forward runs asynchronously and its time shows up in `walk`."
    )
    walk: float = Field(
        description="The target's race and walk, the KV keep, the drafter's finish."
    )


class GenerationStatsOut(BaseModel):
    emitted_tokens: int = Field(description="Tokens emitted, EOS included.")
    target_forward_passes: int
    aatps: float = Field(description="Average accepted tokens per step (per target pass).")
    drafter_calls: int
    accepted_per_level: list[int]
    prefill_seconds: float
    seconds: float
    tokens_per_second: float
    tree_choices: list[TreeChoiceOut] = Field(
        default_factory=list, description="With tree `auto`: the trees chosen, per size."
    )
    step_seconds: StepSecondsOut | None = Field(
        default=None, description="The decoding seconds by part."
    )


class GenerateResponse(BaseModel):
    """The completion alone (never the prompt) and how it was made."""

    text: str
    token_ids: list[int]
    key_id: str
    method: Method
    drafter: str | None
    nonce: int
    finish_reason: Literal["eos", "length"]
    watermark_applied: bool = Field(
        description="False for `ar`, `*-nowm` and temperature 0 (the keyed race is a no-op)."
    )
    stats: GenerationStatsOut


class GenerateDelta(BaseModel):
    """The data of one `delta` server-sent event."""

    text: str
    token_ids: list[int]
