"""API tokens (``service/keys/api_tokens.py``) and the ``poissonmark tokens``/``serve`` CLI."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from typer.testing import CliRunner

from service.cli import app as cli
from service.keys.api_tokens import (
    SCOPES,
    TOKEN_PATTERN,
    TokenStore,
    UnknownToken,
    admin_principal,
    digest,
    digest_key,
    keyed_digest,
    verify_token,
)
from service.keys.redis import close_redis, open_redis
from service.settings import Settings, SettingsError
from tests.fresh import ROOT

PREFIX = "pmtest:tok:"
KEY = digest_key(bytes(range(32)))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[redis.Redis]:
    c = open_redis(None, tmp_path)
    try:
        yield c
    finally:
        close_redis(c)


def verify(client: redis.Redis, token: str, key: bytes = KEY, legacy: bool = False):  # type: ignore[no-untyped-def]
    async def run():  # type: ignore[no-untyped-def]
        aclient = redis.asyncio.Redis(unix_socket_path=client.socket_file)
        try:
            return await verify_token(aclient, token, key, PREFIX, legacy=legacy)
        finally:
            await aclient.aclose()

    return asyncio.run(run())


def test_tokens_are_stored_only_as_digests(client: redis.Redis) -> None:
    store = TokenStore(client, KEY, PREFIX)
    token, record = store.create("acme", ["detect", "generate"], "ci")
    assert TOKEN_PATTERN.fullmatch(token)
    assert record.scopes == ("generate", "detect")  # canonical order
    raw = {
        k.decode(): v.decode()
        for k, v in client.hgetall(f"{PREFIX}token:{record.token_id}").items()
    }
    assert raw["digest"] == keyed_digest(KEY, token, "acme", ["generate", "detect"])
    assert raw["digest"].startswith("v2:") and digest(token) not in raw["digest"]
    secret_part = TOKEN_PATTERN.fullmatch(token).group(2)  # type: ignore[union-attr]
    dump = json.dumps(raw)
    assert token not in dump and secret_part not in dump
    principal = verify(client, token)
    assert principal is not None
    assert (principal.token_id, principal.tenant, principal.scopes) == (
        record.token_id,
        "acme",
        frozenset({"generate", "detect"}),
    )


def test_verification_refuses_anything_but_the_exact_live_token(client: redis.Redis) -> None:
    store = TokenStore(client, KEY, PREFIX)
    token, record = store.create("acme", SCOPES)
    other, _ = store.create("acme", SCOPES)
    spliced = token[: len("pmt_") + 17] + other[len("pmt_") + 17 :]  # right id, wrong secret
    for bad in ["", "pmt_", token + "x", token.upper(), spliced, "Bearer " + token]:
        assert verify(client, bad) is None
    store.revoke(record.token_id)
    assert verify(client, token) is None
    assert verify(client, other) is not None


def test_a_token_record_written_without_the_key_does_not_authenticate(
    client: redis.Redis,
) -> None:
    """Whoever can write to Redis but lacks the KEK cannot mint a token: an unkeyed digest
    (the earlier form, anyone can compute it), a digest under another key, or a real record
    moved to another tenant or given more scopes all fail."""
    store = TokenStore(client, KEY, PREFIX)
    token, record = store.create("acme", ["detect"])
    key = f"{PREFIX}token:{record.token_id}"
    assert verify(client, token) is not None
    client.hset(key, "scopes", "generate,detect,keys,evidence")
    assert verify(client, token) is None
    client.hset(key, mapping={"scopes": "detect", "tenant": "other"})
    assert verify(client, token) is None
    client.hset(key, "tenant", "acme")
    assert verify(client, token) is not None  # back as it was
    other_key = digest_key(bytes(32))
    client.hset(key, "digest", keyed_digest(other_key, token, "acme", ["detect"]))
    assert verify(client, token) is None
    client.hset(key, "digest", digest(token))  # the unkeyed form
    assert verify(client, token) is None
    principal = verify(client, token, legacy=True)  # only while the service allows it
    assert principal is not None and principal.tenant == "acme"
    with pytest.raises(ValueError, match="32-byte digest key"):
        TokenStore(client, PREFIX, PREFIX)  # type: ignore[arg-type]


def test_list_and_revoke(client: redis.Redis) -> None:
    store = TokenStore(client, KEY, PREFIX)
    _, a = store.create("acme", ["keys"], "first")
    _, b = store.create("beta", ["detect"])
    assert [r.token_id for r in store.list_tokens()] == [a.token_id, b.token_id]
    assert [r.token_id for r in store.list_tokens("beta")] == [b.token_id]
    assert "digest" not in store.list_tokens()[0].public()
    assert store.revoke(a.token_id).revoked and store.revoke(a.token_id).revoked  # idempotent
    with pytest.raises(UnknownToken):
        store.revoke("0123456789abcdef")
    with pytest.raises(UnknownToken, match="malformed"):
        store.get("pmt_secret-looking-input")


@pytest.mark.parametrize(
    ("tenant", "scopes", "name"),
    [
        pytest.param("bad tenant", ["keys"], "", id="tenant"),
        pytest.param("acme", [], "", id="no_scopes"),
        pytest.param("acme", ["admin"], "", id="unknown_scope"),
        pytest.param("acme", ["keys"], "x" * 65, id="long_name"),
    ],
)
def test_create_validates(client: redis.Redis, tenant: str, scopes: list[str], name: str) -> None:
    with pytest.raises(ValueError):
        TokenStore(client, KEY, PREFIX).create(tenant, scopes, name)


def test_admin_principal_is_constant_time_and_exact() -> None:
    admin = secrets.token_urlsafe(32)
    assert admin_principal(admin, admin, "ops") is not None
    assert admin_principal(admin, admin, "ops").scopes == frozenset(SCOPES)  # type: ignore[union-attr]
    assert admin_principal(admin + "x", admin, "ops") is None
    assert admin_principal(admin, None, "ops") is None


def test_cli_tokens_create_list_revoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POISSONMARK_HOME", str(tmp_path))
    monkeypatch.setenv("POISSONMARK_REDIS_PREFIX", PREFIX)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("POISSONMARK_REDIS_URL", raising=False)
    runner = CliRunner()
    made = runner.invoke(
        cli, ["tokens", "create", "--tenant", "acme", "--scope", "detect", "--name", "ci", "--json"]
    )
    assert made.exit_code == 0, made.output
    created = json.loads(made.stdout)
    assert TOKEN_PATTERN.fullmatch(created["token"]) and created["scopes"] == ["detect"]

    listed = runner.invoke(cli, ["tokens", "list", "--json"])
    assert listed.exit_code == 0
    tokens = json.loads(listed.stdout)["tokens"]
    assert [t["token_id"] for t in tokens] == [created["token_id"]]
    assert created["token"] not in listed.stdout

    revoked = runner.invoke(cli, ["tokens", "revoke", created["token_id"], "--json"])
    assert revoked.exit_code == 0 and json.loads(revoked.stdout)["revoked"] is True
    bad = runner.invoke(cli, ["tokens", "create", "--scope", "root"])
    assert bad.exit_code == 2 and "scopes" in bad.output


def test_cli_serve_refuses_a_placeholder_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    placeholder = "changeme-changeme-changeme-changeme-1234"
    monkeypatch.setenv("POISSONMARK_ADMIN_TOKEN", placeholder)
    result = CliRunner().invoke(cli, ["serve"])
    assert result.exit_code == 2
    assert "placeholder" in result.output and placeholder not in result.output


SHORT_TOKEN_REASON = (
    "error: POISSONMARK_ADMIN_TOKEN: expected at least 32 random characters "
    "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
)


def assert_only_the_reason(output: str) -> None:
    """``output`` is the one line naming the setting and the limit: no traceback, none of
    pydantic's error counts, types or help URLs."""
    assert output.strip().splitlines() == [SHORT_TOKEN_REASON], output
    for noise in ("Traceback", "validation error", "pydantic", "type=", "https://"):
        assert noise not in output, (noise, output)


