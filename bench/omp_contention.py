"""Target forward time under CPU contention: the row-invariant bfloat16 runner against
transformers float32, by OpenMP wait policy and thread count (issue 18/19 robustness).

Each configuration runs in a fresh process (the OpenMP policy is read once, at start-up), with
``--busy`` ``nice -n 19`` busy loops (other work on the cores, e.g. the HTTP loop or detection)
or none. A forward is q new tokens after 200 cached random tokens; the figure is the median of 7.

    python -m bench.omp_contention --out bench/results/omp_contention.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS, environment

CHILD = """
import json, sys, time, torch
from pathlib import Path
from sampler.cached_lm import open_cache
from sampler.models import DEFAULT_MODEL, load_model
torch.set_num_threads(int(sys.argv[1]))
home = Path(sys.argv[2])
out = {}
ids = torch.randint(0, 49152, (240,), generator=torch.Generator().manual_seed(0)).tolist()
with torch.inference_mode():
    for precision in ("bfloat16", "float32"):
        cache = open_cache(load_model(DEFAULT_MODEL, home, device="cpu", precision=precision).model)
        cache.extend(ids[:200])
        for q in (1, 16):
            times = []
            for _ in range(7):
                started = time.perf_counter()
                cache.extend(ids[200 : 200 + q])
                times.append(time.perf_counter() - started)
                cache.keep(200, [])
            out[f"{precision} q={q}"] = round(sorted(times)[3] * 1e3, 1)
print(json.dumps(out))
"""


def measure(threads: int, policy: str | None, busy: int, home: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    loops = [
        subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
        for _ in range(busy)
    ]
    try:
        time.sleep(0.5)
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(threads), str(home)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        for loop in loops:
            loop.kill()
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "omp_contention.json")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    rows = []
    for busy in (0, args.busy):
        for threads, policy in ((2, None), (2, "PASSIVE"), (1, None)):
            ms = measure(threads, policy, busy, args.home)
            rows.append({"busy_loops": busy, "threads": threads,
                         "omp_wait_policy": policy or "default", "forward_ms": ms})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    report = {
        "bench": "omp_contention",
        "model": "smollm2-135m-instruct",
        "forward": "q new tokens after 200 cached random tokens, median of 7",
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        **environment(),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
