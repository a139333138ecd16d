"""``/v1/keys``: request and the public key schema (no key material, by construction)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.keys.record import (
    CONTEXT_WIDTH_MAX,
    CONTEXT_WIDTH_MIN,
    DEFAULT_CONTEXT_WIDTH,
    MODEL_MAX_CHARS,
)
from service.schemas.common import RequestModel


class KeyCreateRequest(RequestModel):
    """A new key for the caller's tenant, bound to the served model's tokenizer."""

    context_width: int = Field(
        default=DEFAULT_CONTEXT_WIDTH,
        ge=CONTEXT_WIDTH_MIN,
        le=CONTEXT_WIDTH_MAX,
        description=(
            "m, token ids per context label. An inserted or changed token destroys the labels "
            "of the m + 1 positions from it on (a deletion m), so a smaller m keeps more of an "
            "edited text detectable, while a larger m repeats less (more tokens scored) and is "
            "harder to learn from samples. After 30 % random edits the verdict finds 0.99 of "
            "texts at m = 1, 0.915 at m = 2, 0.885 at m = 4; a 128-token answer inside 15 times "
            "as much human text 0.94, 0.95 and 1.0 (bench/results/detector_width.md)."
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
    model: str | None = Field(
        description="The model the key was made for, by name (an alias, or a model directory's "
        "or file's name); null when the key's record names none. The key works with every "
        "model of its tokenizer and is refused (409 `tokenizer-mismatch`) by any other.",
        max_length=MODEL_MAX_CHARS,
    )
    created_at: str
    revoked: bool


class KeyList(BaseModel):
    """One page of keys in creation order (key-id order with ``prefix``)."""

    keys: list[KeyOut]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null after the last one. A page may "
        "hold fewer than `limit` keys (even none, without revoked keys) while this is set."
    )
