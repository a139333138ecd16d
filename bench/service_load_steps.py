"""One batched step against the same requests' solo steps, in one process, interleaved (issue 19).

R requests (held-out ELI5 prompts, mpfr, B = L = 4, 128-token budget) are started three times
over; each round runs one solo ``loop.step`` per request of the first copy, one
``batch.step_many`` of the second, and one ``step_many`` under each ``--budgets`` node budget
of further copies, so every variant sees the same machine load. Reports the median wall time
per round and the tokens each variant emitted (the budget's trees are smaller: fewer tokens
per step, the same tokens in the end, Thm. 5.1), and generated tokens/s per variant:

    python -m bench.service_load_steps --drafters ngram heads --budgets 24 48 80
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import DATA, RESULTS, environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafters", nargs="*", default=["ngram", "heads"])
    parser.add_argument("--budgets", type=int, nargs="*", default=[24, 48, 80])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--machine-load", default="")
    parser.add_argument("--out", type=Path, default=RESULTS / "service_load_steps.json")
    args = parser.parse_args()

    from keyed import KeyedSource, Secret
    from sampler.batch import step_many
    from sampler.completion import prompt_ids
    from sampler.decoder import SamplerConfig
    from sampler.drafters import fresh_drafter, make_drafter
    from sampler.loop import SequenceState, start, step
    from sampler.models import DEFAULT_MODEL, load_model

    home = Path(os.environ.get("POISSONMARK_HOME", "~/.local/share/poissonmark")).expanduser()
    loaded = load_model(DEFAULT_MODEL, home, device="cpu")
    lines = (DATA / "prompts-eli5.jsonl").read_text().splitlines()[: args.requests]
    prompts = [prompt_ids(loaded, messages=json.loads(line)["messages"]) for line in lines]
    config = SamplerConfig("mpfr", 4, 4, 128)
    rows: list[dict[str, Any]] = []
    load_at_start = os.getloadavg()
    for spec in args.drafters:
        proto = make_drafter(spec, loaded.target)

        def copies() -> list[SequenceState]:
            return [
                start(
                    loaded.target,
                    ids,
                    config,
                    KeyedSource(Secret(bytes([i + 1]) * 32), 4, True, i),
                    fresh_drafter(proto),  # noqa: B023 - used at once, in this iteration
                    frozenset(),
                )
                for i, ids in enumerate(prompts)
            ]

        variants: dict[str, tuple[list[SequenceState], Any]] = {
            "solo steps": (copies(), None),
            "step_many": (copies(), None),
            **{f"step_many, node budget {b}": (copies(), b) for b in args.budgets},
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (seqs, budget) in variants.items():
                began = time.perf_counter()
                if name == "solo steps":
                    for seq in seqs:
                        step(seq)
                else:
                    step_many(seqs, budget)
                times[name].append(time.perf_counter() - began)
        for name, (seqs, _) in variants.items():
            tokens = sum(s.history.emitted for s in seqs)
            seconds = sum(times[name])
            rows.append(
                {
                    "drafter": spec,
                    "variant": name,
                    "median_round_ms": round(statistics.median(times[name]) * 1000, 1),
                    "tokens": tokens,
                    "tokens_per_second": round(tokens / seconds, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    report = {
        "benchmark": "service_load_steps",
        **environment(),
        "model": "smollm2-135m-instruct (float32, CPU)",
        "requests": args.requests,
        "rounds": args.rounds,
        "config": {"method": "mpfr", "B": 4, "L": 4, "max_new_tokens": 128},
        "machine_load": args.machine_load,
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "rows": rows,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
