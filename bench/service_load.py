"""Load benchmark of the HTTP service, driven from a second process on loopback.

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

``--sweep`` (continuous batching) instead sweeps ``POST /v1/generate`` over
``--sweep-clients`` (1, 2, 4, 8, 16, 32) concurrent clients: mpfr, ngram, B = L = 4,
``--sweep-tokens`` (128) new tokens (``--sweep-defaults``: the service's default method,
drafter, B and L instead), 8 held-out ELI5 prompts each with a fixed nonce, at least
``--sweep-requests`` (8) requests per level, the levels repeated ``--sweep-repeats`` times
interleaved (ratios from each level's median). A 503 with Retry-After (the bounded queue is full)
is retried after the pause it names and counted; any other non-2xx is an error. Every output
is checked against the one-client level's (solo) output for the same prompt and nonce. Writes
aggregate generated tokens/s, latency p50/p99, errors, 503s and mismatches per level (JSON)
and a plot (PNG) of throughput and p50/p99 against concurrency:

    python -m bench.service_load --sweep --out bench/results/service_load_batching.json

``--tenants`` (fair share, docs/design.md §5) instead measures one tenant's burst against
another tenant's requests: tenant A keeps ``--tenants-burst`` (16) streamed generations in
flight (closed loop) while tenant B sends ``--tenants-b-requests`` (4) one at a time (mpfr,
ngram, B = L = ``--tenants-drafts`` (4), ``--tenants-tokens`` (64) new tokens, ELI5 prompts).
Three phases: B alone; B beside A's burst, each with its own tenant (fair admission); and B
beside the burst with a token of A's tenant (one tenant: FIFO, B queues behind A's requests).
Per phase: B's time to first token (queue wait + prefill) and latency; A's latency, time to
first token and running time (latency - time to first token):

    python -m bench.service_load --tenants --out bench/results/service_load_tenants.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
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


def eli5_messages(count: int = 8) -> list[list[dict[str, str]]]:
    """The first ``count`` ELI5 prompts of ``data/prompts-eli5.jsonl`` (chat messages)."""
    lines = (ROOT / "data" / "prompts-eli5.jsonl").read_text().splitlines()[:count]
    return [json.loads(line)["messages"] for line in lines]


async def sweep_level(
    url: str, headers: dict[str, str], bodies: list[dict[str, Any]], clients: int, requests: int
) -> tuple[dict[str, Any], dict[int, list[list[int]]]]:
    """``requests`` generations (at least one per client) by ``clients`` closed-loop clients;
    returns the level's figures and the token ids per body index (the last seen)."""
    latencies: list[float] = []
    tokens: list[int] = []
    outputs: dict[int, list[list[int]]] = {}
    errors: dict[str, int] = {}
    retried = 0
    todo = list(range(max(requests, clients)))[::-1]
    limits = httpx.Limits(
        max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=2.0
    )
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=1800, limits=limits) as c:

        async def client() -> None:
            nonlocal retried
            while todo:
                index = todo.pop() % len(bodies)
                start = time.perf_counter()
                while True:
                    try:
                        r = await c.post("/v1/generate", json=bodies[index])
                    except httpx.HTTPError as exc:
                        errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                        break
                    if r.status_code == 503 and "retry-after" in r.headers:
                        retried += 1
                        await asyncio.sleep(float(r.headers["retry-after"]))
                        continue
                    if r.status_code != 200:
                        errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1
                    else:
                        latencies.append(time.perf_counter() - start)
                        ids = r.json()["token_ids"]
                        tokens.append(len(ids))
                        outputs.setdefault(index, []).append(ids)
                    break

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    level = {
        "clients": clients,
        "requests": len(latencies) + sum(errors.values()),
        "seconds": round(elapsed, 2),
        "generated_tokens": int(sum(tokens)),
        "tokens_per_second": round(sum(tokens) / elapsed, 2),
        "p50_ms": round(float(np.percentile(ms, 50)), 1) if ms.size else None,
        "p99_ms": round(float(np.percentile(ms, 99)), 1) if ms.size else None,
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "retried_503": retried,
    }
    return level, outputs


SWEEP_SAMPLER = {"method": "mpfr", "drafter": "ngram", "drafts": 4, "lookahead": 4}
"""The sweep's sampler unless ``--sweep-defaults`` (the service's own defaults)."""


