"""Decoding speed of the service container beside the native install, on one machine.

``scripts/compose_smoke.sh`` runs it once the compose project is up. Two worker processes load
the model with precision ``auto`` (what ``poissonmark serve`` does): one in the running service
container (``docker exec``, the image's packages and llama.cpp build), one in the native install
(``scripts/setup.sh``'s ``.venv``, this checkout's packages). The driver then asks them in turn,
alternating which goes first (ABBA), for the same generation: the same prompt, key secret,
nonce and token count, for each method (default: ``mpfr`` with the ``ngram`` drafter, B 4,
L 4, tree ``auto`` — the defaults of ``POST /v1/generate`` — and ``basic-uwm``, one target
forward per token). Tokens/s is ``GenerationStats.tokens_per_second`` (emitted tokens over the
decoding seconds, the prefill apart), as ``/v1/generate`` reports it. The summary: each side's
median and best run, and three ratios container / native: of the medians, of the best runs
(the least disturbed on a shared machine) and the median of the per-repetition ratios (each
repetition's two runs are neighbours in time).

The driver needs only the standard library (it runs under the host's ``python3``); the same
file is the worker (``python -c SOURCE worker``), so nothing has to be copied into the image.

    python3 scripts/compose_speed.py --container ID --native-python .venv/bin/python \\
        --out speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
PROMPT = "Explain in detail why the sky is blue."
SECRET = bytes(range(32))
"""A public bench key: both workers draw the same keyed race, so they emit the same tokens
where their logits agree."""
NONCE = 7
MARK = "@@compose_speed "
"""Prefix of the worker's protocol lines on stdout; anything else there is ignored."""


def worker(tokens: int) -> None:
    """Load the model as the service does, say what was loaded, then run one generation per
    method name read from stdin, answering one line each."""
    import hashlib
    import re

    from keyed import KeyedSource, Secret
    from sampler.completion import complete, prompt_ids
    from sampler.methods import SamplerConfig
    from sampler.models import load_model

    def say(record: dict[str, Any]) -> None:
        sys.stdout.write(MARK + json.dumps(record) + "\n")
        sys.stdout.flush()

    home = Path(os.environ.get("POISSONMARK_HOME", "~/.local/share/poissonmark")).expanduser()
    start = time.perf_counter()
    loaded = load_model(MODEL, home, "cpu", precision="auto")
    info: dict[str, Any] = {"precision": loaded.precision, "load_s": time.perf_counter() - start}
    if loaded.precision == "gguf":
        import llama_cpp

        from sampler.targets.llamacpp import repacking_safe

        maps = Path("/proc/self/maps").read_text()
        backends = sorted(set(re.findall(r"/(libggml-cpu[\w.-]*\.so)", maps)))
        info.update(
            llama_cpp=llama_cpp.__version__,
            cpu_backend=backends,
            system_info=llama_cpp.llama_print_system_info().decode().strip(),
            repacking=repacking_safe(),
        )
    ids = prompt_ids(loaded, PROMPT)
    say({"ready": info})
    for line in sys.stdin:
        method = line.strip()
        if not method:
            continue
        config = SamplerConfig(method, 4, 4, tokens, tree="auto")
        source = KeyedSource(Secret(SECRET), context_width=4, masking=True, nonce=NONCE)
        out = complete(loaded, ids, config, source, "ngram" if config.speculative else None)
        stats = out.result.stats
        digest = hashlib.sha256(repr(out.result.token_ids).encode()).hexdigest()[:16]
        say(
            {
                "method": method,
                "tokens": stats.emitted_tokens,
                "seconds": stats.seconds,
                "prefill_seconds": stats.prefill_seconds,
                "tokens_per_second": stats.tokens_per_second,
                "target_forward_passes": stats.target_forward_passes,
                "tokens_digest": digest,
            }
        )


