"""Redis faults: the service on a redis-server of its own (AOF on, a spare port). Killed, key
operations answer 503 problem+json quickly and the process stays up; restarted, the service
recovers by itself with every key intact. The embedded Redis of ``poissonmark serve``, killed,
is started again by the service itself on the same data."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis

import service.http.app
import service.jobs.resources
from sampler.models import LoadedModel
from service import server
from service.keys.api_tokens import TokenStore
from service.keys.redis import close_redis, embedded_alive, open_redis, revive_embedded
from tests.service.conftest import LiveServer, ServiceFactory, free_port, make_settings
from tests.service.test_api_keys import GEN, problem

REDIS_SERVER = shutil.which("redis-server", path="/usr/bin") or shutil.which("redis-server")


class RedisProcess:
    """A redis-server with AOF (fsync always) in ``data``; ``kill`` is a crash (SIGKILL)."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
            except redis.BusyLoadingError:
                time.sleep(0.05)
        client.close()

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.process = None


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    if REDIS_SERVER is None:
        pytest.skip("no redis-server binary")
    server = RedisProcess(tmp_path / "redis")
    server.data.mkdir()
    server.start()
    try:
        yield server
    finally:
        if server.process is not None:
            server.kill()


def test_redis_outage_gives_503_and_recovery_keeps_every_key(
    tmp_path: Path,
    tiny_loaded,
    redis_process: RedisProcess,  # type: ignore[no-untyped-def]
) -> None:
    factory = ServiceFactory(tmp_path, tiny_loaded, redis_process.url)
    with factory.stack:
        svc = factory()
        user = svc.token("acme")
        keys = sorted(svc.create_key(user) for _ in range(3))
        text = svc.client.post(
            "/v1/generate", json={"key_id": keys[0], **GEN, "max_new_tokens": 30}, headers=user
        ).json()["text"]

        redis_process.kill()
        calls = [
            ("GET", "/v1/keys", None, user),
            ("GET", "/v1/keys", None, svc.admin),
            ("POST", "/v1/keys", {}, svc.admin),
            ("GET", f"/v1/keys/{keys[0]}", None, svc.admin),
            ("POST", f"/v1/keys/{keys[1]}/revoke", None, svc.admin),
            ("POST", "/v1/detect", {"text": text}, svc.admin),
            ("POST", "/v1/generate", {"key_id": keys[0], **GEN}, svc.admin),
        ]
        for method, path, body, headers in calls:
            start = time.monotonic()
            r = svc.client.request(method, path, json=body, headers=headers)
            found = problem(r, 503, "key-store-unavailable")
            assert time.monotonic() - start < 5, path
            assert r.headers["retry-after"]
            assert str(redis_process.port) not in found["detail"]  # no infrastructure details
        assert svc.client.get("/healthz").status_code == 200  # the process is up
        ready = svc.client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["redis"] == "failing"

        redis_process.start()  # same data dir: the AOF brings every key back
        deadline = time.monotonic() + 10
        while svc.client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the service did not recover"
            time.sleep(0.1)
        listed = svc.client.get("/v1/keys", headers=user)
        assert listed.status_code == 200
        assert sorted(k["key_id"] for k in listed.json()["keys"]) == keys
        assert not any(k["revoked"] for k in listed.json()["keys"])  # the failed revoke did not
        found = svc.client.post("/v1/detect", json={"key_id": keys[0], "text": text}, headers=user)
        assert found.status_code == 200
        assert found.json()["verdict"] == "watermarked"  # the secret survived, bit for bit


