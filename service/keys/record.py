"""Key records: one watermark key, its limits, and its Redis encoding (docs/design.md §2, §5).

A record holds the key id, the secret (sealed with AES-GCM before it is written:
``service.keys.kek.Sealer``) and the parameters every use of it must follow: context width m,
repeated-context masking, ``PRF_VERSION``, tokenizer fingerprint, the name of the model it was
made for, tenant, creation time and the revoked flag. ``service.keys.store`` stores them.

The model's name is for people (the key listing, the message that refuses another tokenizer);
the fingerprint decides. A record written without one (the hash has no ``model`` field) reads
back with ``model`` None and is shown as ``unknown``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from redis.typing import EncodableT, FieldT

from keyed.context import MAX_CONTEXT_WIDTH, KeyedSource
from keyed.prf import PRF_VERSION, Secret
from service.errors import KEY_ID_PATTERN, InvalidInput, KeyRecordCorrupt
from service.keys.kek import Sealer
from service.keys.redis import as_text
from service.settings import MODEL_NAME_MAX_CHARS

KEY_ID_PREFIX: Final = "pmk_"
DEFAULT_TENANT: Final = "default"
DEFAULT_CONTEXT_WIDTH: Final = 4
CONTEXT_WIDTH_MIN: Final = 1  # keyed.KeyedSource takes m in [1, MAX_CONTEXT_WIDTH]
CONTEXT_WIDTH_MAX: Final = MAX_CONTEXT_WIDTH
TOKENIZER_MAX_CHARS: Final = 256
MODEL_MAX_CHARS: Final = MODEL_NAME_MAX_CHARS
UNKNOWN_MODEL: Final = "unknown"
"""How a record without a model name shows it to people (JSON shows null)."""
TENANT_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_RECORD_FIELDS: Final = (
    "key_id",
    "secret",
    "context_width",
    "masking",
    "prf_version",
    "tokenizer",
    "created_at",
    "revoked",
    "tenant",
)


def new_key_id() -> str:
    """A fresh key id: ``"pmk_"`` + 16 hex digits (64 random bits)."""
    return KEY_ID_PREFIX + secrets.token_hex(8)


def utc_now_iso() -> str:
    """Now as ISO-8601 UTC with microseconds, e.g. ``2025-01-02T03:04:05.000006+00:00``."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def check_tenant(tenant: object) -> str:
    """``tenant`` if it is a valid tenant name, else ``InvalidInput``."""
    if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
        raise InvalidInput(
            "tenant",
            "expected 1..64 characters from [A-Za-z0-9_.-] starting with a letter or digit, "
            f"got {tenant!r:.80}",
        )
    return tenant


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_utc_timestamp(value: object) -> bool:
    try:
        return datetime.fromisoformat(value).utcoffset() == timedelta(0)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True)
