"""``/healthz`` and ``/readyz``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    checks: dict[str, Literal["ok", "failing"]]
    model: str | None = Field(
        default=None,
        description="The one model this service serves, by name (as `GET /v1/models` names "
        "it); null until it is loaded.",
    )
    tokenizer: str | None = Field(
        default=None,
        description="Fingerprint of the served tokenizer: the keys this service uses were made "
        "for it; null until the model is loaded.",
    )
