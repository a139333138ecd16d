"""The key store: watermark key records in Redis, secrets sealed with AES-GCM (DESIGN §2, §5).

Glossary:
- **key record**: one watermark key — id, secret, and the parameters detection must reuse
  (context width m, repeated-context masking, ``PRF_VERSION``, tokenizer fingerprint).
- **KEK**, **sealed secret**: the key-encryption key and the only form a secret is stored in
  (``service.kek``: AES-256-GCM with the key id as associated data).
- **tenant**: the owner of a key; a caller bound to one tenant never sees another's keys
  (a foreign key id is reported exactly like an absent one).

Redis layout under a prefix P (default ``"pm:"``), for two scopes S — every key (``S = P``)
and one tenant's (``S = P tenant:<t>:``):
- ``P key:<id>``: hash of one record (fields of ``KeyRecord``, secret sealed, flags "0"/"1").
- ``S keys``: set of the scope's key ids (the first layout; still written).
- ``S order``: sorted set of the ids by creation time (score: ``created_at`` in µs since the
  epoch; ties by id), the listing's stable order. ``S ids``: the ids at score 0, for the
  key-id prefix search (lexicographic range). ``S revoked``: the revoked ids.
- ``S indexed``: "1" once the sorted sets and the revoked set were built from ``S keys`` for
  a store written before they existed (``_ensure_indexed``, once per scope).
A record and every index entry are written, changed and removed in one MULTI/EXEC, so a key
is never half written or half deleted.

Listing pages through ``S order`` (or ``S ids`` with a prefix) after a cursor that holds the
last (score, id) shown (``CURSOR_PATTERN``; opaque to clients): a key present for the whole
listing is shown exactly once whatever is created or deleted meanwhile; a key created
meanwhile may or may not appear.

Deleting a key removes its record (the sealed secret with it) and every index entry: the key
is then unknown everywhere, and text it watermarked can no longer be tested with it. Redis
may keep the sealed bytes in an AOF or RDB file until its next rewrite.

The Redis client comes from ``service.redis.open_redis``.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import redis
from redis.typing import EncodableT, FieldT

from keyed.context import MAX_CONTEXT_WIDTH, KeyedSource
from keyed.prf import PRF_VERSION, SECRET_BYTES, Secret
from service.errors import (
    KEY_ID_PATTERN,
    InvalidInput,
    KeyRecordCorrupt,
    KeyRevoked,
    KeyStoreUnavailable,
    UnknownKey,
)
from service.kek import Sealer
from service.redis import as_text, describe_client, reaching_redis

KEY_ID_PREFIX: Final = "pmk_"
DEFAULT_PREFIX: Final = "pm:"
DEFAULT_TENANT: Final = "default"
DEFAULT_CONTEXT_WIDTH: Final = 4
CONTEXT_WIDTH_MIN: Final = 1  # keyed.KeyedSource takes m in [1, MAX_CONTEXT_WIDTH]
CONTEXT_WIDTH_MAX: Final = MAX_CONTEXT_WIDTH
TOKENIZER_MAX_CHARS: Final = 256
TENANT_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

_WRITE_ATTEMPTS: Final = 5
PAGE_DEFAULT: Final = 100
PAGE_MAX: Final = 1000
KEY_PREFIX_MAX_CHARS: Final = 20  # "pmk_" + 16 hex digits
CURSOR_PATTERN: Final = r"(0|[1-9][0-9]{0,17})-(pmk_[0-9a-f]{16})"
"""A cursor: the (score, id) position of the last key shown, ``<µs>-<key id>``. Any string of
this form is a valid position (keys after it), so the schema's pattern is the whole contract;
clients treat it as opaque."""
_CURSOR: Final = re.compile(CURSOR_PATTERN)
_PREFIX_PATTERN: Final = re.compile(r"[a-z0-9_]{1,20}")
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
        if not _is_utc_timestamp(self.created_at):
            raise InvalidInput(
                "created_at", f"expected an ISO-8601 UTC timestamp, got {self.created_at!r:.60}"
            )
        for flag in ("masking", "revoked"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidInput(flag, f"expected a bool, got {getattr(self, flag)!r}")
        check_tenant(self.tenant)

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


def created_score(record: KeyRecord) -> int:
    """``created_at`` as integer µs since the epoch: the key's score in ``S order`` (exact in
    a Redis score, a float64, until the year 2255)."""
    return (record.created - _EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class KeyPage:
    """One page of a listing.

    Attributes:
        records: the page's keys in the listing's order (creation order; key-id order with a
            prefix). May hold fewer than the limit — even none, when revoked keys are left out
            — while ``next_cursor`` is set.
        next_cursor: the opaque cursor of the next page, or None after the last one.
    """

    records: list[KeyRecord]
    next_cursor: str | None


def _parse_cursor(cursor: str) -> tuple[int, str]:
    """(score, key id) of a cursor, or ``InvalidInput`` for anything not of its form."""
    match = _CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise InvalidInput("cursor", "expected a next_cursor from a previous page")
    return int(match.group(1)), match.group(2)


# --- The store -----------------------------------------------------------------------------


class KeyStore:
    """Key records in Redis, secrets sealed under a KEK (module docstring: layout, sealing).

    Args:
        client: any ``redis.Redis`` (``decode_responses`` either way); the store does not
            own it — whoever opened it closes it.
        kek: the 32-byte key-encryption key.
        prefix: namespace of every Redis key the store touches.
    Raises:
        InvalidInput: a KEK that is not 32 bytes, or an empty prefix.

    Every method turns Redis failures into ``KeyStoreUnavailable`` (location with no password).
    """

    def __init__(self, client: redis.Redis, kek: bytes, prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise InvalidInput("prefix", f"expected a non-empty string, got {prefix!r}")
        self._client = client
        self._sealer = Sealer(kek)
        self._prefix = prefix
        self._where = describe_client(client)
        self._indexed: set[str] = set()  # scopes whose sorted indexes are known to exist

    def __repr__(self) -> str:
        return f"KeyStore({self._where}, prefix={self._prefix!r})"

    # Redis keys
    def _record_key(self, key_id: str) -> str:
        return f"{self._prefix}key:{key_id}"

    def _all_keys(self) -> str:
        return f"{self._prefix}keys"

    def _tenant_keys(self, tenant: str) -> str:
        return f"{self._prefix}tenant:{tenant}:keys"

    def _scopes(self, tenant: str) -> tuple[str, str]:
        """The index prefixes a key of ``tenant`` belongs to: every key's, the tenant's."""
        return self._prefix, self._scope(tenant)

    def _scope(self, tenant: str | None) -> str:
        return self._prefix if tenant is None else f"{self._prefix}tenant:{tenant}:"

    def ping(self) -> None:
        """Raise ``KeyStoreUnavailable`` unless Redis answers (for readiness checks)."""
        with reaching_redis(self._client):
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
            InvalidInput: a parameter out of its limits (checked before Redis is touched).
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
        with reaching_redis(self._client):
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
                pipe.watch(key)  # type: ignore[no-untyped-call]
                if pipe.exists(key):
                    return False
                pipe.multi()
                pipe.hset(key, mapping=self._encode(record))
                for scope in self._scopes(record.tenant):
                    pipe.sadd(f"{scope}keys", record.key_id)
                    pipe.zadd(f"{scope}order", {record.key_id: created_score(record)})
                    pipe.zadd(f"{scope}ids", {record.key_id: 0})
                    if record.revoked:
                        pipe.sadd(f"{scope}revoked", record.key_id)
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
            check_tenant(tenant)
        if not isinstance(key_id, str) or not KEY_ID_PATTERN.fullmatch(key_id):
            raise UnknownKey(key_id)
        with reaching_redis(self._client):
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

    def list_keys(self, tenant: str | None = None, include_revoked: bool = True) -> list[KeyRecord]:
        """Records of one tenant (or all tenants when ``tenant`` is None), oldest first."""
        if tenant is not None:
            check_tenant(tenant)
        members = self._all_keys() if tenant is None else self._tenant_keys(tenant)
        with reaching_redis(self._client):
            key_ids = sorted(as_text(member) for member in self._client.smembers(members))
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
            with reaching_redis(self._client), self._client.pipeline(transaction=True) as pipe:
                try:
                    # WATCH + EXISTS: never create a stray one-field hash if the record vanished.
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    if not pipe.exists(key):
                        raise UnknownKey(key_id)
                    pipe.multi()
                    pipe.hset(key, "revoked", "1")
                    for scope in self._scopes(record.tenant):
                        pipe.sadd(f"{scope}revoked", key_id)
                    pipe.execute()
                except redis.WatchError:
                    continue  # changed under us (e.g. a concurrent revoke): read again
            return dataclasses.replace(record, revoked=True)
        raise KeyStoreUnavailable(self._where, "the record kept changing during revoke")

    def delete(self, key_id: str, tenant: str | None = None) -> KeyRecord:
        """Delete a key for good: its record (the sealed secret with it) and every index entry,
        in one transaction. Returns the record as it was (for the audit log: ``public()``).

        Afterwards the key is unknown to ``get``, listings and detection; text it watermarked
        can no longer be tested with it (nothing can recreate the secret).

        Raises:
            UnknownKey: no such key, or another tenant's (which then stays untouched).
        """
        key = self._record_key(key_id)
        for _ in range(_WRITE_ATTEMPTS):
            record = self.get(key_id, tenant)
            with reaching_redis(self._client), self._client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    if not pipe.exists(key):
                        raise UnknownKey(key_id)  # deleted concurrently
                    pipe.multi()
                    pipe.delete(key)
                    for scope in self._scopes(record.tenant):
                        for index in ("keys", "revoked"):
                            pipe.srem(f"{scope}{index}", key_id)
                        for index in ("order", "ids"):
                            pipe.zrem(f"{scope}{index}", key_id)
                    pipe.execute()
                except redis.WatchError:
                    continue  # revoked (or deleted) under us: read again
            return record
        raise KeyStoreUnavailable(self._where, "the record kept changing during delete")

    def list_page(
        self,
        tenant: str | None = None,
        *,
        limit: int = PAGE_DEFAULT,
        cursor: str | None = None,
        include_revoked: bool = True,
        prefix: str | None = None,
    ) -> KeyPage:
        """One page of the keys of ``tenant`` (every tenant's when None).

        Args:
            limit: index entries examined, 1..``PAGE_MAX``; the page holds at most this many.
            cursor: ``next_cursor`` of the previous page; None for the first.
            include_revoked: False leaves revoked keys out (the page may then be short).
            prefix: only key ids starting with it (e.g. ``"pmk_3f"``), in key-id order.
        Raises:
            InvalidInput: a limit, cursor or prefix out of bounds.
            KeyStoreUnavailable, KeyRecordCorrupt, KeyDecryptionFailed.
        """
        if tenant is not None:
            check_tenant(tenant)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE_MAX:
            raise InvalidInput("limit", f"expected an integer in [1, {PAGE_MAX}], got {limit!r}")
        if prefix is not None and not _PREFIX_PATTERN.fullmatch(prefix):
            raise InvalidInput(
                "prefix",
                f"expected 1..{KEY_PREFIX_MAX_CHARS} characters from [a-z0-9_], got {prefix!r:.40}",
            )
        after = None if cursor is None else _parse_cursor(cursor)
        scope = self._scope(tenant)
        with reaching_redis(self._client):
            self._ensure_indexed(scope)
            if prefix is None:
                entries = self._after_in_order(scope, after, limit + 1)
            else:
                # ids are [a-z0-9_]: "~" sorts after all of them, so "[prefix~" ends the range
                low = f"[{prefix}" if after is None else f"({after[1]}"
                members = self._client.zrangebylex(
                    f"{scope}ids", low, f"[{prefix}~", start=0, num=limit + 1
                )
                entries = [(as_text(m), 0) for m in members if as_text(m).startswith(prefix)]
            shown = entries[:limit]
            records = self._records([key_id for key_id, _ in shown], tenant)
            next_cursor = None
            if len(entries) > limit:
                key_id, score = shown[-1]
                if prefix is not None:  # key-id order: the id is the position; keep the score
                    score = int(self._client.zscore(f"{scope}order", key_id) or 0)
                next_cursor = f"{score}-{key_id}"
        if not include_revoked:
            records = [r for r in records if not r.revoked]
        return KeyPage(records, next_cursor)

    def _after_in_order(
        self, scope: str, after: tuple[int, str] | None, count: int
    ) -> list[tuple[str, int]]:
        """Up to ``count`` (id, score) of ``S order`` after the cursor's (score, id)."""
        key = f"{scope}order"
        if after is None:
            rows: list[Any] = self._client.zrange(key, 0, count - 1, withscores=True)
            return [(as_text(row[0]), int(row[1])) for row in rows]
        last_score, last_id = after
        # Entries at the cursor's score come first, in id order: skip those up to its id.
        ties = int(self._client.zcount(key, last_score, last_score))
        rows = list(
            self._client.zrangebyscore(
                key, last_score, "+inf", start=0, num=count + ties, withscores=True
            )
        )
        later: list[tuple[str, int]] = []
        for member, score in rows:
            key_id, at = as_text(member), int(score)
            if at > last_score or key_id > last_id:
                later.append((key_id, at))
        return later[:count]

    def _records(self, key_ids: Sequence[str], tenant: str | None) -> list[KeyRecord]:
        """The records of ``key_ids`` in that order (one pipeline), skipping ids whose record
        is gone (deleted since the index was read) or, with ``tenant``, another tenant's."""
        pipe = self._client.pipeline(transaction=False)
        for key_id in key_ids:
            pipe.hgetall(self._record_key(key_id))
        records = []
        for key_id, raw in zip(key_ids, pipe.execute(), strict=True):
            if not raw:
                continue
            fields = self._fields(key_id, raw)
            if tenant is not None and fields["tenant"] != tenant:
                continue
            records.append(self._decode(key_id, fields))
        return records

    def candidate_ids(self, tenant: str | None, include_revoked: bool) -> list[str]:
        """Every key id of ``tenant`` (every tenant's when None) in creation order, revoked ones
        only with ``include_revoked``: two reads of the index, no record (detection caches
        records by id and asks for these each time, so a created, revoked or deleted key is
        seen at once)."""
        if tenant is not None:
            check_tenant(tenant)
        scope = self._scope(tenant)
        with reaching_redis(self._client):
            self._ensure_indexed(scope)
            pipe = self._client.pipeline(transaction=False)
            pipe.zrange(f"{scope}order", 0, -1)
            pipe.smembers(f"{scope}revoked")
            ordered, revoked = pipe.execute()
        ids = [as_text(m) for m in ordered]
        if include_revoked:
            return ids
        gone = {as_text(m) for m in revoked}
        return [key_id for key_id in ids if key_id not in gone]

    def get_many(self, key_ids: Sequence[str], tenant: str | None = None) -> list[KeyRecord]:
        """The records of ``key_ids``, in that order, in one round trip; ids that are absent
        (or another tenant's, with ``tenant``) are left out."""
        with reaching_redis(self._client):
            return self._records(key_ids, tenant)

    def _ensure_indexed(self, scope: str) -> None:
        """Build ``S order``, ``S ids`` and ``S revoked`` from ``S keys`` once, for keys written
        before those indexes existed (idempotent; creates and revokes write them anyway)."""
        if scope in self._indexed:
            return
        if not self._client.exists(f"{scope}indexed"):
            key_ids = sorted(as_text(m) for m in self._client.smembers(f"{scope}keys"))
            pipe = self._client.pipeline(transaction=False)
            for key_id in key_ids:
                pipe.hmget(self._record_key(key_id), ["created_at", "revoked"])
            rows = pipe.execute()
            pipe = self._client.pipeline(transaction=False)
            for key_id, (created_at, revoked) in zip(key_ids, rows, strict=True):
                if created_at is None:
                    continue  # deleted meanwhile
                when = datetime.fromisoformat(as_text(created_at))
                pipe.zadd(
                    f"{scope}order", {key_id: (when - _EPOCH) // timedelta(microseconds=1)}, nx=True
                )
                pipe.zadd(f"{scope}ids", {key_id: 0}, nx=True)
                if revoked is not None and as_text(revoked) == "1":
                    pipe.sadd(f"{scope}revoked", key_id)
            pipe.set(f"{scope}indexed", "1")
            pipe.execute()
        self._indexed.add(scope)

    # Encoding and sealing
    def _encode(self, record: KeyRecord) -> dict[FieldT, EncodableT]:
        return {
            "key_id": record.key_id,
            "secret": self._sealer.seal(record.key_id, record.secret),
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

    def _decode(self, key_id: str, fields: dict[str, str]) -> KeyRecord:
        try:
            context_width = int(fields["context_width"])
            prf_version = int(fields["prf_version"])
        except ValueError:
            raise KeyRecordCorrupt(key_id, "context_width/prf_version: not integers") from None
        secret = self._sealer.unseal(key_id, fields["secret"])
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
        except InvalidInput as exc:
            raise KeyRecordCorrupt(key_id, str(exc)) from None
