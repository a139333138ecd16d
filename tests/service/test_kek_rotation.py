"""KEK ids and rotation (``service.keys.kek``, docs/deployment.md): a sealed secret names the KEK
that sealed it; a previous KEK still opens its records (and verifies the API tokens it made)
while the current one seals everything new; ``reseal`` (``poissonmark keys reseal``, the
service's start) moves every record to the current KEK, after which the previous one is no
longer needed. On the embedded Redis of a temporary data dir."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from typer.testing import CliRunner

from service.cli import app
from service.cli.common import key_store
from service.errors import KeyDecryptionFailed
from service.keys.api_tokens import TokenStore, digest_key, verify_token
from service.keys.kek import associated_data, kek_id
from service.keys.record import bound_values, record_fields
from service.keys.redis import close_redis, open_redis
from service.keys.store import KeyStore
from service.settings import Settings

OLD, NEW = secrets.token_bytes(32), secrets.token_bytes(32)
PREFIX = "pmtest:rot:"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[redis.Redis]:
    c = open_redis(None, tmp_path)
    try:
        yield c
    finally:
        close_redis(c)


def _stored(client: redis.Redis, key_id: str) -> str:
    return str(client.hget(f"{PREFIX}key:{key_id}", "secret").decode())  # type: ignore[union-attr]


def test_a_seal_names_its_kek(client: redis.Redis) -> None:
    """``v3:<kek id>:…``; the id is 16 hex digits of an HMAC (not the KEK's own bytes), one per
    KEK; a record whose KEK id was swapped for another configured KEK's does not open (the id
    is in the associated data)."""
    store = KeyStore(client, NEW, PREFIX, [OLD])
    record = store.create("sha256:rot", tenant="acme")
    assert kek_id(NEW) != kek_id(OLD) and kek_id(NEW) == store.kek_id
    assert kek_id(NEW)[4:] not in NEW.hex()
    stored = _stored(client, record.key_id)
    assert stored.startswith(f"v3:{kek_id(NEW)}:")
    assert store.get(record.key_id, "acme").secret.reveal() == record.secret.reveal()
    forged = stored.replace(kek_id(NEW), kek_id(OLD), 1)
    client.hset(f"{PREFIX}key:{record.key_id}", "secret", forged)
    with pytest.raises(KeyDecryptionFailed):
        store.get(record.key_id, "acme")


def test_rotation_reads_old_records_and_reseal_moves_them(client: redis.Redis) -> None:
    """Records sealed under the old KEK: the new KEK alone cannot read them (the error names
    the old KEK's id); with the old one as previous it can, new records are sealed under the
    new one, and ``reseal`` moves exactly the old ones. After it the new KEK alone reads all,
    and a second reseal finds nothing."""
    old_store = KeyStore(client, OLD, PREFIX)
    before = [old_store.create("sha256:rot", tenant=f"t{i % 2}") for i in range(3)]
    alone = KeyStore(client, NEW, PREFIX)
    with pytest.raises(KeyDecryptionFailed) as unreadable:
        alone.get(before[0].key_id, "t0")
    assert kek_id(OLD) in str(unreadable.value) and OLD.hex() not in str(unreadable.value)

    rotating = KeyStore(client, NEW, PREFIX, [OLD])
    assert rotating.get(before[1].key_id, "t1").secret.reveal() == before[1].secret.reveal()
    after = rotating.create("sha256:rot", tenant="t0")
    assert rotating.sealed_by() == {kek_id(OLD): 3, kek_id(NEW): 1}
    assert rotating.reseal() == 3
    assert rotating.sealed_by() == {kek_id(NEW): 4}
    assert rotating.reseal() == 0
    for record in [*before, after]:
        assert _stored(client, record.key_id).startswith(f"v3:{kek_id(NEW)}:")
        assert alone.get(record.key_id, record.tenant).secret.reveal() == record.secret.reveal()


def test_a_v2_seal_opens_and_is_resealed(client: redis.Redis) -> None:
    """A record of the form that names no KEK (v2) opens with whichever configured KEK sealed
    it, and ``reseal`` moves it to v3 under the current one."""
    store = KeyStore(client, OLD, PREFIX)
    record = store.create("sha256:rot", tenant="acme")
    key = f"{PREFIX}key:{record.key_id}"
    bound = bound_values(record_fields(record.key_id, client.hgetall(key)))
    nonce = os.urandom(12)
    aad = associated_data(record.key_id, bound)
    sealed = nonce + AESGCM(OLD).encrypt(nonce, record.secret.reveal(), aad)
    client.hset(key, "secret", "v2:" + base64.b64encode(sealed).decode())
    rotating = KeyStore(client, NEW, PREFIX, [OLD])
    assert rotating.get(record.key_id, "acme").secret.reveal() == record.secret.reveal()
    assert rotating.sealed_by() == {"v2": 1}
    assert rotating.reseal() == 1
    assert _stored(client, record.key_id).startswith(f"v3:{kek_id(NEW)}:")


def test_tokens_of_the_previous_kek_verify_only_while_it_is_configured(
    client: redis.Redis,
) -> None:
    """A token made under the old KEK's digest key: refused under the new key alone, accepted
    with the old one as previous (tokens cannot be re-digested: they are reissued before the
    previous KEK goes)."""
    token, _ = TokenStore(client, digest_key(OLD), PREFIX).create("acme", ("detect",))

    async def verify(previous: tuple[bytes, ...]) -> object:
        aclient = redis.asyncio.Redis(unix_socket_path=client.socket_file)
        try:
            return await verify_token(
                aclient, token, digest_key(NEW), PREFIX, previous_keys=previous
            )
        finally:
            await aclient.aclose()

    assert asyncio.run(verify(())) is None
    principal = asyncio.run(verify((digest_key(OLD),)))
    assert principal is not None and principal.tenant == "acme"  # type: ignore[attr-defined]


def test_cli_keys_reseal_rotates_to_the_new_kek(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POISSONMARK_KEK`` = new, ``POISSONMARK_KEK_PREVIOUS`` = old: ``keys reseal`` re-seals
    the old records and reports only the new KEK left; the new KEK alone then lists them."""
    for name in ("REDIS_URL", "POISSONMARK_REDIS_URL", "POISSONMARK_KEK_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POISSONMARK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("POISSONMARK_KEK", base64.b64encode(OLD).decode())
    runner = CliRunner()
    made = [
        json.loads(runner.invoke(app, ["keys", "create", "--json"]).stdout)["key_id"]
        for _ in range(2)
    ]
    monkeypatch.setenv("POISSONMARK_KEK", base64.b64encode(NEW).decode())
    refused = runner.invoke(app, ["keys", "reseal", "--json"])
    assert refused.exit_code != 0 and kek_id(OLD) in refused.output  # not configured: names it
    monkeypatch.setenv("POISSONMARK_KEK_PREVIOUS", base64.b64encode(OLD).decode())
    done = runner.invoke(app, ["keys", "reseal", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report == {"resealed": 2, "kek_id": kek_id(NEW), "sealed_by": {kek_id(NEW): 2}}
    assert OLD.hex() not in done.output and base64.b64encode(OLD).decode() not in done.output
    monkeypatch.delenv("POISSONMARK_KEK_PREVIOUS")
    with key_store(Settings()) as store:  # the new KEK alone opens them
        assert [store.get(key_id).key_id for key_id in made] == made