def run_sweep(
    url: str, headers: dict[str, str], key_id: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The ``--sweep`` levels (module docstring), the first (one client) as the solo reference."""
    sampler = {} if args.sweep_defaults else SWEEP_SAMPLER
    bodies = [
        {
            "key_id": key_id,
            "messages": messages,
            "max_new_tokens": args.sweep_tokens,
            "nonce": 1000 + i,
            **sampler,
        }
        for i, messages in enumerate(eli5_messages(args.sweep_prompts))
    ]
    warm = dict(bodies[0], max_new_tokens=8)
    asyncio.run(sweep_level(url, headers, [warm], 2, 2))  # first forwards, pool threads
    solo: dict[int, list[int]] = {}
    levels = []
    for clients in [c for _ in range(args.sweep_repeats) for c in args.sweep_clients]:
        level, outputs = asyncio.run(
            sweep_level(url, headers, bodies, clients, args.sweep_requests)
        )
        if not solo and clients == 1:
            solo = {i: runs[0] for i, runs in outputs.items()}
        level["outputs_checked"] = sum(len(runs) for i, runs in outputs.items() if i in solo)
        level["outputs_differing_from_solo"] = sum(
            run != solo[i] for i, runs in outputs.items() if i in solo for run in runs
        )
        level["load_average"] = os.getloadavg()
        print(json.dumps(level), flush=True)
        levels.append(level)
    return levels


def summarise(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency (increasing): how many interleaved runs, the median, min and max of
    aggregate tokens/s, and the median p50/p99 latency and total errors over those runs."""
    rows = []
    for clients in sorted({lv["clients"] for lv in levels}):
        runs = [lv for lv in levels if lv["clients"] == clients]
        rate = [lv["tokens_per_second"] for lv in runs]
        p50 = [lv["p50_ms"] for lv in runs if lv["p50_ms"] is not None]
        p99 = [lv["p99_ms"] for lv in runs if lv["p99_ms"] is not None]
        rows.append(
            {
                "clients": clients,
                "runs": len(runs),
                "tokens_per_second": round(float(np.median(rate)), 2),
                "tokens_per_second_min": min(rate),
                "tokens_per_second_max": max(rate),
                "p50_ms": round(float(np.median(p50)), 1) if p50 else None,
                "p99_ms": round(float(np.median(p99)), 1) if p99 else None,
                "errors": sum(lv["errors"] for lv in runs),
                "outputs_differing_from_solo": sum(
                    lv.get("outputs_differing_from_solo", 0) for lv in runs
                ),
            }
        )
    return rows


def plot_sweep(levels: list[dict[str, Any]], path: Path, title: str) -> None:
    """Throughput (median, min-max bars) and median p50/p99 latency against concurrency
    (PNG), from ``summarise``'s rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = [lv["clients"] for lv in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    rate = [lv["tokens_per_second"] for lv in levels]
    spread = [
        [r - lv["tokens_per_second_min"] for r, lv in zip(rate, levels, strict=True)],
        [lv["tokens_per_second_max"] - r for r, lv in zip(rate, levels, strict=True)],
    ]
    left.errorbar(clients, rate, yerr=spread, fmt="o-", capsize=3)
    left.set(xscale="log", xlabel="concurrent clients", ylabel="generated tokens/s (aggregate)")
    left.set_xticks(clients, [str(c) for c in clients])
    right.plot(clients, [lv["p50_ms"] / 1000 for lv in levels], "o-", label="p50")
    right.plot(clients, [lv["p99_ms"] / 1000 for lv in levels], "s--", label="p99")
    right.set(xscale="log", xlabel="concurrent clients", ylabel="request latency (s)")
    right.set_xticks(clients, [str(c) for c in clients])
    right.legend()
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cpu_facts() -> dict[str, Any]:
    """The CPU model string and whether it has AMX (``/proc/cpuinfo``)."""
    model, amx = platform.processor(), False
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                amx = "amx_tile" in line.split()
    return {"cpu_model": model, "amx": amx}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    home: Path, admin: str, settings: dict[str, str], tenants: tuple[str, ...] = ("default",)
) -> tuple[subprocess.Popen[bytes], str, Path, dict[str, str]]:
    """Start ``poissonmark serve`` on a free loopback port; returns the process, its URL, the
    model dir and an API token (detect, generate, keys) per tenant of ``tenants``, made with
    ``poissonmark tokens create`` before the start, so requests pay the token lookup a real
    client's do. ``settings``: more ``POISSONMARK_*`` variables for the server (e.g.
    ``KEY_CACHE_TTL_S``)."""
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
        "POISSONMARK_GENERATE_RATE_LIMIT": str(10**9),
        "POISSONMARK_QUEUE_SIZE": "16",
        **{f"POISSONMARK_{name.upper()}": value for name, value in settings.items()},
    }
    env.pop("REDIS_URL", None)  # the embedded Redis unless settings name a server
    cli = [sys.executable, "-c", "from service.cli import main; main()"]
    tokens = {}
    for tenant in tenants:
        made = subprocess.run(
            [*cli, "tokens", "create", "--name", "service-load", "--tenant", tenant, "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        tokens[tenant] = str(json.loads(made.stdout)["token"])
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
                return process, url, model_dir, tokens
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("poissonmark serve did not become ready")


def _provenance(load_at_start: tuple[float, float, float]) -> dict[str, Any]:
    """Commit, uncommitted changes and the machine (CPU model, AMX, load at start and end)."""
    return {
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": _git("status", "--porcelain", "--untracked-files=no").splitlines(),
        "machine": {
            "cpus": os.cpu_count(),
            **cpu_facts(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg(),
        },
    }


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
    parser.add_argument("--sweep", action="store_true", help="the generate concurrency sweep")
    parser.add_argument("--sweep-clients", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--sweep-tokens", type=int, default=128)
    parser.add_argument(
        "--sweep-defaults",
        action="store_true",
        help="generate with the service's default method, drafter, B and L (not mpfr ngram B4 L4)",
    )
    parser.add_argument("--sweep-prompts", type=int, default=8)
    parser.add_argument("--sweep-requests", type=int, default=8)
    parser.add_argument(
        "--sweep-repeats",
        type=int,
        default=1,
        help="run the --sweep-clients levels this many times, interleaved (1, 2, ..., 1, 2, ...);"
        " the summary and ratios use each level's median",
    )
    parser.add_argument("--tenants", action="store_true", help="one tenant's burst vs another")
    parser.add_argument("--tenants-burst", type=int, default=16)
    parser.add_argument("--tenants-tokens", type=int, default=64)
    parser.add_argument("--tenants-b-requests", type=int, default=4)
    parser.add_argument(
        "--tenants-drafts", type=int, default=4, help="B = L of the --tenants requests"
    )
    parser.add_argument("--machine-load", default="", help="a note on other load, for the JSON")
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
    tenants = ("A", "B") if args.tenants else ("default",)
    with tempfile.TemporaryDirectory() as tmp:
        process, url, model_dir, tokens = start_server(Path(tmp), admin, server_settings, tenants)
        try:
            # API tokens, not the admin's
            heads = {t: {"Authorization": f"Bearer {token}"} for t, token in tokens.items()}
            headers = heads[tenants[0]]
            key_id = httpx.post(f"{url}/v1/keys", json={}, headers=headers).json()["key_id"]
            if args.tenants:
                phases = run_tenants(url, heads, args)
                return write_tenants(args, phases, server_settings, load_at_start)
            if args.sweep:
                levels = run_sweep(url, headers, key_id, args)
                return write_sweep(args, levels, server_settings, load_at_start)
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
                from service.keys.redis import delete_prefix

                delete_prefix(server_settings["redis_url"], server_settings["redis_prefix"])
    report = {
        "benchmark": "service_load",
        **_provenance(load_at_start),
        "server_settings": {k: v for k, v in server_settings.items() if k != "redis_url"},
        "redis": "server" if "redis_url" in server_settings else "embedded",
        "detect_text_tokens": 300,
        "generate": {"max_new_tokens": 32, "method": "mpfr", "drafter": "ngram", "B": 4, "L": 4},
        "duration_s": args.duration,
        "scenarios": scenarios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


async def streamed(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed ``POST /v1/generate``: status, time to the first delta and to the end
    (s), tokens, and the last event's name (``done`` or ``error``)."""
    start = time.perf_counter()
    first, tokens, last = None, 0, ""
    async with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            return {"status": r.status_code, "seconds": time.perf_counter() - start}
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                last = line[7:]
            elif line.startswith("data: ") and last == "delta":
                tokens += len(json.loads(line[6:])["token_ids"])
                if first is None:
                    first = time.perf_counter() - start
    return {
        "status": 200,
        "ttft": first,
        "seconds": time.perf_counter() - start,
        "tokens": tokens,
        "end": last,
    }


