"""The key-encryption key (KEK): where it comes from, sealing secrets under it (docs/design.md §5).

Glossary:
- **KEK**: 32 bytes; ``Settings.kek`` (a managed secret) when set, else the file
  ``<data dir>/kek`` (mode 0600) that ``load_or_create_kek`` generates on first use.
- **sealed secret**: ``"v2:" + base64(nonce ‖ AES-256-GCM(KEK, nonce, secret, aad))`` with a
  fresh random 12-byte nonce. The associated data (``associated_data``) binds the key id and
  the record's bound fields — its tenant and the parameters detection uses (context width,
  masking, PRF version, tokenizer) — so a ciphertext copied into another record, a record
  moved to another tenant or a parameter changed in Redis does not decrypt. The key store
  keeps secrets only in this form.
- **v1 seal**: the earlier form, ``"v1:"`` with the key id alone as associated data. It is
  never unsealed for use (a v1 record could be moved to another tenant unnoticed); the key
  store re-seals such records as v2 (``KeyStore.reseal``, run at service start and by
  ``poissonmark keys reseal``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from keyed.prf import SECRET_BYTES, Secret
from service.errors import InvalidInput, KekFileError, KeyDecryptionFailed

KEK_BYTES: Final = 32
KEK_FILENAME: Final = "kek"

_SEALED_VERSION: Final = "v2:"
_SEALED_V1: Final = "v1:"
_AAD_TAG: Final = b"poissonmark sealed key v2\x00"
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

    def seal(self, key_id: str, secret: Secret, bound: Mapping[str, str]) -> str:
        """The v2 sealed form of ``secret`` (module docstring), bound to ``key_id`` and
        ``bound`` (field name -> the value as stored)."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        aad = associated_data(key_id, bound)
        sealed = nonce + self._aead.encrypt(nonce, secret.reveal(), aad)
        return _SEALED_VERSION + base64.b64encode(sealed).decode("ascii")

    def unseal(self, key_id: str, stored: str, bound: Mapping[str, str]) -> Secret:
        """The secret of a v2 seal made with the same ``key_id`` and ``bound``.

        Raises:
            KeyDecryptionFailed: another KEK, a tampered, moved or changed record, a v1 seal
                (re-seal it first: ``KeyStore.reseal``), or not sealed at all.
        """
        if stored.startswith(_SEALED_V1):
            raise KeyDecryptionFailed(
                key_id,
                "sealed in the v1 form, which binds only the key id; re-seal the store's "
                "records (`poissonmark keys reseal`, also run when the service starts)",
            )
        return self._open(key_id, stored, _SEALED_VERSION, associated_data(key_id, bound))

    def unseal_v1(self, key_id: str, stored: str) -> Secret:
        """The secret of a v1 seal (the key id alone as associated data), to re-seal it.

        Raises:
            KeyDecryptionFailed: as ``unseal``.
        """
        return self._open(key_id, stored, _SEALED_V1, key_id.encode("ascii"))

    def _open(self, key_id: str, stored: str, version: str, aad: bytes) -> Secret:
        if not stored.startswith(version):
            raise KeyDecryptionFailed(
                key_id, f"unknown sealed-secret format (expected {version!r})"
            )
        try:
            sealed = base64.b64decode(stored[len(version) :], validate=True)
        except binascii.Error:
            raise KeyDecryptionFailed(key_id, "sealed secret is not valid base64") from None
        if len(sealed) != _NONCE_BYTES + SECRET_BYTES + _TAG_BYTES:
            raise KeyDecryptionFailed(key_id, "sealed secret has the wrong length")
        nonce, ciphertext = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
        try:
            material = self._aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise KeyDecryptionFailed(key_id) from None
        return Secret(material)


def is_v1_seal(stored: str) -> bool:
    """Whether ``stored`` is a v1 seal (to be re-sealed)."""
    return stored.startswith(_SEALED_V1)


def associated_data(key_id: str, bound: Mapping[str, str]) -> bytes:
    """The AEAD associated data of a v2 seal: a domain tag, then ``key_id`` and ``bound`` as
    canonical JSON (sorted names, no spaces, ASCII), so every (id, fields) pair has one
    encoding and no other pair shares it.

    Raises:
        InvalidInput: ``bound`` names ``key_id``, or holds a value that is not a string.
    """
    if "key_id" in bound or not all(isinstance(v, str) for v in bound.values()):
        raise InvalidInput("bound", "expected field names other than key_id, string values")
    fields = {"key_id": key_id, **bound}
    return _AAD_TAG + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("ascii")


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