def test_embedded_redis_killed_under_serve_is_started_again_on_its_data(
    tmp_path: Path, tiny_loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL to the embedded redis-server of ``poissonmark serve``: keyed routes answer 503
    with Retry-After at once (none hangs), and ``/readyz`` is 200 again within 10 s of the kill
    with every key and secret intact. The service's restart is held until the test has seen
    the outage (without the hold it may come first on a quick machine), then released."""
    outage_seen = threading.Event()
    revive = service.jobs.resources.revive_embedded

    def held_revive(client: Any) -> str | None:
        if not embedded_alive(client):
            outage_seen.wait(30)
        return revive(client)

    monkeypatch.setattr(service.jobs.resources, "revive_embedded", held_revive)
    monkeypatch.setattr(service.jobs.resources, "WATCH_INTERVAL_S", 0.1)
    monkeypatch.setattr(service.http.app, "load_served_model", lambda _: tiny_loaded)
    served: list[Any] = []
    monkeypatch.setattr(server.uvicorn, "run", lambda app, **_: served.append(app))
    settings = make_settings(tmp_path / "home")
    server.run_server(settings, host="127.0.0.1", port=0, workers=1, log_level="warning")
    (app,) = served
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.05)
        resources = app.state.resources
        assert settings.admin_token is not None
        admin = {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"}
        token, _ = TokenStore(resources.redis, resources.token_key, settings.redis_prefix).create(
            "acme", ("generate", "detect", "keys")
        )
        user = {"Authorization": f"Bearer {token}"}
        keys = []
        for _ in range(3):
            created = client.post("/v1/keys", json={}, headers=user)
            assert created.status_code == 201, created.text
            keys.append(created.json()["key_id"])
        generated = client.post(
            "/v1/generate", json={"key_id": keys[0], **GEN, "max_new_tokens": 30}, headers=user
        )
        assert generated.status_code == 200, generated.text
        exact = {"key_id": keys[0], "token_ids": generated.json()["token_ids"]}
        before = client.post("/v1/detect", json=exact, headers=user)
        assert before.status_code == 200, before.text
        assert before.json()["verdict"] == "watermarked"

        dead = psutil.Process(resources.redis.pid)
        killed_at = time.monotonic()
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait(10)
        try:
            for method, path, body, headers in [
                ("GET", "/v1/keys", None, user),
                ("POST", "/v1/keys", {}, admin),
                ("POST", "/v1/detect", exact, user),
                ("POST", "/v1/generate", {"key_id": keys[0], **GEN}, user),
            ]:
                start = time.monotonic()
                r = client.request(method, path, json=body, headers=headers)
                problem(r, 503, "key-store-unavailable")
                assert r.headers["retry-after"], path
                assert time.monotonic() - start < 5, f"{path} hung"
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["redis"] == "failing"
        finally:
            outage_seen.set()

        while client.get("/readyz").status_code != 200:
            assert time.monotonic() - killed_at < 10, "the embedded redis was not restarted"
            time.sleep(0.05)
        restarted = psutil.Process(resources.redis.pid)
        assert restarted.pid != dead.pid and restarted.is_running()
        listed = client.get("/v1/keys", headers=user)
        assert listed.status_code == 200, listed.text
        assert sorted(k["key_id"] for k in listed.json()["keys"]) == sorted(keys)
        after = client.post("/v1/detect", json=exact, headers=user)
        assert after.status_code == 200, after.text
        assert after.json() == before.json()  # the secret survived, bit for bit
        # counted once the watcher is back from the restart (/readyz may be 200 a moment before)
        while "restarts_total 1.0" not in (metrics := client.get("/metrics", headers=admin).text):
            assert time.monotonic() - killed_at < 10, metrics
            time.sleep(0.05)
    restarted.wait(10)  # the service stopped it on shutdown: no redis-server is left behind


def test_a_dead_embedded_redis_joins_a_server_another_process_started(tmp_path: Path) -> None:
    """While the service's embedded Redis was dead, a CLI command opened the data dir and
    started a server of its own: reviving joins that one (never a second server on the same
    AOF), which outlives the command's close and stops with the service's client."""
    home = tmp_path / "home"
    service_client = open_redis(None, home)
    service_client.set("k", "v")
    first = psutil.Process(service_client.pid)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert not embedded_alive(service_client)
    cli_client = open_redis(None, home)  # what a CLI command does meanwhile
    try:
        assert cli_client.socket_file != service_client.socket_file
        assert cli_client.get("k") == b"v"
        socket = revive_embedded(service_client)
        assert socket == cli_client.socket_file
        assert revive_embedded(service_client) is None  # alive now: nothing to do
        assert service_client.get("k") == b"v"
        assert service_client.pid == cli_client.pid
    finally:
        close_redis(cli_client)
    server_process = psutil.Process(service_client.pid)
    service_client.set("k2", "v2")  # the command's close left the server to the service
    close_redis(service_client)
    server_process.wait(10)