def test_cli_tokens_create_with_a_short_admin_token_prints_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POISSONMARK_HOME", str(tmp_path))
    monkeypatch.setenv("POISSONMARK_ADMIN_TOKEN", "short")
    made = CliRunner().invoke(cli, ["tokens", "create"])
    assert made.exit_code == 2, made.output
    assert_only_the_reason(made.output)


def test_serve_with_a_short_admin_token_logs_the_reason(tmp_path: Path) -> None:
    """The installed command in its own process, as a user or a container starts it."""
    env = {**os.environ, "POISSONMARK_HOME": str(tmp_path), "POISSONMARK_ADMIN_TOKEN": "short"}
    served = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert served.returncode == 2, served.stderr
    assert served.stdout == ""
    assert_only_the_reason(served.stderr)


def test_settings_errors_name_each_variable_and_its_rule() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings(admin_token="short", port="http", precision="float16", redis_prefix="")
    assert sorted(str(caught.value).splitlines()) == [
        "POISSONMARK_ADMIN_TOKEN: expected at least 32 random characters "
        "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)",
        "POISSONMARK_PORT: Input should be a valid integer, unable to parse string as an integer",
        "POISSONMARK_PRECISION: Input should be 'auto', 'float32', 'bfloat16' or 'gguf'",
        "POISSONMARK_REDIS_PREFIX: String should have at least 1 character",
    ]


def test_settings_errors_never_echo_secrets() -> None:
    for field, value in [("admin_token", "short-but-secret"), ("kek", "bm90LTMyLWJ5dGVz")]:
        with pytest.raises(ValueError) as caught:
            Settings(**{field: value})
        assert value not in str(caught.value)


@pytest.mark.parametrize("legacy", [False, True], ids=["keyed_only", "legacy_allowed"])
def test_the_service_refuses_unkeyed_digests_unless_allowed(
    embedded_services: Any, legacy: bool
) -> None:
    svc = embedded_services(legacy_token_digests=legacy)
    headers = svc.token("acme", ("keys",))
    token = headers["Authorization"].removeprefix("Bearer ")
    assert svc.client.get("/v1/keys", headers=headers).status_code == 200
    token_id = TOKEN_PATTERN.fullmatch(token).group(1)  # type: ignore[union-attr]
    svc.resources.redis.hset(
        f"{svc.settings.redis_prefix}token:{token_id}", "digest", digest(token)
    )
    assert svc.client.get("/v1/keys", headers=headers).status_code == (200 if legacy else 401)
