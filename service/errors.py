"""Domain exceptions of the service layer and their one HTTP mapping table (docs/design.md §5).

Every message is safe to show a caller or write to a log: it may name a key id, a tenant, a
file path or a Redis location, never key material, a key-encryption key, a bearer token or a
password. Library code raises these classes (``InvalidInput`` for bad input values) and never
builds HTTP errors itself; ``PROBLEMS`` maps each class to a status and a stable RFC 9457
problem type, looked up along the class's MRO (``problem_for``), and ``service.http.problems``
renders the problem+json response.

Exceptions keep their constructor arguments in ``args`` (so they pickle across processes) and
build the message in ``__str__``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from detector.errors import TokenizerMismatch

KEY_ID_PATTERN: Final = re.compile(r"pmk_[0-9a-f]{16}")
"""Shape of a key id: ``"pmk_"`` + 16 lowercase hex digits (``secrets.token_hex(8)``).

Owned here so an error message can decide whether a caller-supplied id is safe to echo.
"""


def shown_key_id(key_id: object) -> str:
    """``key_id`` quoted when it has the key-id shape, else a placeholder.

    A malformed "id" is caller input of unknown content (it could be a pasted secret), so it
    is never echoed back.
    """
    if isinstance(key_id, str) and KEY_ID_PATTERN.fullmatch(key_id):
        return f"'{key_id}'"
    return "<malformed key id>"


class PoissonmarkError(Exception):
    """Base of every poissonmark domain error; its message never holds secret material."""


class UnknownKey(PoissonmarkError):
    """No key with this id is visible to the caller (absent, or another tenant's key)."""

    def __init__(self, key_id: str) -> None:
        super().__init__(key_id)
        self.key_id = key_id

    def __str__(self) -> str:
        if isinstance(self.key_id, str) and KEY_ID_PATTERN.fullmatch(self.key_id):
            return f"unknown key id '{self.key_id}'"
        return "malformed key id: expected 'pmk_' and 16 lowercase hex digits (not echoed)"


class KeyRevoked(PoissonmarkError):
    """The key exists but was revoked; it can no longer generate."""

    def __init__(self, key_id: str) -> None:
        super().__init__(key_id)
        self.key_id = key_id

    def __str__(self) -> str:
        return f"key {shown_key_id(self.key_id)} is revoked"


class KeyDecryptionFailed(PoissonmarkError):
    """A stored secret could not be decrypted: wrong key-encryption key or a tampered record."""

    def __init__(
        self, key_id: str, reason: str = "wrong key-encryption key or tampered record"
    ) -> None:
        super().__init__(key_id, reason)
        self.key_id = key_id
        self.reason = reason

    def __str__(self) -> str:
        return f"cannot decrypt the secret of key {shown_key_id(self.key_id)}: {self.reason}"


class KeyRecordCorrupt(PoissonmarkError):
    """A stored key record is missing a field or holds a value that does not validate."""

    def __init__(self, key_id: str, problem: str) -> None:
        super().__init__(key_id, problem)
        self.key_id = key_id
        self.problem = problem

    def __str__(self) -> str:
        return f"stored record of key {shown_key_id(self.key_id)} is corrupt: {self.problem}"


class KeyStoreUnavailable(PoissonmarkError):
    """Redis could not be reached or refused the operation.

    ``where`` is a location with any password already redacted (see
    ``service.keys.redis.redact_url``).
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where, reason)
        self.where = where
        self.reason = reason

    def __str__(self) -> str:
        return f"key store unavailable at {self.where}: {self.reason}"


class KekFileError(PoissonmarkError):
    """The key-encryption-key file is unsafe (group/other permissions) or malformed."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    def __str__(self) -> str:
        return f"key-encryption key file {self.path}: {self.problem}"


class InvalidInput(PoissonmarkError, ValueError):
    """A value outside what the service accepts (a request field the schema let through, a CLI
    option, a record parameter): names the field and what was expected.

    Also a ``ValueError`` (STYLE 6: a boundary check names expected and actual), but the only
    kind of ``ValueError`` the service reports as the caller's fault; any other is a bug (500).
    A message may quote the offending value only when it cannot hold a secret.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field = field
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


# --- Errors of the HTTP service --------------------------------------------------------------


class LimitExceeded(PoissonmarkError):
    """A request value is over one of the service's limits (a setting)."""

    def __init__(self, field: str, limit: int, actual: int, unit: str = "") -> None:
        super().__init__(field, limit, actual, unit)
        self.field = field
        self.limit = limit
        self.actual = actual
        self.unit = unit

    def __str__(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.field}: at most {self.limit}{unit} allowed, got {self.actual}"


class QuotaExceeded(PoissonmarkError):
    """The tenant already holds as many keys as its quota allows (revoked keys count until
    they are deleted)."""

    def __init__(self, tenant: str, quota: int) -> None:
        super().__init__(tenant, quota)
        self.tenant = tenant
        self.quota = quota

    def __str__(self) -> str:
        return (
            f"key quota: tenant {self.tenant!r} holds {self.quota} keys, the most allowed "
            "(max_keys_per_tenant); delete keys it no longer needs"
        )


class BodyTooLarge(PoissonmarkError):
    """The request body is over the size limit (bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit

    def __str__(self) -> str:
        return f"request body: at most {self.limit} bytes allowed"


class NotAuthenticated(PoissonmarkError):
    """No bearer token, or one that is unknown, malformed or revoked (never echoed)."""

    def __init__(self, reason: str = "missing or invalid bearer token") -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class ScopeMissing(PoissonmarkError):
    """The caller's token lacks the scope an endpoint needs."""

    def __init__(self, scope: str) -> None:
        super().__init__(scope)
        self.scope = scope

    def __str__(self) -> str:
        return f"this token lacks the {self.scope!r} scope"


class RateLimited(PoissonmarkError):
    """The caller's token spent its budget of work for the current window.

    ``setting`` names the limit (``detect_rate_limit``, ``generate_rate_limit``), ``unit`` what
    it counts."""

    def __init__(
        self,
        limit: int,
        window_s: int,
        retry_after_s: int,
        setting: str = "detect_rate_limit",
        unit: str = "detection work units (tokens × keys)",
    ) -> None:
        super().__init__(limit, window_s, retry_after_s, setting, unit)
        self.limit = limit
        self.window_s = window_s
        self.retry_after_s = retry_after_s
        self.setting = setting
        self.unit = unit

    def __str__(self) -> str:
        return (
            f"rate limit ({self.setting}): at most {self.limit} {self.unit} per "
            f"{self.window_s} s per token; retry in {self.retry_after_s} s"
        )


class DeadlineExceeded(PoissonmarkError):
    """A request ran past its deadline (``setting``, seconds); its work was stopped (a
    generation) or its result dropped (a detection)."""

    def __init__(self, setting: str, limit_s: float) -> None:
        super().__init__(setting, limit_s)
        self.setting = setting
        self.limit_s = limit_s

    def __str__(self) -> str:
        return f"the request ran past its deadline of {self.limit_s:g} s ({self.setting})"


class QueueFull(PoissonmarkError):
    """Every slot of the generation queue is taken."""

    def __init__(self, size: int, retry_after_s: int) -> None:
        super().__init__(size, retry_after_s)
        self.size = size
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return (
            f"the generation queue is full ({self.size} waiting); retry in {self.retry_after_s} s"
        )


class NotReady(PoissonmarkError):
    """A resource the request needs (model, worker) is not available (yet, or any more)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what

    def __str__(self) -> str:
        return f"not ready: {self.what}"


class GenerationCancelled(PoissonmarkError):
    """The client of a generation went away (or the service is stopping); its work stopped."""

    def __str__(self) -> str:
        return "generation cancelled"


class NoKeys(PoissonmarkError):
    """Detection without a key id, but the caller's tenant has no key to test (none made for
    the tokenizer of ``model``, the model in use, when it is named)."""

    def __init__(self, tenant: str, model: str | None = None) -> None:
        super().__init__(tenant, model)
        self.tenant = tenant
        self.model = model

    def __str__(self) -> str:
        if self.model is None:
            return f"tenant {self.tenant!r} has no key to test: create one or give key_id"
        return (
            f"tenant {self.tenant!r} has no key made for the tokenizer of model "
            f"{self.model!r}: create one or give key_id"
        )


class UnknownQueryParameter(PoissonmarkError):
    """A query parameter the endpoint does not take (a typo would otherwise pass silently)."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(name, known)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        accepted = ", ".join(self.known) or "none"
        return f"unknown query parameter (this endpoint takes: {accepted})"


