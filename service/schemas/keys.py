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
        description=(
            "m, token ids per context label. An edit destroys the labels of the m + 1 tokens "
            "from it on, so a smaller m keeps more of an edited text detectable and a larger m "
            "repeats less (more tokens scored): at 30 % random edits 0.915 of texts are found "
            "at m = 2 against 0.885 at m = 4; a 128-token answer inside 15 times as much human "
            "text 0.95 against 1.0 (bench/results/detector_width.md)."
        ),
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
