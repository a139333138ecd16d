"""The HTTP service as two Ray Serve replicas on a real two-node Ray cluster.

``service.ray.serve.build(2)`` on a head and a worker node of this machine (one CPU each, so
one replica per node), behind Serve's proxy on the head (same-node routing off: with it, the
head's replica takes every request it keeps up with); both replicas load the real model
and share the Redis server at 127.0.0.1:6379 (a private key prefix). A key created through
one replica (told apart by ``x-poissonmark-replica``) generates and detects through the other:
the key store, its KEK and the tokenizer check are the same on both. Marked ``ray`` (minutes):
``bash scripts/test_ray.sh``.
"""

from __future__ import annotations

import base64
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sampler.models import DEFAULT_MODEL
from service.keys.redis import delete_prefix
from tests.service.conftest import SERVER_URL
from tests.service.ray_cluster import LocalRayCluster, free_port

pytestmark = [pytest.mark.ray, pytest.mark.realmodel, pytest.mark.redis_server]
pytest.importorskip("ray", reason="the ray extra is not installed: bash scripts/test_ray.sh")

HEADER = "x-poissonmark-replica"


@pytest.fixture
def served(tmp_path: Path, data_dir: Path) -> Iterator[tuple[str, str]]:
    """(url, admin token) of two replicas behind Serve's proxy."""
    model_dir = data_dir / "models" / DEFAULT_MODEL
    if not (model_dir / "config.json").is_file():
        pytest.skip("the converted model cache is missing (run any real-model test first)")
    admin = secrets.token_urlsafe(32)
    prefix = f"pmtest:{secrets.token_hex(6)}:"
    port = free_port()
    env = {
        "POISSONMARK_HOME": str(tmp_path),
        "POISSONMARK_MODEL": str(model_dir),
        "POISSONMARK_DEVICE": "cpu",
        "POISSONMARK_ADMIN_TOKEN": admin,
        "POISSONMARK_REDIS_PREFIX": prefix,
        "POISSONMARK_KEK": base64.b64encode(secrets.token_bytes(32)).decode(),
        "POISSONMARK_DETECT_THREADS": "1",
        "REDIS_URL": SERVER_URL,
        # the proxy (head) would send every request to the head's replica while it keeps up
        "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
    }
    cluster = LocalRayCluster(env)  # the nodes' environment: every replica's settings
    try:
        cluster.start_head(num_cpus=1)
        cluster.add_worker(num_cpus=1)
        deploy = (
            "import ray\n"
            "from ray import serve\n"
            "from service.ray.serve import build\n"
            f"ray.init(address={cluster.address!r}, log_to_driver=False)\n"
            "serve.start(proxy_location='HeadOnly',"
            f" http_options={{'host': '127.0.0.1', 'port': {port}}})\n"
            "serve.run(build(2), name='poissonmark', route_prefix='/')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", deploy],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-5000:] + cluster.logs()
        yield f"http://127.0.0.1:{port}", admin
    finally:
        cluster.stop()
        delete_prefix(SERVER_URL, prefix)


def through(replica: str | None, send, other: bool = False, tries: int = 200) -> httpx.Response:  # type: ignore[no-untyped-def]
    """``send()`` until a replica answers that is ``replica`` (or, ``other``, is not)."""
    for _ in range(tries):
        response = send()
        answered = response.headers.get(HEADER)
        assert answered, response.headers
        if replica is None or (answered != replica) == other:
            return response
    raise AssertionError(f"no answer from the wanted replica in {tries} requests")


def test_a_key_made_through_one_replica_works_through_the_other(served) -> None:  # type: ignore[no-untyped-def]
    url, admin = served
    headers = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        deadline = time.monotonic() + 300
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "not ready"
            time.sleep(1)
        replicas = {through(None, lambda: client.get("/readyz")).headers[HEADER] for _ in range(40)}
        assert len(replicas) == 2, replicas  # the proxy spreads requests over both

        created = client.post("/v1/keys", json={})
        assert created.status_code == 201, created.text
        maker = created.headers[HEADER]
        key_id = created.json()["key_id"]

        prompt = "Write three sentences about the sea."
        body = {"key_id": key_id, "prompt": prompt, "max_new_tokens": 40}
        made = through(maker, lambda: client.post("/v1/generate", json=body), other=True)
        assert made.status_code == 200, made.text
        generator = made.headers[HEADER]
        assert generator != maker
        text = made.json()["text"]

        found = through(
            generator,
            lambda: client.post("/v1/detect", json={"key_id": key_id, "text": text}),
            other=True,
        )
        assert found.status_code == 200, found.text
        assert found.headers[HEADER] == maker  # detected where the key was made
        assert found.json()["best_key_id"] == key_id
        assert found.json()["results"][0]["num_scored"] > 0

        listed = through(maker, lambda: client.get("/v1/keys"), other=True)
        assert listed.status_code == 200, listed.text
        assert key_id in listed.text