class UnsupportedMediaType(PoissonmarkError):
    """A request body that is not JSON (by its ``Content-Type``) where a route reads JSON.

    ``media_type`` is what to show: the header's ``type/subtype`` when it is a plain media
    type, ``"none"`` without the header, else a placeholder (a header is caller input).
    """

    def __init__(self, media_type: str) -> None:
        super().__init__(media_type)
        self.media_type = media_type

    def __str__(self) -> str:
        return (
            f"Content-Type: expected application/json, got {self.media_type}; send the body as "
            "JSON with Content-Type: application/json"
        )


# --- The mapping table -------------------------------------------------------------------


PROBLEM_BASE: Final = "urn:poissonmark:problem:"


@dataclass(frozen=True)
class ProblemType:
    """How one class of error is reported: HTTP status, stable type URI, short title.

    ``expose`` says whether the exception message is safe *and useful* as the ``detail``; for
    server-side faults the detail stays generic (the message may name files or hosts).
    """

    slug: str
    status: int
    title: str
    expose: bool = True

    @property
    def type(self) -> str:
        return PROBLEM_BASE + self.slug


INTERNAL: Final = ProblemType("internal-error", 500, "Internal server error", expose=False)
INVALID_REQUEST: Final = ProblemType("invalid-request", 422, "Invalid request")
MALFORMED_REQUEST: Final = ProblemType("malformed-request", 400, "Malformed request body")
NOT_FOUND: Final = ProblemType("not-found", 404, "Not found")
METHOD_NOT_ALLOWED: Final = ProblemType("method-not-allowed", 405, "Method not allowed")

