"""KEK rotation of the key store's records (docs/design.md §5): which KEK sealed each record,
and re-sealing every record not sealed by the current KEK in the current form
(``service.keys.kek``). ``KeyStore`` (``service.keys.store``) is a ``KekRotation``: its
records, its Redis client and its sealer are the ones rotated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import redis

from service.errors import (
    KeyDecryptionFailed,
    KeyRecordCorrupt,
    KeyStoreUnavailable,
    PoissonmarkError,
)
from service.keys.kek import Sealer, is_v1_seal
from service.keys.record import bound_values, record_fields
from service.keys.redis import as_text, reaching_redis

WRITE_ATTEMPTS: Final = 5
"""WATCHed transactions a write retries when the record changes under it."""


class KekRotation:
    """The rotation half of ``KeyStore``: it reads and re-seals the records of ``_prefix`` on
    ``_client`` with ``_sealer`` (all three set by ``KeyStore.__init__``)."""

    _client: redis.Redis
    _sealer: Sealer
    _prefix: str
    _where: str

    def _record_key(self, key_id: str) -> str:
        """The Redis key of a record (``KeyStore``'s layout)."""
        raise NotImplementedError

    @property
    def kek_id(self) -> str:
        """The id of the current KEK (``service.keys.kek.kek_id``)."""
        return self._sealer.kek_id

    def sealed_by(self) -> dict[str, int]:
        """How many records each KEK sealed (its id; ``"v2"``/``"v1"`` for the forms that
        name none): what a rotation still has to re-seal."""
        counts: dict[str, int] = {}
        for _, sealed in self._sealed_secrets():
            name = self._sealer.sealed_by(sealed) or sealed.split(":", 1)[0]
            counts[name] = counts.get(name, 0) + 1
        return counts

    def _sealed_secrets(self) -> list[tuple[str, str]]:
        """(key id, sealed secret) of every record, in creation order (one round trip)."""
        with reaching_redis(self._client):
            ordered: list[Any] = self._client.zrange(f"{self._prefix}order", 0, -1)
            key_ids = [as_text(m) for m in ordered]
            pipe = self._client.pipeline(transaction=False)
            for key_id in key_ids:
                pipe.hget(self._record_key(key_id), "secret")
            stored = pipe.execute()
        return [(k, as_text(v)) for k, v in zip(key_ids, stored, strict=True) if v is not None]

    def reseal(self, skip: Callable[[str, PoissonmarkError], object] | None = None) -> int:
        """Re-seal every record not sealed by the current KEK in the current form
        (``service.keys.kek``): v1 (bound to its key id alone), v2 (no KEK id) and a previous KEK's,
        as v3 under the current KEK, bound to its tenant and parameters as they are now (a v2
        or v3 record must open with its own); each record in its own WATCHed transaction.
        Idempotent. Returns how many records were re-sealed.

        Args:
            skip: called with (key id, error) for a record that cannot be re-sealed, which is
                then left as it is (None: raise instead).
        Raises:
            KeyDecryptionFailed: without ``skip``, a record that opens under no configured
                KEK (those before it are re-sealed; it and those after are left as they are).
            KeyRecordCorrupt: likewise. KeyStoreUnavailable.
        """
        resealed = 0
        for key_id, sealed in self._sealed_secrets():
            if self._sealer.is_current(sealed):
                continue
            try:
                with reaching_redis(self._client):
                    resealed += self._reseal_one(key_id)
            except (KeyDecryptionFailed, KeyRecordCorrupt) as exc:
                if skip is None:
                    raise
                skip(key_id, exc)
        return resealed

    def _reseal_one(self, key_id: str) -> bool:
        """Re-seal one record (``reseal``); False when it is gone or already current."""
        key = self._record_key(key_id)
        for _ in range(WRITE_ATTEMPTS):
            with self._client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    raw = pipe.hgetall(key)
                    if not raw:
                        return False
                    fields = record_fields(key_id, raw)
                    stored, bound = fields["secret"], bound_values(fields)
                    if self._sealer.is_current(stored):
                        return False
                    secret = (
                        self._sealer.unseal_v1(key_id, stored)
                        if is_v1_seal(stored)
                        else self._sealer.unseal(key_id, stored, bound)
                    )
                    sealed = self._sealer.seal(key_id, secret, bound)
                    pipe.multi()
                    pipe.hset(key, "secret", sealed)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue  # revoked or deleted meanwhile: read it again
        raise KeyStoreUnavailable(self._where, "the record kept changing during reseal")
