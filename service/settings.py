"""Settings of the CLI and the service: one pydantic-settings class (``POISSONMARK_`` prefix).

Library code never reads the environment; the edges (CLI, HTTP app) build a ``Settings`` and
pass values down.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

ADMIN_TOKEN_MIN_CHARS = 32
_SECRET_FILES: dict[str, tuple[str, ...]] = {
    "kek": ("kek",),
    "kek_previous": ("kek_previous",),
    "admin_token": ("admin_token",),
    "metrics_token": ("metrics_token",),
    "redis_url": ("REDIS_URL", "POISSONMARK_REDIS_URL", "redis_url"),
}
"""Secrets that may come from a file (``<name>_file``): the input keys each is set by (the
first is the one the file's text is given as)."""
_PLACEHOLDER_WORDS = ("changeme", "change-me", "change_me", "example", "placeholder", "xxxxxxxx")


class SettingsError(ValueError):
    """A setting that does not validate: one line per setting, each naming its variable and the
    rule it breaks (``POISSONMARK_ADMIN_TOKEN: expected at least 32 random characters …``),
    without pydantic's error types, locations and help URLs. The CLI prints it and exits 2."""


def _setting_problem(error: Mapping[str, Any]) -> str:
    """One line for one of pydantic's errors: the variable, then what is wrong with it.

    Our validators' messages already start with the variable (``POISSONMARK_KEK: …``);
    pydantic's own (types, bounds, patterns) are prefixed with it.
    """
    context = error.get("ctx") or {}
    problem = str(context["error"]) if "error" in context else str(error["msg"])
    if problem.startswith("POISSONMARK_") or not error["loc"]:
        return problem
    name = str(error["loc"][0])
    variable = name if name.isupper() else f"POISSONMARK_{name.upper()}"  # an alias: REDIS_URL
    return f"{variable}: {problem}"


class Settings(BaseSettings):
    """Where data lives and how to reach Redis; the HTTP service's address, limits and budgets.

    Environment: ``POISSONMARK_HOME`` (data dir: converted models, embedded Redis, KEK file),
    ``REDIS_URL`` or ``POISSONMARK_REDIS_URL`` (external Redis; unset = embedded),
    ``POISSONMARK_KEK`` (base64 of 32 bytes; unset = a generated one in ``HOME/kek``),
    ``POISSONMARK_KEK_PREVIOUS`` (the KEK a rotation moves away from),
    each secret also from a file: ``POISSONMARK_KEK_FILE``, ``POISSONMARK_ADMIN_TOKEN_FILE``,
    ``POISSONMARK_METRICS_TOKEN_FILE``, ``POISSONMARK_REDIS_URL_FILE`` (Docker secrets),
    ``POISSONMARK_MODEL``, ``POISSONMARK_DEVICE``, ``POISSONMARK_PRECISION``; for
    ``poissonmark serve`` every field below ``precision`` as ``POISSONMARK_<FIELD>`` (e.g.
    ``POISSONMARK_ADMIN_TOKEN``, ``POISSONMARK_MAX_NEW_TOKENS``). Exceeding a ``max_*`` limit
    is a 4xx naming the field and the limit (413 for ``max_body_bytes``).
    """

    # hide_input_in_errors: a rejected KEK or admin token must not be echoed in the error.
    model_config = SettingsConfigDict(
        env_prefix="POISSONMARK_", extra="ignore", hide_input_in_errors=True
    )

    def __init__(self, **values: Any) -> None:
        """Read the environment (and ``values``, which win over it).

        Raises:
            SettingsError: a setting does not validate (every such setting, one a line).
        """
        try:
            super().__init__(**values)
        except ValidationError as exc:
            problems = dict.fromkeys(_setting_problem(error) for error in exc.errors())
            raise SettingsError("\n".join(problems)) from None

    home: Path = Path("~/.local/share/poissonmark")
    redis_url: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("REDIS_URL", "POISSONMARK_REDIS_URL")
    )
    kek: SecretStr | None = None
    kek_file: Path | None = None
    """A file holding ``kek`` (e.g. a Docker secret, ``/run/secrets/...``): keeps the KEK out
    of the environment that ``docker inspect`` shows. Likewise ``admin_token_file``,
    ``metrics_token_file`` and ``redis_url_file``; giving a secret both ways is an error."""
    kek_previous: SecretStr | None = None
    """The KEK being rotated out (base64 of 32 bytes): it still unseals the records and
    verifies the API tokens it made while ``kek`` seals everything new; ``poissonmark keys
    reseal`` (and the service's start) moves its records to ``kek`` (docs/deployment.md)."""
    kek_previous_file: Path | None = None
    admin_token_file: Path | None = None
    metrics_token_file: Path | None = None
    redis_url_file: Path | None = None
    model: str = "smollm2-135m-instruct"
    """An alias, a GGUF file's path or a local HF model directory
    (``sampler.targets.model_files.locate``); ``poissonmark serve`` checks it before it listens."""
    device: str = "auto"
    precision: Literal["auto", "float32", "bfloat16", "gguf"] = "auto"
    """Target precision (``sampler.models.PRECISIONS``): ``gguf`` is the model's GGUF file
    through llama.cpp (the CPU default where llama-cpp-python is installed); ``bfloat16`` on
    the CPU is the
    row-invariant runner (outputs stay identical across drafters and batches; 95 against 39
    tokens/s in float32 at 8 clients here, in different runs); ``auto`` is gguf where it
    runs, else that runner on CPUs with AMX bfloat16 whose kernels pass its probe, float32 on
    other CPUs, and bfloat16 on CUDA."""

    # HTTP service
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    """Server processes (``poissonmark serve``); more than one needs a Redis server
    (``redis_url``): the embedded Redis belongs to one process."""
    admin_token: SecretStr | None = None
    """Bootstrap bearer token with every scope for ``admin_tenant`` (>= 32 characters)."""
    admin_tenant: str = Field(default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    legacy_token_digests: bool = False
    """Also accept API tokens stored with the earlier unkeyed digest (SHA-256 of the token
    alone). Whoever can write to Redis can then mint tokens: only while clients move to
    reissued tokens (``service.keys.api_tokens``)."""
    metrics_token: SecretStr | None = None
    """Bearer token that reads ``/metrics`` and nothing else (>= 32 characters); the admin
    token reads it too. Neither set: ``/metrics`` answers 401 to everyone."""
    redis_prefix: str = Field(default="pm:", min_length=1, max_length=64)
    # limits
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    max_text_chars: int = Field(default=100_000, ge=1)
    max_token_ids: int = Field(default=32_768, ge=1)
    max_tokens: int = Field(default=32_768, ge=1)
    """Tokens a detect item's text may have after tokenizing (counted before any key is read;
    ``max_text_chars`` bounds the characters first)."""
    max_evidence_tokens: int = Field(default=32_768, ge=1)
    """Per-token evidence rows one detect response may hold (the best key's, summed over a
    batch's items)."""
    max_prompt_chars: int = Field(default=32_000, ge=1)
    max_prompt_tokens: int = Field(default=4096, ge=1)
    max_messages: int = Field(default=64, ge=1)
    max_new_tokens: int = Field(default=512, ge=1)
    max_drafts: int = Field(default=8, ge=1)
    max_lookahead: int = Field(default=8, ge=1)
    max_batch: int = Field(default=32, ge=1)
    max_keys_per_detect: int = Field(default=10_000, ge=1, le=10_000)
    """Keys a detection without ``key_id`` may test (else 422 ``limit-exceeded``), counted in
    the tenant's key index before any record is read. The per-key cost is ~0.2 µs per scored
    token (``bench/results/multikey_cost.json``): 10,000 keys on a 500-token text are ~1 s of
    one core; and every key costs a factor in the p-value."""
    max_keys_per_tenant: int = Field(default=10_000, ge=1)
    """Keys a tenant may hold, revoked ones included until deleted (``POST /v1/keys`` beyond
    it: 403 ``quota-exceeded``)."""
    # concurrency and abuse
    queue_size: int = Field(default=8, ge=1)
    """Generation requests that may wait for the worker; one more is 503 + Retry-After."""
    retry_after_s: int = Field(default=2, ge=1)
    generation_batch: int = Field(default=8, ge=1, le=256)
    """Generation requests that step together (continuous batching: one target forward over
    all their draft trees per step); more wait in the queue (``queue_size``)."""
    generation_node_budget: int = Field(default=8, ge=0)
    """Draft-tree nodes per batched target forward of two or more requests (0: no cap). When
    a step's trees could exceed it, each keyed-race request's tree is capped at
    budget / batch nodes (B, then L, shrink; one node: a one-token step); its output stays the
    same (Thm. 5.1). A lone request is never capped. On llama.cpp (the CPU default) a
    9-row forward costs 5.2 one-row ones on 2 AMD EPYC cores (``gguf_forward_costs_amd.json``),
    so beside others a request's draft nodes rarely pay: 8 clients of the default generation
    got 1.24-1.40x one client's tokens/s at p50 4.5-5.2x a lone request with 8, against
    1.24-1.34x at 5.7-6.1x with 16 (``bench/results/service_load_shared.json``,
    ``service_load_shared_budget16.json``)."""
    generation_threads: int = Field(default=0, ge=0, le=256)
    """torch threads of the generation worker (0: the process's count at startup)."""
    detect_threads: int = Field(default=2, ge=1, le=64)
    key_cache_ttl_s: float = Field(default=30.0, ge=0, le=3600)
    """How long detection keeps a decrypted key record (0: no cache). Safe to cache: a record
    never changes but for ``revoked``, which detection by key id ignores, and multi-key
    detection reads which keys to test from Redis at each request (``service.jobs.detection``)."""
    key_cache_size: int = Field(default=20_000, ge=1, le=1_000_000)
    """Cached records; at least ``max_keys_per_detect`` so a tenant's keys stay cached."""
    detect_rate_limit: int = Field(default=600, ge=1)
    """Work units of detection per token per ``detect_rate_window_s``: an item costs
    ceil(tokens × (keys tested + 8 × keys with a full result) / ``detect_work_unit``), at
    least 1 (``service.jobs.detection.DetectPlan``); a request that costs more than the whole
    window's budget is refused (422 ``limit-exceeded``)."""
    detect_work_unit: int = Field(default=10_000, ge=1)
    """Token·keys per rate-limit unit: 10,000 are ~2 ms of one core for the keyed pivots
    (``bench/results/multikey_cost.json``), so the default budget is ~1.2 s of CPU a minute:
    600 texts of up to 1,111 tokens against one key, or 20 of 32,768."""
    detect_rate_window_s: int = Field(default=60, ge=1)
    detect_deadline_s: float = Field(default=120.0, gt=0, le=86_400)
    """Seconds a detect request may take (waiting for the detection pool included); past it,
    504 ``deadline-exceeded``: work not yet started is dropped, work under way (bounded by the
    limits above) finishes unseen."""
    generate_rate_limit: int = Field(default=60_000, ge=1)
    """Tokens of generation per token per ``generate_rate_window_s``: a request costs its
    prompt's tokens (after the chat template) + the new tokens it asks for (``max_new_tokens``,
    ``max_tokens``), charged when it is queued, whether it then uses them all or not. Beyond
    the window's budget: 429 + Retry-After; a request costing more than a whole window: 422."""
    generate_rate_window_s: int = Field(default=60, ge=1)
    generation_deadline_s: float = Field(default=600.0, gt=0, le=86_400)
    """Seconds a generation may take from being queued to its last token; past it the job
    stops and frees its slot: 504 ``deadline-exceeded`` (streaming: a final ``error`` event)."""
    redis_timeout_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files(cls, data: Any) -> Any:
        """``<secret>_file`` -> ``<secret>``: the file's text without its trailing newline."""
        if not isinstance(data, dict):
            return data
        for name, aliases in _SECRET_FILES.items():
            path = data.get(f"{name}_file")
            if path is None or path == "":
                continue
            env = f"POISSONMARK_{name.upper()}"
            if any(data.get(alias) not in (None, "") for alias in aliases):
                raise ValueError(f"{env}_FILE: give {env} or {env}_FILE, not both")
            try:
                text = Path(path).expanduser().read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"{env}_FILE: cannot read {path} ({type(exc).__name__})") from None
            data = {**data, aliases[0]: text.rstrip("\r\n")}
        return data

    @field_validator("home")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("kek", "kek_previous")
    @classmethod
    def _kek_is_32_bytes(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        name = f"POISSONMARK_{(info.field_name or '').upper()}"
        try:
            raw = base64.b64decode(value.get_secret_value(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{name}: expected base64 of 32 bytes") from None
        if len(raw) != 32:
            raise ValueError(f"{name}: expected 32 bytes, got {len(raw)}")
        return value

    @field_validator("admin_token", "metrics_token")
    @classmethod
    def _token_is_strong(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        name = f"POISSONMARK_{(info.field_name or '').upper()}"
        token = value.get_secret_value()
        if len(token) < ADMIN_TOKEN_MIN_CHARS or len(set(token)) < 8:
            raise ValueError(
                f"{name}: expected at least {ADMIN_TOKEN_MIN_CHARS} random "
                "characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
            )
        if any(word in token.lower() for word in _PLACEHOLDER_WORDS):
            raise ValueError(f"{name}: looks like a placeholder; use a random one")
        return value

    def kek_bytes(self) -> bytes | None:
        return None if self.kek is None else base64.b64decode(self.kek.get_secret_value())

    def previous_keks(self) -> tuple[bytes, ...]:
        """The KEK being rotated out, if any (``kek_previous``)."""
        if self.kek_previous is None:
            return ()
        return (base64.b64decode(self.kek_previous.get_secret_value()),)


@lru_cache
def get_settings() -> Settings:
    return Settings()


MODEL_NAME_MAX_CHARS = 256
"""The longest model name a key record holds (``model_name`` cuts longer ones)."""


def model_name(model: str) -> str:
    """The name people know a model setting by: an alias as it is, a local directory's or file's
    own name (``/models/Qwen3-0.6B/`` -> ``Qwen3-0.6B``). Printable, at most
    ``MODEL_NAME_MAX_CHARS`` characters (others become ``?``), never empty.

    Args:
        model: the ``model`` setting or ``--model``: an alias or a path.
    """
    path = Path(model).expanduser()
    try:
        name = path.resolve().name if path.exists() else path.name
    except (OSError, RuntimeError):  # a name too long for the file system, a symlink loop
        name = path.name
    name = name or model or "?"
    return "".join(c if c.isprintable() else "?" for c in name)[:MODEL_NAME_MAX_CHARS]
