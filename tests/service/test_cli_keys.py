"""``poissonmark keys list`` pages through every key and ``keys delete`` wipes one (in process,
typer's runner, on the embedded Redis of a temporary data dir; keys made through the store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.cli.common import key_store
from service.errors import UnknownKey
from service.keys.store import PAGE_MAX
from service.settings import Settings


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("REDIS_URL", "POISSONMARK_REDIS_URL", "POISSONMARK_KEK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POISSONMARK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_list_pages_through_every_key_and_delete_wipes_one(home: Path) -> None:
    with key_store(Settings()) as store:
        made = [store.create("sha256:cli", tenant=f"t{i % 3}").key_id for i in range(PAGE_MAX + 5)]
        store.revoke(made[1])
    runner = CliRunner()
    listed = runner.invoke(app, ["keys", "list", "--all", "--json"])
    assert listed.exit_code == 0, listed.output
    keys = json.loads(listed.stdout)["keys"]
    assert [k["key_id"] for k in keys] == made  # two pages, creation order, every tenant
    assert [k["key_id"] for k in keys if k["revoked"]] == [made[1]]
    active = json.loads(runner.invoke(app, ["keys", "list", "--active", "--json"]).stdout)["keys"]
    assert len(active) == len(made) - 1
    refused = runner.invoke(app, ["keys", "delete", made[0]], input="n\n")
    assert refused.exit_code != 0
    deleted = runner.invoke(app, ["keys", "delete", made[0], "--yes", "--json"])
    assert deleted.exit_code == 0, deleted.output
    assert json.loads(deleted.stdout)["key_id"] == made[0] and "secret" not in deleted.stdout
    with key_store(Settings()) as store, pytest.raises(UnknownKey):
        store.get(made[0])
    again = runner.invoke(app, ["keys", "delete", made[0], "--yes"])
    assert again.exit_code != 0 and made[0] in again.output


def test_reseal_binds_earlier_records_to_their_tenant(home: Path) -> None:
    """``keys reseal`` turns a record sealed the earlier way (the key id alone as associated
    data) into the bound form; a second run finds nothing to do."""
    import base64
    import os

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from service.keys.kek import load_or_create_kek

    with key_store(Settings()) as store:
        key = store.create("sha256:cli", tenant="acme")
        nonce = os.urandom(12)
        kek = load_or_create_kek(home)
        sealed = AESGCM(kek).encrypt(nonce, key.secret.reveal(), key.key_id.encode())
        raw = store._client  # the store's own Redis: write the earlier form in place
        raw.hset(f"pm:key:{key.key_id}", "secret", b"v1:" + base64.b64encode(nonce + sealed))
    runner = CliRunner()
    first = runner.invoke(app, ["keys", "reseal", "--json"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["resealed"] == 1
    again = json.loads(runner.invoke(app, ["keys", "reseal", "--json"]).stdout)
    assert again["resealed"] == 0 and again["sealed_by"] == {again["kek_id"]: 1}
    with key_store(Settings()) as store:
        assert store.get(key.key_id, "acme").secret.reveal() == key.secret.reveal()
