"""Load benchmark of the HTTP service, driven from a second process on loopback (issue 4).

Starts ``poissonmark serve`` (real model, embedded Redis in a temp dir) unless ``--url`` points
at a running one, then runs closed-loop clients (each sends its next request when the previous
answer arrives) against

- ``POST /v1/detect`` with 300-token texts (human passages from ``data/human-pydoc.jsonl``, cut
  to exactly 300 tokens) at 1, 8 and 32 concurrent clients, evidence off;
- ``POST /v1/generate`` (mpfr, ngram drafter, B = L = 4, 32 new tokens) at 1 and 4 clients,

each for ``--duration`` seconds, and writes requests/s, latency p50/p95/p99 (ms) and the error
count (any non-2xx or transport error) per scenario as JSON.

    python -m bench.service_load --out bench/results/service_load.json

The goal on a 2-core machine: zero errors, ``/v1/detect`` p99 <= 50 ms at 8 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Explain like I'm five: why is the sky blue?",
    "Write a short story about a lighthouse keeper and a storm.",
    "What are three good habits for writing maintainable code?",
    "Describe how a bicycle gear system works.",
]


def detect_texts(tokenizer: Any, count: int = 32, tokens: int = 300) -> list[str]:
    """``count`` texts of exactly ``tokens`` tokens from the human passages (joined, cut)."""
    passages = [
        json.loads(line)["text"]
        for line in (ROOT / "data" / "human-pydoc.jsonl").read_text().splitlines()
    ]
    ids: list[int] = []
    for passage in passages:
        ids += tokenizer.encode(passage + "\n\n", add_special_tokens=False)
    texts = []
    for i in range(count):
        window = ids[i * tokens : (i + 1) * tokens]
        if len(window) < tokens:
            break
        texts.append(tokenizer.decode(window))
    return texts


async def closed_loop(
    url: str,
    headers: dict[str, str],
    path: str,
    bodies: list[dict[str, Any]],
    clients: int,
    duration: float,
) -> dict[str, Any]:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop = time.perf_counter() + duration
    # Idle connections expire here before uvicorn's 5 s keep-alive closes them there: with equal
    # timeouts a request can race the server's close and fail with a ReadError.
    limits = httpx.Limits(
        max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=2.0
    )

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as c:

        async def client(index: int) -> None:
            n = index
            while time.perf_counter() < stop:
                body = bodies[n % len(bodies)]
                n += clients
                start = time.perf_counter()
                try:
                    r = await c.post(path, json=body)
                    ok = 200 <= r.status_code < 300
                    reason = str(r.status_code)
                except httpx.HTTPError as exc:
                    ok, reason = False, type(exc).__name__
                if ok:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors[reason] = errors.get(reason, 0) + 1

        began = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return {
        "path": path,
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests": len(latencies) + sum(errors.values()),
        "requests_per_second": round(len(latencies) / elapsed, 2),
        "p50_ms": round(float(np.percentile(ms, 50)), 1) if ms.size else None,
        "p95_ms": round(float(np.percentile(ms, 95)), 1) if ms.size else None,
        "p99_ms": round(float(np.percentile(ms, 99)), 1) if ms.size else None,
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    home: Path, admin: str, settings: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str, Path, str]:
    """Start ``poissonmark serve`` on a free loopback port; returns the process, its URL, the
    model dir and an API token (detect, generate, keys) made with ``poissonmark tokens create``
    before the start, so requests pay the token lookup a real client's do. ``settings``: more
    ``POISSONMARK_*`` variables for the server (e.g. ``KEY_CACHE_TTL_S``)."""
    from sampler.models import DEFAULT_MODEL, materialise

    data_dir = Path(os.environ.get("POISSONMARK_HOME", "~/.local/share/poissonmark")).expanduser()
    model_dir = materialise(DEFAULT_MODEL, data_dir)
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("POISSONMARK_")},
        "POISSONMARK_HOME": str(home),
        "POISSONMARK_MODEL": str(model_dir),
        "POISSONMARK_DEVICE": "cpu",
        "POISSONMARK_KEK": base64.b64encode(secrets.token_bytes(32)).decode(),
        "POISSONMARK_ADMIN_TOKEN": admin,
        "POISSONMARK_PORT": str(port),
        "POISSONMARK_DETECT_RATE_LIMIT": str(10**9),
        "POISSONMARK_QUEUE_SIZE": "16",
        **{f"POISSONMARK_{name.upper()}": value for name, value in settings.items()},
    }
    env.pop("REDIS_URL", None)  # the embedded Redis unless settings name a server
    cli = [sys.executable, "-c", "from service.cli import main; main()"]
    made = subprocess.run(
        [*cli, "tokens", "create", "--name", "service-load", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    token = str(json.loads(made.stdout)["token"])
    log = home / "serve.log"
    process = subprocess.Popen(
        [*cli, "serve", "--log-level", "warning"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"poissonmark serve exited; see {log}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url, model_dir, token
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("poissonmark serve did not become ready")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--detect-clients", type=int, nargs="*", default=[1, 8, 32])
    parser.add_argument("--generate-clients", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/service_load.json")
    parser.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a service setting for the server, e.g. key_cache_ttl_s=0 (repeat for several)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="server processes (> 1: on --redis-url)"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    server_settings = dict(item.split("=", 1) for item in args.server_setting)
    if args.workers > 1:  # several processes share a Redis server, under a fresh prefix
        server_settings |= {
            "workers": str(args.workers),
            "redis_url": args.redis_url,
            "redis_prefix": f"pmbench:{secrets.token_hex(4)}:",
        }
    admin = secrets.token_urlsafe(32)
    load_at_start = os.getloadavg()  # other processes on the machine skew every figure
    with tempfile.TemporaryDirectory() as tmp:
        process, url, model_dir, token = start_server(Path(tmp), admin, server_settings)
        try:
            headers = {"Authorization": f"Bearer {token}"}  # an API token, not the admin's
            key_id = httpx.post(f"{url}/v1/keys", json={}, headers=headers).json()["key_id"]
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            texts = detect_texts(tokenizer)
            detect_bodies = [{"key_id": key_id, "text": t} for t in texts]
            generate_bodies = [
                {
                    "key_id": key_id,
                    "prompt": p,
                    "max_new_tokens": 32,
                    "method": "mpfr",
                    "drafter": "ngram",
                    "drafts": 4,
                    "lookahead": 4,
                }
                for p in PROMPTS
            ]
            # warm-up: tokenizer copies in the pool threads, first forward passes
            asyncio.run(closed_loop(url, headers, "/v1/detect", detect_bodies, 4, 3))
            asyncio.run(closed_loop(url, headers, "/v1/generate", generate_bodies, 1, 1))
            scenarios = []
            for clients in args.detect_clients:
                result = asyncio.run(
                    closed_loop(url, headers, "/v1/detect", detect_bodies, clients, args.duration)
                )
                print(json.dumps(result), flush=True)
                scenarios.append(result)
            for clients in args.generate_clients:
                result = asyncio.run(
                    closed_loop(
                        url, headers, "/v1/generate", generate_bodies, clients, args.duration
                    )
                )
                print(json.dumps(result), flush=True)
                scenarios.append(result)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(60)
            if "redis_prefix" in server_settings:
                from service.redis import delete_prefix

                delete_prefix(server_settings["redis_url"], server_settings["redis_prefix"])
    report = {
        "benchmark": "service_load",
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": _git("status", "--porcelain", "--untracked-files=no").splitlines(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg(),
        },
        "server_settings": {k: v for k, v in server_settings.items() if k != "redis_url"},
        "redis": "server" if "redis_url" in server_settings else "embedded",
        "detect_text_tokens": 300,
        "generate": {"max_new_tokens": 32, "method": "mpfr", "drafter": "ngram", "B": 4, "L": 4},
        "duration_s": args.duration,
        "scenarios": scenarios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
