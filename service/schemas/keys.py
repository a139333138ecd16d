"""``/v1/keys``: request and the public key schema (no key material, by construction)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.key_record import CONTEXT_WIDTH_MAX, CONTEXT_WIDTH_MIN, DEFAULT_CONTEXT_WIDTH
from service.schemas.common import RequestModel


class KeyCreateRequest(RequestModel):
    """A new key for the caller's tenant, bound to the served model's tokenizer."""

    context_width: int = Field(
        default=DEFAULT_CONTEXT_WIDTH,
        ge=CONTEXT_WIDTH_MIN,
        le=CONTEXT_WIDTH_MAX,
        description="m, token ids per context label.",
    )
    masking: bool = Field(default=True, description="Apply the repeated-context rule.")


class KeyOut(BaseModel):
    """A key's public record. It has no secret field: the secret never leaves the service."""

    key_id: str
    context_width: int
    masking: bool
    prf_version: int
    tokenizer: str = Field(description="Fingerprint of the tokenizer the key is bound to.")
    created_at: str
    revoked: bool


class KeyList(BaseModel):
    """One page of keys in creation order (key-id order with ``prefix``)."""

    keys: list[KeyOut]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null after the last one. A page may "
        "hold fewer than `limit` keys (even none, without revoked keys) while this is set."
    )
