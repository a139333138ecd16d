"""The key store: key records in Redis, secrets sealed with AES-GCM (docs/design.md §2, §5).

Glossary:
- **key record**: one watermark key — id, secret, and the parameters detection must reuse
  (context width m, repeated-context masking, ``PRF_VERSION``, tokenizer fingerprint), and the
  name of the model it was made for.
- **KEK**, **sealed secret**: the key-encryption key and the only form a secret is stored in
  (``service.keys.kek``: AES-256-GCM with the key id, the tenant and the key's parameters as
  associated data, and the id of the KEK that sealed it; ``reseal`` moves records of earlier
  forms, or sealed by a previous KEK, to the current KEK).
- **tenant**: the owner of a key; a caller bound to one tenant never sees another's keys
  (a foreign key id is reported exactly like an absent one).

Redis layout under a prefix P (default ``"pm:"``), for two scopes S — every key (``S = P``)
and one tenant's (``S = P tenant:<t>:``):
- ``P key:<id>``: hash of one record (``service.keys.record.encode_record``: fields of
  ``KeyRecord``, secret sealed, flags "0"/"1").
- ``S order``: sorted set of the ids by creation time (score: ``created_at`` in µs since the
  epoch; ties by id), the listing's stable order. ``S ids``: the ids at score 0, for the
  key-id prefix search (lexicographic range). ``S revoked``: the revoked ids.
A record and every index entry are written, changed and removed in one MULTI/EXEC, so a key
is never half written or half deleted.

Listing pages through ``S order`` (or ``S ids`` with a prefix) after a cursor that holds the
last (score, id) shown (``CURSOR_PATTERN``; opaque to clients): a key present for the whole
listing is shown exactly once whatever is created or deleted meanwhile; a key created
meanwhile may or may not appear.

Deleting a key removes its record (the sealed secret with it) and every index entry: the key
is then unknown everywhere, and text it watermarked can no longer be tested with it. Redis
may keep the sealed bytes in an AOF or RDB file until its next rewrite.

The Redis client comes from ``service.keys.redis.open_redis``.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Sequence
from typing import Any, Final

import redis

from keyed.prf import SECRET_BYTES, Secret
from service.errors import (
    KEY_ID_PATTERN,
    InvalidInput,
    KeyRevoked,
    KeyStoreUnavailable,
    QuotaExceeded,
    UnknownKey,
)
from service.keys.kek import Sealer
from service.keys.page import KeyPage, parse_cursor
from service.keys.record import (
    DEFAULT_CONTEXT_WIDTH,
    DEFAULT_TENANT,
    KeyRecord,
    check_tenant,
    created_score,
    decode_record,
    encode_record,
    new_key_id,
    record_fields,
)
from service.keys.redis import as_text, describe_client, reaching_redis
from service.keys.rotation import WRITE_ATTEMPTS, KekRotation

DEFAULT_PREFIX: Final = "pm:"

PAGE_DEFAULT: Final = 100
PAGE_MAX: Final = 1000
KEY_PREFIX_MAX_CHARS: Final = 20  # "pmk_" + 16 hex digits
_PREFIX_PATTERN: Final = re.compile(r"[a-z0-9_]{1,20}")


# --- The store -----------------------------------------------------------------------------


class KeyStore(KekRotation):
    """Key records in Redis, secrets sealed under a KEK (module docstring: layout, sealing).

    Args:
        client: any ``redis.Redis`` (``decode_responses`` either way); the store does not
            own it — whoever opened it closes it.
        kek: the 32-byte key-encryption key (the current one: new seals are made with it).
        prefix: namespace of every Redis key the store touches.
        previous_keks: KEKs that may have sealed stored records (a rotation: ``reseal``,
            ``service.keys.rotation``, moves their records to ``kek``).
    Raises:
        InvalidInput: a KEK that is not 32 bytes, or an empty prefix.

    Every method turns Redis failures into ``KeyStoreUnavailable`` (location with no password).
    """

    def __init__(
        self,
        client: redis.Redis,
        kek: bytes,
        prefix: str = DEFAULT_PREFIX,
        previous_keks: Sequence[bytes] = (),
    ) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise InvalidInput("prefix", f"expected a non-empty string, got {prefix!r}")
        self._client = client
        self._sealer = Sealer(kek, previous_keks)
        self._prefix = prefix
        self._where = describe_client(client)

    def __repr__(self) -> str:
        return f"KeyStore({self._where}, prefix={self._prefix!r})"

    # Redis keys
    def _record_key(self, key_id: str) -> str:
        return f"{self._prefix}key:{key_id}"

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
        quota: int | None = None,
        model: str | None = None,
    ) -> KeyRecord:
        """Generate a key (32 bytes from ``secrets.token_bytes``) and store it.

        Args:
            tokenizer: the fingerprint of the tokenizer the key is for.
            model: the name of the model it is for (``service.settings.model_name``).
            quota: the most keys ``tenant`` may hold, revoked ones included (None: no limit);
                counted in the same transaction that writes the key, so concurrent creations
                never pass it.
        Raises:
            InvalidInput: a parameter out of its limits (checked before Redis is touched).
            QuotaExceeded: ``tenant`` already holds ``quota`` keys; nothing is stored.
            KeyStoreUnavailable: Redis failed; nothing of the key is stored then.
        """
        record = KeyRecord(
            key_id=new_key_id(),
            secret=Secret(secrets.token_bytes(SECRET_BYTES)),
            context_width=context_width,
            masking=masking,
            tokenizer=tokenizer,
            model=model,
            tenant=tenant,
        )
        with reaching_redis(self._client):
            for _ in range(WRITE_ATTEMPTS):
                if self._insert(record, quota):
                    return record
                record = dataclasses.replace(record, key_id=new_key_id())
        raise KeyStoreUnavailable(self._where, "could not allocate an unused key id")

    def _insert(self, record: KeyRecord, quota: int | None = None) -> bool:
        """Write ``record`` and its set memberships in one transaction; False if the id is taken
        or the tenant's keys changed meanwhile (``QuotaExceeded`` when they number ``quota``)."""
        key = self._record_key(record.key_id)
        held = f"{self._scope(record.tenant)}order"
        with self._client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key, held)  # type: ignore[no-untyped-call]
                if pipe.exists(key):
                    return False
                if quota is not None and int(pipe.zcard(held)) >= quota:
                    raise QuotaExceeded(record.tenant, quota)
                pipe.multi()
                pipe.hset(key, mapping=encode_record(record, self._sealer))
                for scope in self._scopes(record.tenant):
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
        fields = record_fields(key_id, raw)
        if tenant is not None and fields["tenant"] != tenant:
            raise UnknownKey(key_id)
        return decode_record(key_id, fields, self._sealer)

    def get_active(self, key_id: str, tenant: str | None = None) -> KeyRecord:
        """Like ``get``, and raises ``KeyRevoked`` for a revoked key (for generation)."""
        record = self.get(key_id, tenant)
        if record.revoked:
            raise KeyRevoked(key_id)
        return record

    def list_keys(self, tenant: str | None = None, include_revoked: bool = True) -> list[KeyRecord]:
        """Records of one tenant (or all tenants when ``tenant`` is None), oldest first."""
        key_ids = self.candidate_ids(tenant, include_revoked)
        with reaching_redis(self._client):
            return self._records(key_ids, tenant)

    def revoke(self, key_id: str, tenant: str | None = None) -> KeyRecord:
        """Mark a key revoked (idempotent) and return the updated record.

        Raises:
            UnknownKey: no such key, or another tenant's (which then stays untouched).
        """
        key = self._record_key(key_id)
        for _ in range(WRITE_ATTEMPTS):
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
        for _ in range(WRITE_ATTEMPTS):
            record = self.get(key_id, tenant)
            with reaching_redis(self._client), self._client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    if not pipe.exists(key):
                        raise UnknownKey(key_id)  # deleted concurrently
                    pipe.multi()
                    pipe.delete(key)
                    for scope in self._scopes(record.tenant):
                        pipe.srem(f"{scope}revoked", key_id)
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
        after = None if cursor is None else parse_cursor(cursor)
        scope = self._scope(tenant)
        with reaching_redis(self._client):
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
            fields = record_fields(key_id, raw)
            if tenant is not None and fields["tenant"] != tenant:
                continue
            records.append(decode_record(key_id, fields, self._sealer))
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
