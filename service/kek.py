"""The key-encryption key (KEK): where it comes from, sealing secrets under it (docs/design.md §5).

Glossary:
- **KEK**: 32 bytes; ``Settings.kek`` (a managed secret) when set, else the file
  ``<data dir>/kek`` (mode 0600) that ``load_or_create_kek`` generates on first use.
- **sealed secret**: ``"v1:" + base64(nonce ‖ AES-256-GCM(KEK, nonce, secret, aad=key id))``
  with a fresh random 12-byte nonce; the key id as associated data means a ciphertext copied
  into another record does not decrypt. The key store keeps secrets only in this form.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from keyed.prf import SECRET_BYTES, Secret
from service.errors import InvalidInput, KekFileError, KeyDecryptionFailed

KEK_BYTES: Final = 32
KEK_FILENAME: Final = "kek"

_SEALED_VERSION: Final = "v1:"
_NONCE_BYTES: Final = 12
_TAG_BYTES: Final = 16


class Sealer:
    """Seals and unseals key secrets under one KEK (module docstring: the sealed form).

    Raises:
        InvalidInput: a KEK that is not 32 bytes.
    """

    def __init__(self, kek: bytes) -> None:
        if not isinstance(kek, bytes | bytearray) or len(kek) != KEK_BYTES:
            size = len(kek) if isinstance(kek, bytes | bytearray) else type(kek).__name__
            raise InvalidInput("kek", f"expected {KEK_BYTES} bytes, got {size}")
        self._aead = AESGCM(bytes(kek))

    def __repr__(self) -> str:
        return "Sealer(<kek>)"

    def seal(self, key_id: str, secret: Secret) -> str:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = nonce + self._aead.encrypt(nonce, secret.reveal(), key_id.encode("ascii"))
        return _SEALED_VERSION + base64.b64encode(sealed).decode("ascii")

    def unseal(self, key_id: str, stored: str) -> Secret:
        """Raises ``KeyDecryptionFailed``: another KEK, a tampered record, or not sealed."""
        if not stored.startswith(_SEALED_VERSION):
            raise KeyDecryptionFailed(key_id, "unknown sealed-secret format (expected 'v1:')")
        try:
            sealed = base64.b64decode(stored[len(_SEALED_VERSION) :], validate=True)
        except binascii.Error:
            raise KeyDecryptionFailed(key_id, "sealed secret is not valid base64") from None
        if len(sealed) != _NONCE_BYTES + SECRET_BYTES + _TAG_BYTES:
            raise KeyDecryptionFailed(key_id, "sealed secret has the wrong length")
        nonce, ciphertext = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
        try:
            material = self._aead.decrypt(nonce, ciphertext, key_id.encode("ascii"))
        except InvalidTag:
            raise KeyDecryptionFailed(key_id) from None
        return Secret(material)


def load_or_create_kek(home: Path) -> bytes:
    """The KEK kept in ``home/kek`` (32 raw bytes, mode 0600), generated on first use.

    Creation is atomic: the key is written and fsynced to a private temp file, then
    hard-linked into place, so a concurrent caller sees either no file or the whole key, and
    every caller ends up with the same key.

    Raises:
        KekFileError: the file allows group/other access, is not a regular file (a symlink
            included), or does not hold exactly 32 bytes.
    """
    home = Path(home)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / KEK_FILENAME
    try:
        return _read_kek(path)
    except FileNotFoundError:
        pass
    tmp = home / f".{KEK_FILENAME}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(secrets.token_bytes(KEK_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process won the race: use its key
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(home)
    return _read_kek(path)


def _read_kek(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise KekFileError(str(path), f"cannot open ({exc.strerror}; a symlink?)") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise KekFileError(str(path), "not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise KekFileError(
                str(path),
                f"mode {mode:04o} allows group/other access; expected 0600 "
                f"(fix with: chmod 600 {path})",
            )
        data = handle.read(KEK_BYTES + 1)
    if len(data) != KEK_BYTES:
        raise KekFileError(str(path), f"expected {KEK_BYTES} bytes, found {len(data)}")
    return data


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