PROBLEMS: Final[dict[type[BaseException], ProblemType]] = {
    UnknownKey: ProblemType("unknown-key", 404, "Unknown key"),
    KeyRevoked: ProblemType("key-revoked", 409, "Key revoked"),
    TokenizerMismatch: ProblemType("tokenizer-mismatch", 409, "Tokenizer mismatch"),
    NoKeys: ProblemType("no-keys", 409, "No key to test"),
    LimitExceeded: ProblemType("limit-exceeded", 422, "Limit exceeded"),
    QuotaExceeded: ProblemType("quota-exceeded", 403, "Quota exceeded"),
    UnknownQueryParameter: INVALID_REQUEST,
    BodyTooLarge: ProblemType("body-too-large", 413, "Request body too large"),
    UnsupportedMediaType: ProblemType("unsupported-media-type", 415, "Unsupported media type"),
    NotAuthenticated: ProblemType("unauthenticated", 401, "Not authenticated"),
    ScopeMissing: ProblemType("insufficient-scope", 403, "Insufficient scope"),
    RateLimited: ProblemType("rate-limited", 429, "Too many requests"),
    DeadlineExceeded: ProblemType("deadline-exceeded", 504, "Deadline exceeded"),
    QueueFull: ProblemType("queue-full", 503, "Generation queue full"),
    NotReady: ProblemType("not-ready", 503, "Service not ready"),
    KeyStoreUnavailable: ProblemType(
        "key-store-unavailable", 503, "Key store unavailable", expose=False
    ),
    GenerationCancelled: ProblemType("cancelled", 503, "Generation cancelled"),
    KeyDecryptionFailed: ProblemType(
        "key-unreadable", 500, "Stored key cannot be decrypted", expose=False
    ),
    KeyRecordCorrupt: ProblemType("key-record-corrupt", 500, "Stored key is corrupt", expose=False),
    KekFileError: ProblemType("kek-file", 500, "Key-encryption key unusable", expose=False),
    InvalidInput: INVALID_REQUEST,
    # No entry for ValueError (or any other builtin): one that is not InvalidInput is a bug,
    # reported as INTERNAL (a logged 500), never as the caller's fault.
}


def problem_for(exc: BaseException) -> ProblemType:
    """The table entry of the nearest class in ``type(exc).__mro__``; ``INTERNAL`` if none."""
    for cls in type(exc).__mro__:
        found = PROBLEMS.get(cls)
        if found is not None:
            return found
    return INTERNAL
