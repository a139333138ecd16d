"""Redis faults: the service on a redis-server of its own (AOF on, a spare port). Killed, key
operations answer 503 problem+json quickly and the process stays up; restarted, the service
recovers by itself with every key intact."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.service.conftest import ServiceFactory, free_port
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
