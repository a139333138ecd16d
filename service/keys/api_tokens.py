"""API bearer tokens: scoped, bound to a tenant, stored only as a hash (docs/design.md §5).

Glossary:
- **token**: what a client sends as ``Authorization: Bearer <token>``:
  ``"pmt_" + <token id> + "_" + <secret>``, the id 16 hex digits, the secret 32 random bytes
  in unpadded base64url (43 characters). Shown once, at creation; never stored or logged.
- **token id**: the public half; it names the token in lists, logs, rate-limit counters and
  revocation.
- **digest**: the only form stored: ``"v2:"`` + HMAC-SHA256 (hex) under the **digest key**
  of the whole token, its tenant and its scopes (``keyed_digest``). A token carries 256 random
  bits, so a fast MAC suffices (password KDFs exist for guessable secrets); keyed, and binding
  tenant and scopes, so that whoever can write to Redis cannot add a token record of their own
  or move a record to another tenant or scope. Compared with ``hmac.compare_digest``.
- **digest key**: 32 bytes derived from the KEK (``digest_key``), so the CLI and every
  replica that hold the KEK agree on it, and nothing else needs to be kept. While a KEK is
  rotated out (``Settings.kek_previous``) the digest key of the previous KEK verifies too:
  a digest cannot be re-made without the token, so tokens made before the rotation work
  until the previous KEK is removed and must be reissued by then (docs/deployment.md).
- **unkeyed digest**: the earlier form, SHA-256 of the token alone. Refused unless the service
  allows it for a transition (``Settings.legacy_token_digests``): then anyone who can write to
  Redis can mint tokens again, so reissue such tokens and turn it off.
- **scopes**: a non-empty subset of ``SCOPES`` — what the token may call. ``evidence`` adds
  raw per-token evidence (pivots and per-token terms: the keyed PRF's outputs) to what
  ``detect`` returns; without it detection shows coarse bands only.
- **principal**: who a verified token speaks for: token id, tenant, scopes.
- **admin token**: ``Settings.admin_token``; every scope for ``Settings.admin_tenant``, never
  stored (it bootstraps a deployment: create keys, then tokens with the CLI).

Redis layout under a prefix P (the key store's, default ``"pm:"``):
``P token:<id>`` — hash of ``token_id``, ``digest``, ``tenant``, ``scopes`` (comma-separated),
``name``, ``created_at``, ``revoked`` ("0"/"1"); ``P tokens`` — set of every token id.
Tokens are revoked, never deleted. ``TokenStore`` (sync) manages them for the CLI; the service
verifies with ``verify_token`` on its ``redis.asyncio`` client.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import redis
import redis.asyncio
from redis.typing import EncodableT, FieldT

from service.errors import InvalidInput, KeyStoreUnavailable, PoissonmarkError
from service.keys.record import check_tenant, utc_now_iso
from service.keys.redis import as_text, describe_client, reaching_redis
from service.keys.store import DEFAULT_PREFIX

SCOPES: Final = ("generate", "detect", "keys", "evidence")
DEFAULT_SCOPES: Final = ("generate", "detect", "keys")
"""What ``poissonmark tokens create`` grants without ``--scope``: every scope but the
privileged ``evidence``."""
TOKEN_PREFIX: Final = "pmt_"
TOKEN_PATTERN: Final = re.compile(r"pmt_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
TOKEN_ID_PATTERN: Final = re.compile(r"[0-9a-f]{16}")
ADMIN_TOKEN_ID: Final = "admin"
NAME_MAX_CHARS: Final = 64


class UnknownToken(PoissonmarkError):
    """No API token with this id."""

    def __init__(self, token_id: str) -> None:
        super().__init__(token_id)
        self.token_id = token_id

    def __str__(self) -> str:
        shown = self.token_id if TOKEN_ID_PATTERN.fullmatch(self.token_id) else "<malformed>"
        return f"unknown token id {shown!r}"


@dataclass(frozen=True)
class Principal:
    """The caller a verified token speaks for."""

    token_id: str
    tenant: str
    scopes: frozenset[str]


@dataclass(frozen=True)
class TokenRecord:
    """A stored token, without its digest (the view lists and the CLI show)."""

    token_id: str
    tenant: str
    scopes: tuple[str, ...]
    name: str
    created_at: str
    revoked: bool

    def public(self) -> dict[str, Any]:
        return {
            "token_id": self.token_id,
            "tenant": self.tenant,
            "scopes": list(self.scopes),
            "name": self.name,
            "created_at": self.created_at,
            "revoked": self.revoked,
        }


DIGEST_VERSION: Final = "v2:"
_DIGEST_KEY_LABEL: Final = b"poissonmark api token digests v2"


def digest(token: str) -> str:
    """SHA-256 of the token's UTF-8 bytes, hex (unkeyed: constant-time equality of secrets
    from settings, and the earlier stored form)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def digest_key(kek: bytes) -> bytes:
    """The 32-byte key of token digests: HMAC-SHA256(KEK, a fixed label).

    Raises:
        InvalidInput: a KEK that is not 32 bytes.
    """
    if not isinstance(kek, bytes | bytearray) or len(kek) != 32:
        raise InvalidInput("kek", "expected 32 bytes")
    return hmac.new(bytes(kek), _DIGEST_KEY_LABEL, hashlib.sha256).digest()


