"""The key-encryption key (KEK): where it comes from, sealing secrets under it (docs/design.md §5).

Glossary:
- **KEK**: 32 bytes; ``Settings.kek`` (a managed secret) when set, else the file
  ``<data dir>/kek`` (mode 0600) that ``load_or_create_kek`` generates on first use.
- **KEK id**: ``"kek_"`` + 16 hex digits of HMAC-SHA256(KEK, a fixed label): names a KEK
  without revealing it, so a sealed secret says which KEK sealed it.
- **current / previous KEK**: seals are made under the current KEK only; a previous KEK
  (``Settings.kek_previous``, during a rotation) still opens what it sealed.
- **sealed secret**: ``"v3:" + KEK id + ":" + base64(nonce ‖ AES-256-GCM(KEK, nonce, secret,
  aad))`` with a fresh random 12-byte nonce. The associated data (``associated_data``) binds
  the key id, the KEK id and the record's bound fields — its tenant and the parameters
  detection uses (context width, masking, PRF version, tokenizer) — so a ciphertext copied
  into another record, a record moved to another tenant or a parameter changed in Redis does
  not decrypt. The key store keeps secrets only in this form.
- **v2 seal**: the same without the KEK id (``"v2:"``); opened with whichever configured KEK
  opens it. **v1 seal**: the earliest form, ``"v1:"`` with the key id alone as associated
  data; never unsealed for use (a v1 record could be moved to another tenant unnoticed). The
  key store re-seals v1, v2 and other KEKs' v3 records as v3 under the current KEK
  (``KeyStore.reseal``, run at service start and by ``poissonmark keys reseal``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from keyed.prf import SECRET_BYTES, Secret
from service.errors import InvalidInput, KekFileError, KeyDecryptionFailed

KEK_BYTES: Final = 32
KEK_FILENAME: Final = "kek"

_SEALED_VERSION: Final = "v3:"
_SEALED_V2: Final = "v2:"
_SEALED_V1: Final = "v1:"
_AAD_TAGS: Final = {
    _SEALED_VERSION: b"poissonmark sealed key v3\x00",
    _SEALED_V2: b"poissonmark sealed key v2\x00",
}
_KEK_ID_LABEL: Final = b"poissonmark kek id v1"
KEK_ID_PATTERN: Final = re.compile(r"kek_[0-9a-f]{16}")
_NONCE_BYTES: Final = 12
_TAG_BYTES: Final = 16


def _check_kek(kek: object, name: str) -> bytes:
    if not isinstance(kek, bytes | bytearray) or len(kek) != KEK_BYTES:
        size = len(kek) if isinstance(kek, bytes | bytearray) else type(kek).__name__
        raise InvalidInput(name, f"expected {KEK_BYTES} bytes, got {size}")
    return bytes(kek)


def kek_id(kek: bytes) -> str:
    """The KEK's public name (module docstring).

    Raises:
        InvalidInput: a KEK that is not 32 bytes.
    """
    mac = hmac.new(_check_kek(kek, "kek"), _KEK_ID_LABEL, hashlib.sha256).hexdigest()
    return "kek_" + mac[:16]


class Sealer:
    """Seals key secrets under the current KEK and unseals them under it or a previous one
    (module docstring: the sealed forms).

    Args:
        kek: the current KEK (32 bytes).
        previous: KEKs that may have sealed stored secrets (a rotation under way).
    Raises:
        InvalidInput: a KEK that is not 32 bytes.
    """

    def __init__(self, kek: bytes, previous: Sequence[bytes] = ()) -> None:
        current = _check_kek(kek, "kek")
        self.kek_id = kek_id(current)
        self._aeads = {self.kek_id: AESGCM(current)}  # current first
        for old in previous:
            self._aeads.setdefault(kek_id(_check_kek(old, "kek_previous")), AESGCM(bytes(old)))

    def __repr__(self) -> str:
        return f"Sealer(<kek {self.kek_id}>, {len(self._aeads) - 1} previous)"

    def seal(self, key_id: str, secret: Secret, bound: Mapping[str, str]) -> str:
        """The v3 sealed form of ``secret`` under the current KEK (module docstring), bound to
        ``key_id``, the KEK id and ``bound`` (field name -> the value as stored)."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        aad = associated_data(key_id, bound, self.kek_id)
        sealed = nonce + self._aeads[self.kek_id].encrypt(nonce, secret.reveal(), aad)
        return f"{_SEALED_VERSION}{self.kek_id}:{base64.b64encode(sealed).decode('ascii')}"

    def is_current(self, stored: str) -> bool:
        """Whether ``stored`` is a v3 seal of the current KEK (nothing to re-seal)."""
        return stored.startswith(f"{_SEALED_VERSION}{self.kek_id}:")

    def sealed_by(self, stored: str) -> str | None:
        """The KEK id a v3 seal names (None for other forms)."""
        if not stored.startswith(_SEALED_VERSION):
            return None
        named = stored[len(_SEALED_VERSION) :].split(":", 1)[0]
        return named if KEK_ID_PATTERN.fullmatch(named) else None

    def unseal(self, key_id: str, stored: str, bound: Mapping[str, str]) -> Secret:
        """The secret of a v3 (or v2) seal made with the same ``key_id`` and ``bound``, under
        the current or a previous KEK.

        Raises:
            KeyDecryptionFailed: a KEK that is not configured, a tampered, moved or changed
                record, a v1 seal (re-seal it first: ``KeyStore.reseal``), or not sealed at all.
        """
        if stored.startswith(_SEALED_V1):
            raise KeyDecryptionFailed(
                key_id,
                "sealed in the v1 form, which binds only the key id; re-seal the store's "
                "records (`poissonmark keys reseal`, also run when the service starts)",
            )
        if stored.startswith(_SEALED_V2):
            return self._open_any(key_id, stored, _SEALED_V2, associated_data(key_id, bound))
        sealer = self.sealed_by(stored)
        if sealer is None:
            raise KeyDecryptionFailed(
                key_id, f"unknown sealed-secret format (expected {_SEALED_VERSION!r})"
            )
        aead = self._aeads.get(sealer)
        if aead is None:
            raise KeyDecryptionFailed(
                key_id,
                f"sealed under {sealer}, which is neither the current KEK ({self.kek_id}) "
                "nor a previous one (POISSONMARK_KEK_PREVIOUS)",
            )
        nonce, ciphertext = _split(key_id, stored[len(_SEALED_VERSION) + len(sealer) + 1 :])
        return _decrypt(key_id, aead, nonce, ciphertext, associated_data(key_id, bound, sealer))

    def unseal_v1(self, key_id: str, stored: str) -> Secret:
        """The secret of a v1 seal (the key id alone as associated data), to re-seal it.

        Raises:
            KeyDecryptionFailed: as ``unseal``.
        """
        return self._open_any(key_id, stored, _SEALED_V1, key_id.encode("ascii"))

    def _open_any(self, key_id: str, stored: str, version: str, aad: bytes) -> Secret:
        """A seal that names no KEK: the first configured KEK that opens it."""
        if not stored.startswith(version):
            raise KeyDecryptionFailed(
                key_id, f"unknown sealed-secret format (expected {version!r})"
            )
        nonce, ciphertext = _split(key_id, stored[len(version) :])
        for aead in self._aeads.values():
            with contextlib.suppress(KeyDecryptionFailed):
                return _decrypt(key_id, aead, nonce, ciphertext, aad)
        raise KeyDecryptionFailed(key_id)


