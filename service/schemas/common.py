"""Shared schema pieces: the problem document, field types with their checks."""

from __future__ import annotations

import re
from types import UnionType
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from service.errors import KEY_ID_PATTERN


def _no_lone_surrogates(value: str) -> str:
    # JSON can carry "\ud800"; such a string cannot be encoded, tokenized or sent back.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("expected valid Unicode text (it holds a lone surrogate)") from None
    return value


def _integral_float(value: object) -> object:
    # JSON Schema counts 17.0 as an integer, and so do the clients generated from it.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Text = Annotated[str, AfterValidator(_no_lone_surrogates)]
INTEGRAL: Final = BeforeValidator(_integral_float)
"""Marks an integer inside a request field (``list[Annotated[int, Field(ge=0), INTEGRAL]]``):
a JSON integer, or a number with no fraction (``17.0``). Bounds go before it in ``Annotated``,
or they leave the JSON Schema. Fields typed ``int`` (or ``int | None``) need no mark: every
``RequestModel`` reads them so."""
KeyId = Annotated[
    str,
    Field(
        pattern=f"^{KEY_ID_PATTERN.pattern}$",
        description="A key id: `pmk_` and 16 lowercase hex digits.",
        examples=["pmk_0123456789abcdef"],
    ),
]


DRAFTER_PATTERN: Final = r"^(eagle|ngram|heads|self:[1-9][0-9]?)$"
"""The drafter specs a request may name (the served document lists the served ones)."""


def _drafter_spec(value: str) -> str:
    # The schema keeps the pattern; the error says it in words (the value is not echoed).
    if not re.fullmatch(DRAFTER_PATTERN, value):
        raise PydanticCustomError(
            "drafter", "expected eagle, ngram, heads or self:N (N from 1 to 99)"
        )
    return value


DrafterSpec = Annotated[
    str, AfterValidator(_drafter_spec), Field(json_schema_extra={"pattern": DRAFTER_PATTERN})
]


class RequestModel(BaseModel):
    """Base of request bodies: strict types (no 0 for false, no "1" for 1), unknown fields
    are errors, NaN/Infinity are refused; an integer field takes ``17.0`` as 17 (JSON Schema
    counts it an integer, and so do the clients and fuzzers generated from the document)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _integral_floats(cls, value: object, info: ValidationInfo) -> object:
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _takes_int(field.annotation):
            return _integral_float(value)
        return value


def _takes_int(annotation: object) -> bool:
    """``int``, or a union with ``int`` in it (``int | None``), bounds (``Annotated``) or not."""
    if annotation is int:
        return True
    if get_origin(annotation) is Annotated:
        return _takes_int(get_args(annotation)[0])
    return get_origin(annotation) in (Union, UnionType) and any(
        _takes_int(arg) for arg in get_args(annotation)
    )


class ChatMessage(RequestModel):
    """One message of a chat prompt (``POST /v1/generate`` ``messages``, and the generation's
    prompt a detect item may carry)."""

    role: Literal["system", "user", "assistant"]
    content: Text


class FieldError(BaseModel):
    field: str = Field(description="Dotted location, e.g. `body.max_new_tokens`.")
    message: str


class Problem(BaseModel):
    """An RFC 9457 problem document (``application/problem+json``).

    ``type`` is stable per kind of error (``urn:poissonmark:problem:<slug>``); ``field`` and
    ``limit`` name the offending field and the limit it broke, where there is one.
    """

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["urn:poissonmark:problem:limit-exceeded"])
    title: str
    status: int = Field(ge=400, le=599)
    detail: str | None = None
    instance: str | None = None
    field: str | None = None
    limit: int | float | None = None
    errors: list[FieldError] | None = None


PROBLEM_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed JSON body.",
    401: "Missing, invalid or revoked bearer token.",
    403: "The token lacks the scope this endpoint needs.",
    404: "No such key for this tenant (another tenant's key looks absent).",
    409: "The key cannot be used for this (revoked, other tokenizer, no keys).",
    413: "Request body over the size limit.",
    415: "The body is not JSON (`Content-Type` other than `application/json`; see Accept-Post).",
    422: "Invalid field, or a field over a limit (`field`, `limit`).",
    429: "Per-token rate limit reached (`field` names it); see Retry-After.",
    503: "Generation queue full, key store unreachable or service not ready; see Retry-After.",
    504: "The request ran past its deadline (`field` names the setting, `limit` its seconds).",
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries with a ``Problem`` body (the app documents them as
    ``application/problem+json``, see ``service.http.app``)."""
    return {
        status: {"model": Problem, "description": PROBLEM_DESCRIPTIONS[status]}
        for status in statuses
    }
