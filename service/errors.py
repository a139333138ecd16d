"""Domain exceptions of the service layer (DESIGN §5, STYLE 12).

Every message is safe to show a caller or write to a log: it may name a key id, a tenant, a
file path or a Redis location, never key material, a key-encryption key or a password. The
HTTP mapping (status + problem type per class) lives here too once the app exists; library
code raises these classes and never builds HTTP errors itself.

Exceptions keep their constructor arguments in ``args`` (so they pickle across processes) and
build the message in ``__str__``.
"""

from __future__ import annotations

import re
from typing import Final

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
        return f"unknown key id {shown_key_id(self.key_id)}"


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
    ``service.keystore.redact_url``).
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
