"""Secrets from files (``<SECRET>_FILE``, e.g. Docker secrets): the same checks as from the
environment, never both ways, and an unreadable file is named without its contents."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest

from service.settings import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "REDIS_URL",
        "POISSONMARK_REDIS_URL",
        "POISSONMARK_KEK",
        "POISSONMARK_ADMIN_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)


def test_every_secret_can_come_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kek = base64.b64encode(secrets.token_bytes(32)).decode()
    admin, scraper = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    url = "redis://:" + secrets.token_hex(16) + "@redis:6379/0"
    for name, value in (("kek", kek), ("admin", admin), ("metrics", scraper), ("redis", url)):
        (tmp_path / name).write_text(value + "\n")  # a trailing newline, as editors write
    monkeypatch.setenv("POISSONMARK_KEK_FILE", str(tmp_path / "kek"))
    monkeypatch.setenv("POISSONMARK_ADMIN_TOKEN_FILE", str(tmp_path / "admin"))
    monkeypatch.setenv("POISSONMARK_METRICS_TOKEN_FILE", str(tmp_path / "metrics"))
    monkeypatch.setenv("POISSONMARK_REDIS_URL_FILE", str(tmp_path / "redis"))
    settings = Settings()
    assert settings.kek_bytes() == base64.b64decode(kek)
    assert settings.admin_token is not None and settings.admin_token.get_secret_value() == admin
    assert settings.metrics_token is not None
    assert settings.metrics_token.get_secret_value() == scraper
    assert settings.redis_url is not None and settings.redis_url.get_secret_value() == url


def test_a_secret_given_both_ways_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "url").write_text("redis://redis:6379/0")
    monkeypatch.setenv("REDIS_URL", "redis://other:6379/0")
    monkeypatch.setenv("POISSONMARK_REDIS_URL_FILE", str(tmp_path / "url"))
    with pytest.raises(ValueError, match="POISSONMARK_REDIS_URL or POISSONMARK_REDIS_URL_FILE"):
        Settings()


def test_a_file_secret_is_checked_and_never_echoed(tmp_path: Path) -> None:
    weak = "changeme-changeme-changeme-changeme-1234"
    (tmp_path / "admin").write_text(weak)
    with pytest.raises(ValueError, match="POISSONMARK_ADMIN_TOKEN: looks like a placeholder") as e:
        Settings(admin_token_file=tmp_path / "admin")
    assert weak not in str(e.value)
    with pytest.raises(ValueError, match="POISSONMARK_KEK_FILE: cannot read") as missing:
        Settings(kek_file=tmp_path / "absent")
    assert "FileNotFoundError" in str(missing.value)
