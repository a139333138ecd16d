"""Wall time of a one-shot ``poissonmark detect --key K --text ...``.

Whole processes, start-up included, as a user runs them: a fresh data dir (its own embedded
Redis) sharing the converted model (warm disk cache), one key made by ``keys create``, then
``--runs`` timed ``detect`` runs after one untimed warm-up. Per run: wall seconds (a monotonic
clock around the child) and CPU seconds (the child's user + system time, which other load on
shared cores inflates less than wall time). The load average at the start and end is recorded:
on shared cores, read the wall figures with it.

``--checkout DIR`` runs the commands from another checkout of the repository (e.g. a ``git
worktree`` of the commit before a change), with this interpreter:

    python -m bench.cli_detect_time --label after
    python -m bench.cli_detect_time --label before --checkout /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS
from bench.detector_common import MODEL, data_home, run_metadata

TEXT = (
    "The quick brown fox jumps over the lazy dog, then naps in the sun while the farmer "
    "counts his sheep twice and forgets the number each time."
)


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stdout


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="before or after (names the output)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--checkout", type=Path, default=RESULTS.parents[1])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or RESULTS / f"cli_detect_time_{args.label}.json"
    shared = data_home() / "models"
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "models").symlink_to(shared, target_is_directory=True)
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POISSONMARK_KEK")}
        env["POISSONMARK_HOME"] = str(home)
        load_start = os.getloadavg()
        _, _, created = _run(["keys", "create", "--json"], args.checkout, env)
        key = json.loads(created)["key_id"]
        command = ["detect", "--key", key, "--text", TEXT]
        _run(command, args.checkout, env)  # warm-up: disk cache, compiled-kernel cache
        walls, cpus = [], []
        for _ in range(args.runs):
            wall, cpu, _ = _run(command, args.checkout, env)
            walls.append(wall)
            cpus.append(cpu)
        load_end = os.getloadavg()
    payload: dict[str, Any] = {
        "bench": "cli_detect_time",
        "label": args.label,
        **run_metadata(),
        "checkout": str(args.checkout),
        "checkout_commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=args.checkout, capture_output=True, text=True
        ).stdout.strip(),
        "command": "python -m service.cli detect --key K --text TEXT (" + f"{len(TEXT)} chars)",
        "model": MODEL,
        "runs": args.runs,
        "wall_s": _spread(walls),
        "cpu_s": _spread(cpus),
        "wall_per_run": walls,
        "cpu_per_run": cpus,
        "load_average_1min": {"start": load_start[0], "end": load_end[0]},
        "target_wall_s": 1.5,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps({"wall_s": payload["wall_s"], "cpu_s": payload["cpu_s"]}))


if __name__ == "__main__":
    main()