class KeyRecord:
    """One watermark key: its secret and the parameters every use of it must follow.

    Raises ``InvalidInput`` (a ``ValueError``) naming the field and its limit when a value does
    not validate. The secret is excluded from ``repr`` (and ``Secret`` prints a placeholder
    anyway); ``public()`` is the view that may leave the process.
    """

    key_id: str
    secret: Secret = field(repr=False)
    context_width: int = DEFAULT_CONTEXT_WIDTH
    masking: bool = True
    prf_version: int = PRF_VERSION
    tokenizer: str
    model: str | None = None
    created_at: str = field(default_factory=utc_now_iso)
    revoked: bool = False
    tenant: str = DEFAULT_TENANT

    def __post_init__(self) -> None:
        if not isinstance(self.key_id, str) or not KEY_ID_PATTERN.fullmatch(self.key_id):
            raise InvalidInput(
                "key_id",
                f"expected {KEY_ID_PREFIX!r} followed by 16 lowercase hex digits, "
                f"got {self.key_id!r:.40}",
            )
        if not isinstance(self.secret, Secret):
            raise InvalidInput(
                "secret", f"expected a keyed.prf.Secret, got {type(self.secret).__name__}"
            )
        if not _is_int(self.context_width) or not (
            CONTEXT_WIDTH_MIN <= self.context_width <= CONTEXT_WIDTH_MAX
        ):
            raise InvalidInput(
                "context_width",
                f"expected an integer in [{CONTEXT_WIDTH_MIN}, {CONTEXT_WIDTH_MAX}], "
                f"got {self.context_width!r}",
            )
        if not _is_int(self.prf_version) or self.prf_version < 1:
            raise InvalidInput("prf_version", f"expected an integer >= 1, got {self.prf_version!r}")
        if (
            not isinstance(self.tokenizer, str)
            or not 1 <= len(self.tokenizer) <= TOKENIZER_MAX_CHARS
            or not self.tokenizer.isprintable()
        ):
            raise InvalidInput(
                "tokenizer",
                f"expected a printable fingerprint of 1..{TOKENIZER_MAX_CHARS} characters, "
                f"got {self.tokenizer!r:.80}",
            )
        if self.model is not None and (
            not isinstance(self.model, str)
            or not 1 <= len(self.model) <= MODEL_MAX_CHARS
            or not self.model.isprintable()
        ):
            raise InvalidInput(
                "model",
                f"expected a printable model name of 1..{MODEL_MAX_CHARS} characters or None, "
                f"got {self.model!r:.80}",
            )
        if not _is_utc_timestamp(self.created_at):
            raise InvalidInput(
                "created_at", f"expected an ISO-8601 UTC timestamp, got {self.created_at!r:.60}"
            )
        for flag in ("masking", "revoked"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidInput(flag, f"expected a bool, got {getattr(self, flag)!r}")
        check_tenant(self.tenant)

    @property
    def model_shown(self) -> str:
        """``model``, or ``UNKNOWN_MODEL`` for a record that names none."""
        return self.model or UNKNOWN_MODEL

    @property
    def created(self) -> datetime:
        """``created_at`` as an aware UTC datetime."""
        return datetime.fromisoformat(self.created_at)

    def source(self, nonce: int) -> KeyedSource:
        """The keyed source of this record for one request: its secret, m, masking and ``nonce``.

        Raises ``InvalidInput`` when ``nonce`` is outside [0, 2^64).
        """
        if not _is_int(nonce) or not 0 <= nonce < 2**64:
            raise InvalidInput("nonce", f"expected an integer in [0, 2^64), got {nonce!r}")
        return KeyedSource(
            secret=self.secret,
            context_width=self.context_width,
            masking=self.masking,
            nonce=nonce,
            prf_version=self.prf_version,
        )

    def public(self) -> dict[str, str | int | bool | None]:
        """Everything but the secret: the view a response, a log line or a CLI table may show."""
        return {
            "key_id": self.key_id,
            "context_width": self.context_width,
            "masking": self.masking,
            "prf_version": self.prf_version,
            "tokenizer": self.tokenizer,
            "model": self.model,
            "created_at": self.created_at,
            "revoked": self.revoked,
            "tenant": self.tenant,
        }


def created_score(record: KeyRecord) -> int:
    """``created_at`` as integer µs since the epoch: the key's score in ``S order`` (exact in
    a Redis score, a float64, until the year 2255)."""
    return (record.created - _EPOCH) // timedelta(microseconds=1)


# --- The Redis hash of a record ---------------------------------------------------------------


BOUND_FIELDS: Final = ("tenant", "context_width", "masking", "prf_version", "tokenizer")
"""The hash fields the sealed secret is bound to (its AEAD associated data, with the key id):
who owns the key and how detection uses it. ``revoked`` and ``created_at`` are not bound
(revocation changes a record in place), nor ``model``: a name for people, which records
sealed without it must keep reading (the bound fingerprint is what refuses another tokenizer)."""


def bound_values(fields: Mapping[str, Any]) -> dict[str, str]:
    """``BOUND_FIELDS`` of a record's hash, as stored (text)."""
    return {name: as_text(fields[name]) for name in BOUND_FIELDS}


def encode_record(record: KeyRecord, sealer: Sealer) -> dict[FieldT, EncodableT]:
    """The record's Redis hash: flags "0"/"1", the secret sealed (never stored in clear) and
    bound to the key id and ``BOUND_FIELDS``; ``model`` only when the record names one."""
    fields: dict[str, str] = {
        "key_id": record.key_id,
        "context_width": str(record.context_width),
        "masking": "1" if record.masking else "0",
        "prf_version": str(record.prf_version),
        "tokenizer": record.tokenizer,
        "created_at": record.created_at,
        "revoked": "1" if record.revoked else "0",
        "tenant": record.tenant,
    }
    if record.model is not None:
        fields["model"] = record.model
    encoded: dict[FieldT, EncodableT] = {
        "secret": sealer.seal(record.key_id, record.secret, bound_values(fields))
    }
    encoded.update(fields)
    return encoded


def record_fields(key_id: str, raw: Mapping[Any, Any]) -> dict[str, str]:
    """The hash read back as text, checked for every field and its flags.

    Raises:
        KeyRecordCorrupt: a field missing, a flag not "0"/"1", or another record's id.
    """
    fields = {as_text(name): as_text(value) for name, value in raw.items()}
    missing = [name for name in _RECORD_FIELDS if name not in fields]
    if missing:
        raise KeyRecordCorrupt(key_id, f"missing field(s) {', '.join(missing)}")
    for flag in ("masking", "revoked"):
        if fields[flag] not in ("0", "1"):
            raise KeyRecordCorrupt(key_id, f"{flag}: expected '0' or '1'")
    if fields["key_id"] != key_id:
        raise KeyRecordCorrupt(key_id, "key_id field does not match the record's Redis key")
    return fields


def decode_record(key_id: str, fields: dict[str, str], sealer: Sealer) -> KeyRecord:
    """The record of checked ``fields`` (``record_fields``), its secret unsealed.

    Raises:
        KeyRecordCorrupt: a value out of its limits. KeyDecryptionFailed: from the sealer
            (also when the record's tenant or a parameter is not the one it was sealed with).
    """
    try:
        context_width = int(fields["context_width"])
        prf_version = int(fields["prf_version"])
    except ValueError:
        raise KeyRecordCorrupt(key_id, "context_width/prf_version: not integers") from None
    secret = sealer.unseal(key_id, fields["secret"], bound_values(fields))
    try:
        return KeyRecord(
            key_id=key_id,
            secret=secret,
            context_width=context_width,
            masking=fields["masking"] == "1",
            prf_version=prf_version,
            tokenizer=fields["tokenizer"],
            model=fields.get("model"),
            created_at=fields["created_at"],
            revoked=fields["revoked"] == "1",
            tenant=fields["tenant"],
        )
    except InvalidInput as exc:
        raise KeyRecordCorrupt(key_id, str(exc)) from None
