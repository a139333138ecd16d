"""Where a decoding step's time goes on this CPU: model forward passes versus the decoder.

For each method (real model, shared prompts), forward hooks on the target and on the drafter's
model add up the wall time spent inside their forward passes; the rest of the generation's
time (``GenerationStats.seconds``, prefill excluded) is the decoder's own overhead: tree
building, context keys (BLAKE2b), clocks (Philox), the race, KV selection, bookkeeping, and
the n-gram lookup for ``ngram`` (a heads drafter's pass counts as its model time). Goal
(issue 5): overhead <= 10 % of the step.
A cProfile of one ``mpfr`` generation (top functions by own time) goes next to the JSON.

    python -m bench.decoder_profile [--prompts 4] [--tokens 64]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, environment, shared_prompts
from keyed import KeyedSource, Secret
from sampler.completion import complete, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.drafters import make_drafter
from sampler.models import DEFAULT_MODEL, load_model

CELLS = [
    ("basic-uwm", None),
    ("mpfr", "ngram"),
    ("mpfr", "self:4"),
    ("mpfr", "heads"),
    ("gls", "ngram"),
]


class ForwardTimer:
    """Wall seconds spent inside a module's forward calls (pre/post forward hooks)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.seconds = 0.0
        self._start = 0.0
        self._handles = [
            module.register_forward_pre_hook(self._pre),
            module.register_forward_hook(self._post),
        ]

    def _pre(self, *_: Any) -> None:
        self._start = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._start

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


class HeadsTimer:
    """Wall seconds inside a heads drafter's pass (its fusion, residual blocks and the target's
    LM head: the drafter's model cost, like a model drafter's forward)."""

    def __init__(self, drafter: Any) -> None:
        self.seconds = 0.0
        self._heads = drafter.heads
        inner = self._heads.logits

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args)
            finally:
                self.seconds += time.perf_counter() - start

        self._heads.logits = timed

    def close(self) -> None:
        del self._heads.logits  # back to the class's method


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    home = os.environ.get("POISSONMARK_HOME", "~/.local/share/poissonmark")
    parser.add_argument("--home", type=Path, default=Path(home).expanduser())
    args = parser.parse_args()
    loaded = load_model(DEFAULT_MODEL, args.home, device="auto")
    prompts = shared_prompts(args.prompts)
    cells: dict[str, Any] = {}
    for method, spec in CELLS:
        name = method if spec is None else f"{method}/{spec}"
        totals = {"seconds": 0.0, "target_forward_seconds": 0.0, "drafter_forward_seconds": 0.0,
                  "target_forward_passes": 0, "emitted_tokens": 0}  # fmt: skip
        for i, row in enumerate(prompts):
            source = KeyedSource(Secret(hashlib.sha256(b"profile-%d" % i).digest()), 4, True, i)
            ids = prompt_ids(loaded, messages=row["messages"])
            drafter = make_drafter(spec, loaded.target) if spec else None
            target_timer = ForwardTimer(loaded.model)
            drafter_model = getattr(drafter, "model", None)
            drafter_timer: ForwardTimer | HeadsTimer | None = None
            if drafter_model is not None:
                drafter_timer = ForwardTimer(drafter_model)
            elif getattr(drafter, "heads", None) is not None:
                drafter_timer = HeadsTimer(drafter)
            try:
                out = complete(loaded, ids, SamplerConfig(method, 4, 4, args.tokens), source,
                               drafter)  # fmt: skip
            finally:
                target_timer.close()
                if drafter_timer is not None:
                    drafter_timer.close()
            s = out.result.stats
            totals["seconds"] += s.seconds
            # the prefill's forward is outside ``seconds``: take it out of the target's time
            totals["target_forward_seconds"] += target_timer.seconds - s.prefill_seconds
            totals["drafter_forward_seconds"] += drafter_timer.seconds if drafter_timer else 0.0
            totals["target_forward_passes"] += s.target_forward_passes
            totals["emitted_tokens"] += s.emitted_tokens
        model = totals["target_forward_seconds"] + totals["drafter_forward_seconds"]
        totals["overhead_seconds"] = totals["seconds"] - model
        totals["overhead_fraction"] = totals["overhead_seconds"] / totals["seconds"]
        totals["overhead_ms_per_step"] = (
            1e3 * totals["overhead_seconds"] / max(totals["target_forward_passes"], 1)
        )
        cells[name] = totals
        print(f"{name:16s} overhead {totals['overhead_fraction']:6.1%} "
              f"({totals['overhead_ms_per_step']:.1f} ms/step)")  # fmt: skip

    profile = cProfile.Profile()
    ids = prompt_ids(loaded, messages=prompts[0]["messages"])
    source = KeyedSource(Secret(hashlib.sha256(b"profile-0").digest()), 4, True, 0)
    profile.runcall(complete, loaded, ids, SamplerConfig("mpfr", 4, 4, args.tokens), source,
                    "ngram")  # fmt: skip
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    (RESULTS / "decoder_profile.txt").write_text(text.getvalue())
    result = {
        "benchmark": "decoder overhead outside model forward passes",
        "model": DEFAULT_MODEL, "device": str(loaded.device), "dtype": str(loaded.dtype),
        "config": {"drafts": 4, "lookahead": 4, "max_new_tokens": args.tokens,
                   "prompts": len(prompts), "processing": "T=1, top-k 50"},
        "load_average_at_end": os.getloadavg(),
        **environment(),
        "cells": cells,
    }  # fmt: skip
    (RESULTS / "decoder_profile.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
