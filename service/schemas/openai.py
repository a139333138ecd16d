"""OpenAI-compatible ``POST /v1/chat/completions`` and ``POST /v1/completions``: requests,
responses, stream chunks and the error body, in OpenAI's wire shapes (docs/design.md §5).

Parameters fall in four groups:
- mapped: ``model`` (must name the served model), ``messages`` / ``prompt``, ``max_tokens`` /
  ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed`` (the watermark nonce),
  ``stream``, ``stream_options.include_usage``; ``user`` is accepted and not used (OpenAI
  uses it for abuse monitoring only);
- neutral-only: OpenAI parameters that would change what is sampled or returned (``n``,
  penalties, ``logit_bias``, ``stop``, ``logprobs``, tools, ``response_format``, ``echo``,
  ``best_of``, ``suffix``): their neutral value (or null) is accepted, anything else is a 400
  naming the parameter, never silently ignored;
- poissonmark's extras: ``key_id`` (or the ``X-Poissonmark-Key`` header), ``method``,
  ``drafter``, ``B``, ``L``, ``top_k``;
- anything else: a 400 ``unknown_parameter`` naming it.
The answers carry the watermark facts in an extension object ``poissonmark``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from sampler.decoder import MAX_DRAFTS, MAX_LOOKAHEAD
from sampler.methods import DEFAULT_TREE, TreeMode
from service.schemas.common import DrafterSpec, KeyId, RequestModel, Text
from service.schemas.generate import MIN_TEMPERATURE

if TYPE_CHECKING:
    from sampler.methods import Method
else:
    from service.schemas.generate import Method

MAX_TEMPERATURE = 2.0
"""OpenAI's upper bound for ``temperature``."""
SEED_BOUND = 2**63
"""Seeds are nonces, in [0, 2^63): ``lt`` 2^63, which the document's float bound states exactly
(2^63 - 1 is not a float)."""


def _integral(value: object) -> object:
    # JSON Schema counts 4.0 as an integer, and so do the clients generated from it
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
"""An integer parameter: a JSON integer or a number with no fraction; never a string or a
boolean (requests are strict)."""
TokenCount = Annotated[int, Field(ge=1), BeforeValidator(_integral)]
Seed = Annotated[int, Field(ge=0, lt=SEED_BOUND), BeforeValidator(_integral)]
# (an optional field's bounds go inside its Annotated, before the validator: elsewhere they
# would reach the document as unknown keywords ``ge``/``lt``, not as ``minimum``)


def _same(value: object, allowed: object) -> bool:
    """JSON equality that keeps ``false`` apart from ``0`` (Python's ``False == 0``)."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    if isinstance(allowed, int | float):
        return isinstance(value, int | float) and value == allowed
    return type(value) is type(allowed) and value == allowed


@dataclass(frozen=True)
class Neutral:
    """Field metadata: a parameter accepted only at its neutral value ``allowed`` (or null);
    any other value is an ``unsupported_value`` error that says why (``reason``)."""

    allowed: object
    reason: str

    def _check(self, value: object) -> object:
        if value is None or _same(value, self.allowed):
            return value
        raise PydanticCustomError(
            "unsupported_value",
            "{reason}; only {allowed} (or null) is accepted",
            {"reason": self.reason, "allowed": json.dumps(self.allowed)},
        )

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        null: JsonSchemaValue = {"type": "null"}
        if self.allowed is None:
            return {**null, "description": self.reason}
        return {"anyOf": [{"enum": [self.allowed]}, null], "description": self.reason}


def _temperature(value: object) -> object:
    """0 (greedy: no watermark) or [0.01, 2]; the bounds of the JSON schema below."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("float_type", "expected a number")
    if not (value == 0 or MIN_TEMPERATURE <= value <= MAX_TEMPERATURE):
        raise PydanticCustomError(
            "temperature_range",
            "expected 0 (greedy, no watermark) or a number in [{low}, {high}], got {value}",
            {"low": MIN_TEMPERATURE, "high": MAX_TEMPERATURE, "value": value},
        )
    return float(value)


Temperature = Annotated[
    float,
    BeforeValidator(_temperature),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "enum": [0]},
                {"type": "number", "minimum": MIN_TEMPERATURE, "maximum": MAX_TEMPERATURE},
            ],
            "description": "0 = greedy (no watermark), else 0.01..2.",
        }
    ),
]

_PENALTY = "penalties change the model's distribution, and poissonmark emits exact samples of it"
_STOP = "stop sequences are not supported; generation ends at EOS or at max_tokens"
_N = "poissonmark returns one choice per request"
_LOGIT_BIAS = "logit_bias changes the model's distribution"


class StreamOptions(RequestModel):
    include_usage: bool = Field(
        default=False,
        description="Send OpenAI's extra last chunk with `choices: []` and the `usage` "
        "(without it the finishing chunk carries `usage`). Applies to streams only.",
    )


def _key_id_required(schema: dict[str, Any]) -> None:
    # The document asks for ``key_id`` in the body: the header alternative is a rule across two
    # locations that a JSON schema cannot state (the route accepts either; the body wins).
    schema["required"] = [*schema.get("required", []), "key_id"]


def _one_max_tokens(schema: dict[str, Any]) -> None:
    # what the route checks: the two names are not both given (null counts as given)
    _key_id_required(schema)
    schema["not"] = {"required": ["max_tokens", "max_completion_tokens"]}