def _ms(values: list[float]) -> dict[str, Any]:
    ms = np.array(values) * 1000
    if not ms.size:
        return {"n": 0}
    return {
        "n": int(ms.size),
        "p50_ms": round(float(np.median(ms)), 1),
        "max_ms": round(float(ms.max()), 1),
        "all_ms": [round(float(v), 1) for v in ms],
    }


async def tenants_phase(
    url: str,
    a: tuple[dict[str, str], list[dict[str, Any]]] | None,
    b: tuple[dict[str, str], list[dict[str, Any]]],
    burst: int,
    b_requests: int,
) -> dict[str, Any]:
    """B's requests one at a time (headers, bodies), while (``a`` not None) A keeps ``burst``
    requests in flight (closed loop); A's last ones are awaited after B's."""
    a_runs: list[dict[str, Any]] = []
    b_runs: list[dict[str, Any]] = []
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=burst + 1, keepalive_expiry=2.0)
    a_headers, a_bodies = a if a is not None else ({}, [])
    async with (
        httpx.AsyncClient(base_url=url, timeout=1800, headers=a_headers, limits=limits) as ca,
        httpx.AsyncClient(base_url=url, timeout=1800, headers=b[0]) as cb,
    ):

        async def pump(index: int) -> None:
            n = index
            while not stop.is_set():
                a_runs.append(await streamed(ca, a_bodies[n % len(a_bodies)]))
                n += burst

        pumps = [asyncio.create_task(pump(i)) for i in range(burst if a is not None else 0)]
        if pumps:
            await asyncio.sleep(3.0)  # A's burst fills the batch and the queue
        for i in range(b_requests):
            b_runs.append(await streamed(cb, b[1][i % len(b[1])]))
        began_drain = time.perf_counter()
        stop.set()
        await asyncio.gather(*pumps)
        drained = time.perf_counter() - began_drain
    ok_a = [r for r in a_runs if r["status"] == 200 and r["end"] == "done"]
    ok_b = [r for r in b_runs if r["status"] == 200 and r["end"] == "done"]
    return {
        "b": {
            "requests": len(b_runs),
            "failed": len(b_runs) - len(ok_b),
            "ttft": _ms([r["ttft"] for r in ok_b]),
            "latency": _ms([r["seconds"] for r in ok_b]),
        },
        "a": {
            "in_flight": burst if a is not None else 0,
            "requests": len(a_runs),
            "failed": len(a_runs) - len(ok_a),
            "ttft": _ms([r["ttft"] for r in ok_a]),
            "latency": _ms([r["seconds"] for r in ok_a]),
            "running": _ms([r["seconds"] - r["ttft"] for r in ok_a]),
            "drain_s": round(drained, 2),
        },
    }


