"""Settings of the CLI and the service: one pydantic-settings class (``POISSONMARK_`` prefix).

Library code never reads the environment; the edges (CLI, HTTP app) build a ``Settings`` and
pass values down.
"""

from __future__ import annotations

import base64
import binascii
from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Where data lives and how to reach Redis.

    Environment: ``POISSONMARK_HOME`` (data dir: converted models, embedded Redis, KEK file),
    ``REDIS_URL`` or ``POISSONMARK_REDIS_URL`` (external Redis; unset = embedded),
    ``POISSONMARK_KEK`` (base64 of 32 bytes; unset = a generated one in ``HOME/kek``),
    ``POISSONMARK_MODEL``, ``POISSONMARK_DEVICE``.
    """

    model_config = SettingsConfigDict(env_prefix="POISSONMARK_", extra="ignore")

    home: Path = Path("~/.local/share/poissonmark")
    redis_url: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("REDIS_URL", "POISSONMARK_REDIS_URL")
    )
    kek: SecretStr | None = None
    model: str = "smollm2-135m-instruct"
    device: str = "auto"

    @field_validator("home")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("kek")
    @classmethod
    def _kek_is_32_bytes(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        try:
            raw = base64.b64decode(value.get_secret_value(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("POISSONMARK_KEK: expected base64 of 32 bytes") from None
        if len(raw) != 32:
            raise ValueError(f"POISSONMARK_KEK: expected 32 bytes, got {len(raw)}")
        return value

    def kek_bytes(self) -> bytes | None:
        return None if self.kek is None else base64.b64decode(self.kek.get_secret_value())


@lru_cache
def get_settings() -> Settings:
    return Settings()
