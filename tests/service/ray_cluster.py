"""A real local Ray cluster for the ``ray``-marked tests: a head and worker nodes, each a
``ray start --block`` process of ours on this machine (explicit ports, a private temp dir,
small object stores), stopped by process id (never ``ray stop``, which stops every Ray on the
host)."""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's minimum is 75 MiB; the corpus needs little


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRayCluster:
    """Nodes started with ``ray start --block``; ``address`` is the head's GCS."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        # short: Ray's socket paths live under it (AF_UNIX paths are limited to 107 bytes)
        self.temp_dir = Path(tempfile.mkdtemp(prefix="pmray", dir="/tmp"))
        self.env = {
            **os.environ,
            **(env or {}),
            "RAY_USAGE_STATS_ENABLED": "0",
            # the cluster's own token (nodes, drivers): not ~/.ray/auth_token, shared by all
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": (env or {}).get("RAY_AUTH_TOKEN") or secrets.token_hex(32),
        }
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[subprocess.Popen[bytes]] = []
        # worker ports below the ephemeral range that free_port() draws from (32768-60999)
        self._next_worker_port = random.Random().randrange(10_000, 30_000, 1000)

    def _node_ports(self) -> list[str]:
        base, self._next_worker_port = self._next_worker_port, self._next_worker_port + 1000
        return [
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--min-worker-port={base}",
            f"--max-worker-port={base + 199}",
        ]

    def _start(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = (self.temp_dir / f"{name}.log").open("wb")
        node = subprocess.Popen(
            [RAY, "start", "--block", "--disable-usage-stats", *args, *self._node_ports()],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped by its id
        )
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: int) -> None:
        self._start(
            [
                "--head",
                f"--port={self.port}",
                f"--num-cpus={num_cpus}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                f"--temp-dir={self.temp_dir}",
                "--include-dashboard=false",
                f"--ray-client-server-port={free_port()}",
                "--node-ip-address=127.0.0.1",
            ],
            "head",
        )
        self.wait_for_nodes(1)

    def add_worker(self, num_cpus: int) -> subprocess.Popen[bytes]:
        node = self._start(
            [
                f"--address={self.address}",
                f"--num-cpus={num_cpus}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                "--node-ip-address=127.0.0.1",
            ],
            f"worker{len(self.nodes)}",
        )
        self.wait_for_nodes(len(self.nodes))
        return node

    def alive_nodes(self) -> int:
        code = (
            f"import ray; ray.init(address={self.address!r}, log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=self.env, capture_output=True, text=True, timeout=120
        )
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else 0

    def wait_for_nodes(self, count: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_nodes() != count:
            for node in self.nodes:
                if node.poll() is not None:
                    raise RuntimeError(f"a Ray node exited: {self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} Ray nodes not up after {timeout} s: {self.logs()}")
            time.sleep(1)

    def processes(self, node: subprocess.Popen[bytes]) -> list[psutil.Process]:
        """The node's processes: its ``ray start``, raylet, workers and actors."""
        root = psutil.Process(node.pid)
        return [root, *root.children(recursive=True)]

    def actor_processes(self, node: subprocess.Popen[bytes], name: str) -> list[psutil.Process]:
        """Live worker processes of ``node`` whose title names ``name`` (e.g. an actor
        class)."""
        found = []
        for proc in self.processes(node)[1:]:
            try:
                if name in " ".join(proc.cmdline()):
                    found.append(proc)
            except psutil.NoSuchProcess:
                continue
        return found

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.temp_dir.glob("*.log"))
        )

    def stop(self) -> None:
        """SIGTERM each node's ``ray start`` (it stops what it started), then SIGKILL what is
        left of our process trees; remove the temp dir."""
        procs: list[psutil.Process] = []
        for node in reversed(self.nodes):
            if node.poll() is None:
                procs.extend(self.processes(node))
                node.send_signal(signal.SIGTERM)
        for node in self.nodes:
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait(10)
        _, alive = psutil.wait_procs(procs, timeout=10)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