def keyed_digest(key: bytes, token: str, tenant: str, scopes: Iterable[str]) -> str:
    """``"v2:"`` + HMAC-SHA256(key, canonical JSON of token, tenant and scopes), hex."""
    bound = {"scopes": sorted(scopes), "tenant": tenant, "token": token}
    message = json.dumps(bound, sort_keys=True, separators=(",", ":")).encode("ascii")
    return DIGEST_VERSION + hmac.new(key, message, hashlib.sha256).hexdigest()


def check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    """The scopes in ``SCOPES`` order; ``InvalidInput`` naming an unknown one or an empty set."""
    given = list(scopes)
    unknown = [s for s in given if s not in SCOPES]
    if unknown or not given:
        raise InvalidInput(
            "scopes", f"expected a non-empty subset of {', '.join(SCOPES)}, got {given}"
        )
    return tuple(s for s in SCOPES if s in given)


def admin_principal(token: str, admin_token: str | None, tenant: str) -> Principal | None:
    """The admin principal when ``token`` equals the configured admin token (constant time)."""
    if not admin_token:
        return None
    if hmac.compare_digest(digest(token), digest(admin_token)):
        return Principal(ADMIN_TOKEN_ID, tenant, frozenset(SCOPES))
    return None


def _principal(
    token: str,
    raw: Mapping[Any, Any],
    key: bytes,
    legacy: bool,
    previous_keys: tuple[bytes, ...] = (),
) -> Principal | None:
    fields = {as_text(k): as_text(v) for k, v in raw.items()}
    stored = fields.get("digest", "")
    tenant, scopes = fields.get("tenant", ""), fields.get("scopes", "").split(",")
    if stored.startswith(DIGEST_VERSION) or not legacy:
        expected = [keyed_digest(k, token, tenant, scopes) for k in (key, *previous_keys)]
    else:
        expected = [digest(token)]
    # compare_digest first and unconditionally, so a missing or revoked record costs the same
    matches = [hmac.compare_digest(e, stored) for e in expected]
    if not any(matches) or fields.get("revoked") != "0":
        return None
    return Principal(fields["token_id"], tenant, frozenset(scopes))


async def verify_token(
    client: redis.asyncio.Redis,
    token: str,
    key: bytes,
    prefix: str = DEFAULT_PREFIX,
    *,
    legacy: bool = False,
    previous_keys: tuple[bytes, ...] = (),
) -> Principal | None:
    """The principal of a valid, unrevoked token; None for anything else (never says why).

    Args:
        key: the digest key (``digest_key``).
        legacy: also accept records with an unkeyed digest (module docstring).
        previous_keys: digest keys of previous KEKs that also verify (a rotation).
    Raises:
        KeyStoreUnavailable: Redis failed (the caller answers 503, not 401).
    """
    match = TOKEN_PATTERN.fullmatch(token)
    if match is None:
        return None
    try:
        raw = await client.hgetall(f"{prefix}token:{match.group(1)}")
    except redis.RedisError as exc:
        raise KeyStoreUnavailable("redis (token lookup)", type(exc).__name__) from exc
    return _principal(token, raw, key, legacy, previous_keys)