class OpenAIRequest(RequestModel):
    """The parameters both routes share (module docstring)."""

    model_config = ConfigDict(json_schema_extra=_key_id_required)

    model: str = Field(
        min_length=1, max_length=256, description="The served model (`GET /v1/models`)."
    )
    key_id: KeyId | None = Field(
        default=None,
        description="The watermark key (the SDK's `extra_body`); without it, the "
        "`X-Poissonmark-Key` header names the key.",
    )
    max_tokens: TokenCount | None = Field(default=None, description="Tokens to generate at most.")
    temperature: Temperature = 1.0
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: Seed | None = Field(default=None, description="The watermark nonce; random when omitted.")
    stream: bool = Field(default=False, description="Answer with `data:` chunks, then [DONE].")
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256, description="Accepted, not used.")
    n: Annotated[Any, Neutral(1, _N)] = None
    frequency_penalty: Annotated[Any, Neutral(0, _PENALTY)] = None
    presence_penalty: Annotated[Any, Neutral(0, _PENALTY)] = None
    logit_bias: Annotated[Any, Neutral({}, _LOGIT_BIAS)] = None
    stop: Annotated[Any, Neutral([], _STOP)] = None
    method: Method = "mpfr"
    drafter: DrafterSpec | None = Field(
        default=None,
        description="poissonmark: the drafter (as in `POST /v1/generate`).",
    )
    drafts: Int = Field(default=4, alias="B", ge=1, le=MAX_DRAFTS, description="B, drafts.")
    lookahead: Int = Field(default=4, alias="L", ge=1, le=MAX_LOOKAHEAD, description="L.")
    tree: TreeMode = Field(
        default=DEFAULT_TREE, description="poissonmark: as in `POST /v1/generate`."
    )
    top_k: Int = Field(default=50, ge=0, le=2**31 - 1, description="poissonmark: 0 = off.")


class TextPart(RequestModel):
    type: Literal["text"]
    text: Text


class ChatMessageIn(RequestModel):
    """A message; ``developer`` is sent as ``system``, text parts are joined."""

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(OpenAIRequest):
    """A chat completion; at most one of ``max_tokens`` and ``max_completion_tokens``."""

    model_config = ConfigDict(json_schema_extra=_one_max_tokens)

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = Field(
        default=None, description="OpenAI's newer name of `max_tokens` (give one)."
    )
    logprobs: Annotated[Any, Neutral(False, "log-probabilities are not returned")] = None
    tools: Annotated[Any, Neutral([], "tool calling is not supported")] = None
    tool_choice: Annotated[Any, Neutral("none", "tool calling is not supported")] = None
    response_format: Annotated[
        Any, Neutral({"type": "text"}, "structured output is not supported")
    ] = None


class CompletionRequest(OpenAIRequest):
    """A raw continuation of ``prompt`` (no chat template), as OpenAI's legacy completions."""

    prompt: Text = Field(min_length=1, description="The text to continue (one string).")
    echo: Annotated[Any, Neutral(False, "the prompt is never returned with the completion")] = None
    best_of: Annotated[Any, Neutral(1, "poissonmark samples one candidate per request")] = None
    logprobs: Annotated[Any, Neutral(None, "log-probabilities are not returned")] = None
    suffix: Annotated[Any, Neutral("", "insertion (suffix) is not supported")] = None


# --- Responses ---------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int = Field(description="Prompt tokens (after the chat template).")
    completion_tokens: int = Field(description="Tokens the model emitted, EOS included.")
    total_tokens: int


class WatermarkStart(BaseModel):
    """What is known before the first token (the first stream chunk)."""

    key_id: str
    nonce: int
    method: Method


class WatermarkFacts(WatermarkStart):
    """The ``poissonmark`` extension of an answer (the finishing stream chunk)."""

    drafter: str | None
    watermark_applied: bool = Field(
        description="False for `ar`, `*-nowm` and temperature 0 (the keyed race is a no-op)."
    )
    aatps: float = Field(description="Average accepted tokens per step (per target pass).")
    token_ids: list[int] = Field(description="The completion's ids (EOS not included).")


FinishReason = Literal["stop", "length"]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    poissonmark: WatermarkFacts


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    poissonmark: WatermarkFacts | WatermarkStart | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: None = None


class Completion(BaseModel):
    """A completion, or (with ``stream``) one chunk of it: OpenAI uses one shape for both."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    poissonmark: WatermarkFacts | WatermarkStart | None = None


class ServedModelFacts(BaseModel):
    """poissonmark's extension of a model card: what a key must have been made for."""

    tokenizer: str = Field(
        description="Fingerprint of the served tokenizer: keys made for another one are refused "
        "(`tokenizer_mismatch`); `GET /v1/keys` shows each key's."
    )


class ModelCard(BaseModel):
    id: str = Field(
        description="The served model's name (an alias, or its directory's or file's name), as "
        "`model` must name it and as the keys made here record it."
    )
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    poissonmark: ServedModelFacts


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(examples=["invalid_request_error"])
    param: str | None = Field(description="The offending parameter, where there is one.")
    code: str | None = Field(examples=["unknown_parameter"])


class OpenAIError(BaseModel):
    """OpenAI's error body (these routes only; the rest of the API answers problem+json)."""

    error: OpenAIErrorDetail
