"""Running the service in several processes (service/server.py, ``poissonmark serve --workers``).

- the listening socket several workers share hands out connections with Nagle off (uvicorn's
  own leaves ``proto`` 0 and asyncio then skips TCP_NODELAY: +40 ms per keep-alive request);
- more than one worker without a Redis server is a clear error, not a split key store;
- end to end on the real model and the Redis server: two workers share keys (one generated KEK)
  and one ``/metrics`` view, and shut down cleanly.
"""

from __future__ import annotations

import asyncio
import glob
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict
from typer.testing import CliRunner

from sampler.models import DEFAULT_MODEL
from service.cli import app as cli
from service.keys.redis import delete_prefix
from service.server import TcpConfig, prepare_workers
from service.settings import Settings
from tests.service.conftest import SERVER_URL, free_port
from tests.service.test_e2e_real_model import _wait_ready


def _detections_by_pid(shared: str) -> dict[str, float]:
    """Detections counted by each worker process, from prometheus-client's per-pid files."""
    counts: dict[str, float] = {}
    for path in glob.glob(os.path.join(shared, "counter_*.db")):
        pid = Path(path).stem.removeprefix("counter_")
        for key, value, *_ in MmapedDict.read_all_values_from_file(path):
            if "poissonmark_detections" in key and value > 0:
                counts[pid] = counts.get(pid, 0.0) + value
    return counts


def test_the_shared_listener_gives_connections_with_nagle_off() -> None:
    config = TcpConfig("service.http.app:create_app", factory=True, host="127.0.0.1", port=0)
    listener = config.bind_socket()
    assert listener.proto == socket.IPPROTO_TCP
    port = listener.getsockname()[1]
    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(accept_one())
    assert seen == [1]  # TCP_NODELAY on the accepted socket


def test_several_workers_need_a_redis_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="REDIS_URL"):
        prepare_workers(Settings(home=tmp_path, redis_url=None))
    for name in ("REDIS_URL", "POISSONMARK_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POISSONMARK_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["serve", "--workers", "2"])
    assert result.exit_code == 2
    assert "needs a Redis server" in result.output and "Traceback" not in result.output


@pytest.mark.realmodel
@pytest.mark.redis_server
def test_two_workers_share_keys_and_metrics(tmp_path: Path, data_dir: Path) -> None:
    model_dir = data_dir / "models" / DEFAULT_MODEL
    if not (model_dir / "config.json").is_file():
        pytest.skip("the converted model cache is missing (run any real-model test first)")
    admin = secrets.token_urlsafe(32)
    prefix = f"pmtest:{secrets.token_hex(6)}:"
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("POISSONMARK_")},
        "POISSONMARK_HOME": str(tmp_path),  # no POISSONMARK_KEK: serve makes the KEK file once
        "POISSONMARK_MODEL": str(model_dir),
        "POISSONMARK_DEVICE": "cpu",
        "POISSONMARK_ADMIN_TOKEN": admin,
        "POISSONMARK_PORT": str(port),
        "POISSONMARK_REDIS_PREFIX": prefix,
        "REDIS_URL": SERVER_URL,
        # the first worker may answer hundreds of detections while the second still loads
        # (the llama.cpp probe): this test is about sharing, not the per-token rate limit
        "POISSONMARK_DETECT_RATE_LIMIT": str(10**9),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    pattern = os.path.join(tempfile.gettempdir(), "poissonmark-metrics-*")
    before = set(glob.glob(pattern))
    cli_command = [sys.executable, "-c", "from service.cli import main; main()"]
    log = tmp_path / "serve.log"
    try:
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [*cli_command, "serve", "--workers", "2"],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
            try:
                url = f"http://127.0.0.1:{port}"
                _wait_ready(url, process)
                # both workers loaded before any load-balancing claim: on a slow 2-core machine
                # the second still loaded after the first had answered 1,421 detections
                deadline = time.monotonic() + 600
                while log.read_text(errors="replace").count("poissonmark ready") < 2:
                    assert process.poll() is None, "poissonmark serve exited"
                    assert time.monotonic() < deadline, "the second worker never became ready"
                    time.sleep(0.5)
                headers = {"Authorization": f"Bearer {admin}"}
                key = httpx.post(f"{url}/v1/keys", json={}, headers=headers, timeout=60)
                assert key.status_code == 201, key.text
                body = {"key_id": key.json()["key_id"], "text": "The quick brown fox. " * 20}
                (shared,) = set(glob.glob(pattern)) - before  # the metrics dir serve made
                # a new connection per request, until both workers have answered some: a worker
                # holding another KEK could not open the key (a 5xx, not a 200)
                sent, deadline = 0, time.monotonic() + 120
                while sent < 20 or len(_detections_by_pid(shared)) < 2:
                    assert time.monotonic() < deadline, f"one worker answered all {sent} requests"
                    found = httpx.post(f"{url}/v1/detect", json=body, headers=headers, timeout=60)
                    assert found.status_code == 200, found.text
                    sent += 1
                for _ in range(3):  # whichever worker answers, it reports every worker's counts
                    metrics = httpx.get(f"{url}/metrics", headers=headers, timeout=60).text
                    counts = [
                        float(line.rsplit(" ", 1)[1])
                        for line in metrics.splitlines()
                        if line.startswith("poissonmark_detections_total{")
                    ]
                    assert sum(counts) == sent, metrics
            finally:
                process.send_signal(signal.SIGTERM)
                assert process.wait(60) in (0, -signal.SIGTERM)
    finally:
        delete_prefix(SERVER_URL, prefix)
    output = log.read_text()
    assert output.count("poissonmark ready") == 2
    assert admin not in output
    assert set(glob.glob(pattern)) <= before  # serve removed the metrics directory it made