def _split(key_id: str, encoded: str) -> tuple[bytes, bytes]:
    """(nonce, ciphertext ‖ tag) of a seal's base64 part."""
    try:
        sealed = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise KeyDecryptionFailed(key_id, "sealed secret is not valid base64") from None
    if len(sealed) != _NONCE_BYTES + SECRET_BYTES + _TAG_BYTES:
        raise KeyDecryptionFailed(key_id, "sealed secret has the wrong length")
    return sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]


def _decrypt(key_id: str, aead: AESGCM, nonce: bytes, ciphertext: bytes, aad: bytes) -> Secret:
    try:
        material = aead.decrypt(nonce, ciphertext, aad)
    except InvalidTag:
        raise KeyDecryptionFailed(key_id) from None
    return Secret(material)


def is_v1_seal(stored: str) -> bool:
    """Whether ``stored`` is a v1 seal (to be re-sealed)."""
    return stored.startswith(_SEALED_V1)


def associated_data(key_id: str, bound: Mapping[str, str], sealer: str | None = None) -> bytes:
    """The AEAD associated data of a v3 seal made by the KEK ``sealer`` (None: of a v2 seal):
    a domain tag, then ``key_id``, the KEK id and ``bound`` as canonical JSON (sorted names,
    no spaces, ASCII), so every (id, KEK, fields) triple has one encoding and no other shares
    it.

    Raises:
        InvalidInput: ``bound`` names ``key_id`` or ``kek_id``, or holds a value that is not a
            string.
    """
    if (
        "key_id" in bound
        or "kek_id" in bound
        or not all(isinstance(v, str) for v in bound.values())
    ):
        raise InvalidInput(
            "bound", "expected field names other than key_id and kek_id, string values"
        )
    fields = {"key_id": key_id, **bound}
    tag = _AAD_TAGS[_SEALED_V2]
    if sealer is not None:
        fields["kek_id"] = sealer
        tag = _AAD_TAGS[_SEALED_VERSION]
    return tag + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("ascii")


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