class TokenStore:
    """Create, list and revoke API tokens in Redis (module docstring: layout, format).

    Args:
        client: a sync ``redis.Redis`` (not owned: whoever opened it closes it).
        key: the digest key (``digest_key`` of the KEK), 32 bytes.
        prefix: the key namespace, the service's ``Settings.redis_prefix``.
    Raises:
        InvalidInput: a key that is not 32 bytes, or an empty prefix.
    """

    def __init__(self, client: redis.Redis, key: bytes, prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(key, bytes) or len(key) != 32:
            raise InvalidInput("key", "expected the 32-byte digest key")
        if not isinstance(prefix, str) or not prefix:
            raise InvalidInput("prefix", f"expected a non-empty string, got {prefix!r}")
        self._digest_key = key
        self._client = client
        self._prefix = prefix
        self._where = describe_client(client)

    def _key(self, token_id: str) -> str:
        return f"{self._prefix}token:{token_id}"

    def create(self, tenant: str, scopes: Iterable[str], name: str = "") -> tuple[str, TokenRecord]:
        """A new token (returned once, in clear) and its record.

        Raises:
            InvalidInput: a malformed tenant, unknown scopes, or a name that is too long or not
                printable.
        """
        check_tenant(tenant)
        checked = check_scopes(scopes)
        if len(name) > NAME_MAX_CHARS or not name.isprintable():
            raise InvalidInput("name", f"expected at most {NAME_MAX_CHARS} printable characters")
        with reaching_redis(self._client):
            for _ in range(5):
                token_id = secrets.token_hex(8)
                secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
                token = f"{TOKEN_PREFIX}{token_id}_{secret}"
                record = TokenRecord(token_id, tenant, checked, name, utc_now_iso(), False)
                fields: dict[FieldT, EncodableT] = {
                    "token_id": token_id,
                    "digest": keyed_digest(self._digest_key, token, tenant, checked),
                    "tenant": tenant,
                    "scopes": ",".join(checked),
                    "name": name,
                    "created_at": record.created_at,
                    "revoked": "0",
                }
                if self._insert(token_id, fields):
                    return token, record
        raise KeyStoreUnavailable(self._where, "could not allocate an unused token id")

    def _insert(self, token_id: str, fields: dict[FieldT, EncodableT]) -> bool:
        """Write a record and its set membership in one transaction; False if the id is taken."""
        key = self._key(token_id)
        with self._client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]
                if pipe.exists(key):
                    return False
                pipe.multi()
                pipe.hset(key, mapping=fields)
                pipe.sadd(f"{self._prefix}tokens", token_id)
                pipe.execute()
            except redis.WatchError:
                return False
        return True

    def get(self, token_id: str) -> TokenRecord:
        """Raises ``UnknownToken``."""
        if not isinstance(token_id, str) or not TOKEN_ID_PATTERN.fullmatch(token_id):
            raise UnknownToken(str(token_id))
        with reaching_redis(self._client):
            raw = self._client.hgetall(self._key(token_id))
        if not raw:
            raise UnknownToken(token_id)
        return self._record(raw)

    def list_tokens(self, tenant: str | None = None) -> list[TokenRecord]:
        """Every token (of one tenant when given), oldest first; never digests."""
        with reaching_redis(self._client):
            ids = sorted(as_text(m) for m in self._client.smembers(f"{self._prefix}tokens"))
            pipe = self._client.pipeline(transaction=False)
            for token_id in ids:
                pipe.hgetall(self._key(token_id))
            raws = pipe.execute()
        records = [self._record(raw) for raw in raws if raw]
        if tenant is not None:
            records = [r for r in records if r.tenant == tenant]
        return sorted(records, key=lambda r: (r.created_at, r.token_id))

    def revoke(self, token_id: str) -> TokenRecord:
        """Revoke a token (idempotent); it stops authenticating at once. Raises ``UnknownToken``."""
        record = self.get(token_id)
        with reaching_redis(self._client):
            self._client.hset(self._key(token_id), "revoked", "1")
        return TokenRecord(
            record.token_id, record.tenant, record.scopes, record.name, record.created_at, True
        )

    @staticmethod
    def _record(raw: Mapping[Any, Any]) -> TokenRecord:
        f = {as_text(k): as_text(v) for k, v in raw.items()}
        return TokenRecord(
            f["token_id"],
            f["tenant"],
            tuple(s for s in f["scopes"].split(",") if s),
            f.get("name", ""),
            f["created_at"],
            f.get("revoked") == "1",
        )