class Worker:
    """One worker process and its line protocol."""

    def __init__(self, name: str, argv: list[str], cwd: str | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                record: dict[str, Any] = json.loads(line[len(MARK) :])
                return record
        raise RuntimeError(f"{self.name} worker exited ({self.proc.wait()}) before answering")

    def run(self, method: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(method + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def drive(args: argparse.Namespace) -> dict[str, Any]:
    source = Path(__file__).read_text()
    tail = ["worker", "--tokens", str(args.tokens)]
    workers = {
        "container": Worker(
            "container",
            ["docker", "exec", "-i", args.container, "python", "-u", "-c", source, *tail],
        ),
        "native": Worker(
            "native",
            [args.native_python, "-u", "-c", source, *tail],
            cwd=str(Path(__file__).resolve().parents[1]),  # this checkout's packages
        ),
    }
    try:
        ready = {name: w.read()["ready"] for name, w in workers.items()}
        for w in workers.values():  # warm-up: the tree profile, the caches (not recorded)
            for method in args.methods:
                w.run(method)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {m: [] for m in args.methods} for name in workers
        }
        order = list(workers)
        for rep in range(args.reps):
            for method in args.methods:
                for name in order if rep % 2 == 0 else order[::-1]:
                    runs[name][method].append(workers[name].run(method))
    finally:
        for w in workers.values():
            w.close()
    result: dict[str, Any] = {
        "prompt": PROMPT,
        "max_new_tokens": args.tokens,
        "repetitions": args.reps,
        "order": "interleaved, alternating which side goes first, after one warm-up per method",
    }
    medians: dict[str, dict[str, float]] = {}
    best: dict[str, dict[str, float]] = {}
    for name in workers:
        rates = {m: [r["tokens_per_second"] for r in runs[name][m]] for m in args.methods}
        medians[name] = {m: statistics.median(v) for m, v in rates.items()}
        best[name] = {m: max(v) for m, v in rates.items()}
        result[name] = {
            **ready[name],
            "tokens_per_second": {m: round(v, 1) for m, v in medians[name].items()},
            "best_tokens_per_second": {m: round(v, 1) for m, v in best[name].items()},
            "runs": runs[name],
        }
    result["ratio_container_to_native"] = {
        m: round(medians["container"][m] / medians["native"][m], 3) for m in args.methods
    }
    result["ratio_best"] = {
        m: round(best["container"][m] / best["native"][m], 3) for m in args.methods
    }
    # each repetition's two runs are neighbours in time: their ratio cancels slow load changes
    result["ratio_paired_median"] = {
        m: round(
            statistics.median(
                c["tokens_per_second"] / n["tokens_per_second"]
                for c, n in zip(runs["container"][m], runs["native"][m], strict=True)
            ),
            3,
        )
        for m in args.methods
    }
    result["same_tokens"] = {
        m: len({r["tokens_digest"] for name in workers for r in runs[name][m]}) == 1
        for m in args.methods
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="drive", choices=("drive", "worker"))
    parser.add_argument("--container", help="the running service container (id or name)")
    parser.add_argument("--native-python", help="python of the native install (.venv/bin/python)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--methods", nargs="+", default=["mpfr", "basic-uwm"])
    parser.add_argument("--out", type=Path, help="write the result here (JSON)")
    args = parser.parse_args()
    if args.role == "worker":
        worker(args.tokens)
        return
    if not args.container or not args.native_python:
        parser.error("--container and --native-python are required")
    result = drive(args)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    for name in ("container", "native"):
        r = result[name]
        print(
            f"{name:9s} precision {r['precision']}, CPU backend {r.get('cpu_backend')}: "
            + ", ".join(f"{m} {v} tok/s" for m, v in r["tokens_per_second"].items())
        )
    print(
        "ratio container/native: medians "
        + json.dumps(result["ratio_container_to_native"])
        + ", best runs "
        + json.dumps(result["ratio_best"])
        + ", paired median "
        + json.dumps(result["ratio_paired_median"])
    )


if __name__ == "__main__":
    main()