def run_tenants(
    url: str, heads: dict[str, dict[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    """The ``--tenants`` phases (module docstring): B alone, B beside A's burst with its own
    tenant, B beside it with A's tenant."""
    keys = {
        t: httpx.post(f"{url}/v1/keys", json={}, headers=h).json()["key_id"]
        for t, h in heads.items()
    }

    def bodies(tenant: str, nonce: int) -> list[dict[str, Any]]:
        return [
            {
                "key_id": keys[tenant],
                "messages": messages,
                "max_new_tokens": args.tenants_tokens,
                "method": "mpfr",
                "drafter": "ngram",
                "drafts": args.tenants_drafts,
                "lookahead": args.tenants_drafts,
                "nonce": nonce + i,
            }
            for i, messages in enumerate(eli5_messages(8))
        ]

    a = (heads["A"], bodies("A", 1000))
    warm = (heads["B"], [dict(bodies("B", 3000)[0], max_new_tokens=8)])
    asyncio.run(tenants_phase(url, None, warm, 1, 2))  # first forwards, pool threads
    phases = {}
    for name, other, b in [
        ("b_alone", None, (heads["B"], bodies("B", 2000))),
        ("b_beside_a_burst", a, (heads["B"], bodies("B", 2000))),
        ("b_beside_a_burst_as_tenant_a", a, (heads["A"], bodies("A", 2000))),
    ]:
        phase = asyncio.run(
            tenants_phase(url, other, b, args.tenants_burst, args.tenants_b_requests)
        )
        phase["load_average"] = os.getloadavg()
        print(name, json.dumps(phase), flush=True)
        phases[name] = phase
    return phases


def write_tenants(
    args: argparse.Namespace,
    phases: dict[str, Any],
    server_settings: dict[str, str],
    load_at_start: tuple[float, float, float],
) -> None:
    """The ``--tenants`` JSON, with B's ratios to B alone and the share check."""

    def p50(phase: str, who: str, what: str) -> float:
        return float(phases[phase][who][what]["p50_ms"])

    alone, fair, fifo = "b_alone", "b_beside_a_burst", "b_beside_a_burst_as_tenant_a"
    batch = int(server_settings.get("generation_batch", "8"))
    report = {
        "benchmark": "service_load_tenants",
        **_provenance(load_at_start),
        "model": "smollm2-135m-instruct (CPU, precision "
        f"{server_settings.get('precision', 'auto')})",
        "machine_load": args.machine_load,
        "server_settings": {k: v for k, v in server_settings.items() if k != "redis_url"},
        "generate": {
            "max_new_tokens": args.tenants_tokens,
            "method": "mpfr",
            "drafter": "ngram",
            "B": args.tenants_drafts,
            "L": args.tenants_drafts,
            "stream": True,
            "prompts": "data/prompts-eli5.jsonl[:8]",
            "a_in_flight": args.tenants_burst,
            "b_requests_one_at_a_time": args.tenants_b_requests,
        },
        "share": (
            "a free slot goes to the waiting tenant holding the fewest slots: B's request waits "
            "for one slot to free (at most one running request's remaining time), never behind "
            f"A's queue, then holds 1 of the {batch} slots; A keeps the other {batch - 1}"
        ),
        "phases": phases,
        "ratios": {
            "b_ttft_beside_burst_vs_alone": round(
                p50(fair, "b", "ttft") / p50(alone, "b", "ttft"), 2
            ),
            "b_latency_beside_burst_vs_alone": round(
                p50(fair, "b", "latency") / p50(alone, "b", "latency"), 2
            ),
            "b_latency_as_tenant_a_vs_alone": round(
                p50(fifo, "b", "latency") / p50(alone, "b", "latency"), 2
            ),
            "b_latency_as_tenant_a_vs_own_tenant": round(
                p50(fifo, "b", "latency") / p50(fair, "b", "latency"), 2
            ),
            "b_ttft_max_vs_a_running_max": round(
                phases[fair]["b"]["ttft"]["max_ms"] / phases[fair]["a"]["running"]["max_ms"], 2
            ),
        },
        "ratios_from": "medians (p50) of each phase; b_ttft_max_vs_a_running_max <= 1 is the "
        "share: B's wait for a slot is at most one of A's requests' running time",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


def write_sweep(
    args: argparse.Namespace,
    levels: list[dict[str, Any]],
    server_settings: dict[str, str],
    load_at_start: tuple[float, float, float],
) -> None:
    """The sweep's JSON (with the 1-vs-8-client ratios) and its plot."""
    summary = summarise(levels)
    lone = next((row for row in summary if row["clients"] == 1), None)
    ratios = {}
    if lone is not None:
        for row in summary:
            if row is lone:
                continue
            ratios[str(row["clients"])] = {
                "throughput_vs_one_client": round(
                    row["tokens_per_second"] / lone["tokens_per_second"], 2
                ),
                "p50_vs_lone": round(row["p50_ms"] / lone["p50_ms"], 2)
                if row["p50_ms"] and lone["p50_ms"]
                else None,
            }
    report = {
        "benchmark": "service_load_sweep",
        **_provenance(load_at_start),
        "model": "smollm2-135m-instruct (CPU, precision "
        f"{server_settings.get('precision', 'auto')})",
        "machine_load": args.machine_load,
        "server_settings": {k: v for k, v in server_settings.items() if k != "redis_url"},
        "generate": {
            "max_new_tokens": args.sweep_tokens,
            **({"sampler": "the service's defaults"} if args.sweep_defaults else SWEEP_SAMPLER),
            "prompts": f"data/prompts-eli5.jsonl[:{args.sweep_prompts}], nonce 1000+i",
        },
        "levels": levels,
        "summary": summary,
        "ratios": ratios,
        "ratios_from": "each concurrency's median over its interleaved repeats (summary)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    batch = server_settings.get("generation_batch", "8 (default)")
    plot_sweep(
        summary,
        args.out.with_suffix(".png"),
        f"POST /v1/generate, {'defaults' if args.sweep_defaults else 'mpfr/ngram B=L=4'}, "
        f"{args.sweep_tokens} tokens, generation_batch="
        f"{batch}; {report['machine']['cpu_model']}, {os.cpu_count()} cores, load "
        f"{load_at_start[0]:.1f}",
    )


if __name__ == "__main__":
    main()
