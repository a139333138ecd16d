"""What a token costs besides llama.cpp's forward, on precision gguf (issue 18), in one process.

- ``after_forward_us``: ``torch.topk`` of 50 over the (1, V) logits and the compiled top-k
  (``sampler.topk``), each timed right after a one-token llama.cpp forward and again at once
  (warm); medians over ``--calls`` forwards;
- ``variants``: ``--prompts`` chat prompts x 128 tokens, T = 1, top-k 50, the same key per
  prompt, every variant on every prompt in a turning order, one warm-up pass untimed:
  ``basic-uwm`` with every compiled kernel switched off (NumPy clocks, torch's top-k,
  log-softmax and race), with the compiled clocks and top-k only (the default before
  ``sampler.compiled``), with all of them (the default), and the default ``mpfr`` (drafter
  ``ngram``, B = L = 4, tree ``auto``). Per variant: tokens/s (decode, prefill excluded), the
  llama.cpp decode calls by batch size with their median milliseconds, and whether the ids
  equal the default basic-uwm's.

    python -m bench.gguf_step_costs [--prompts 8] [--calls 64]

Writes ``bench/results/gguf_step_costs.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import keyed
from bench.common import RESULTS, environment, shared_prompts
from keyed import KeyedSource, Secret, _kernel_loader
from sampler import gguf_target, processing, race, topk
from sampler.completion import complete, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.drafters import make_drafter
from sampler.models import DEFAULT_MODEL, load_model

TOKENS = 128


@contextmanager
def kernels(clocks: bool, top: bool, law: bool = True) -> Iterator[None]:
    """The compiled clocks, top-k and log-softmax + race on or off (off: NumPy, ``torch.topk``
    and torch's log-softmax and race; the first two give the same bits, the last the same law
    up to the last bit, ``sampler.compiled``)."""
    saved = (
        _kernel_loader.kernels_for, topk._loaded, processing._logp_kernel, race._race_kernel,
    )  # fmt: skip
    if not clocks:
        _kernel_loader.kernels_for = lambda work: None  # type: ignore[assignment]
    if not top:
        topk._loaded = lambda: None  # type: ignore[assignment]
    if not law:
        processing._logp_kernel = lambda: None  # type: ignore[assignment]
        race._race_kernel = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        (
            _kernel_loader.kernels_for, topk._loaded, processing._logp_kernel, race._race_kernel,
        ) = saved  # fmt: skip


def after_forward(target: gguf_target.GgufTarget, calls: int) -> dict[str, Any]:
    cache = target.new_cache()
    cache.extend([(31 * i + 7) % target.vocab_size for i in range(200)])
    kernel = topk._loaded()
    assert kernel is not None
    ways = {
        "torch.topk": lambda x: torch.topk(x, 50, dim=-1),
        "compiled": lambda x: topk.top_k(x, 50),
    }
    timed: dict[str, list[float]] = defaultdict(list)
    for j in range(calls):
        logits = cache.extend([(7 * j + 3) % target.vocab_size])
        name = list(ways)[j % 2]
        began = time.perf_counter()
        ways[name](logits)
        middle = time.perf_counter()
        ways[name](logits)
        timed[f"{name} after forward"].append(middle - began)
        timed[f"{name} warm"].append(time.perf_counter() - middle)
    return {name: round(statistics.median(v) * 1e6, 1) for name, v in timed.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "gguf_step_costs.json")
    args = parser.parse_args()
    loaded = load_model(DEFAULT_MODEL, args.home, "cpu", precision="gguf")
    assert keyed.warm_up() and topk.warm_up()
    assert processing._logp_kernel() is not None and race._race_kernel() is not None
    target = loaded.target
    assert isinstance(target, gguf_target.GgufTarget)
    drafter = make_drafter("ngram", loaded.target)
    basic = SamplerConfig("basic-uwm", max_new_tokens=TOKENS)
    variants: dict[str, tuple[SamplerConfig, bool, bool, bool]] = {
        "basic-uwm, NumPy clocks, torch top-k, log-softmax and race": (basic, False, False, False),
        "basic-uwm, compiled clocks and top-k, torch log-softmax and race": (
            basic, True, True, False,
        ),
        "basic-uwm (default kernels)": (basic, True, True, True),
        "mpfr ngram B4 L4 auto (default)": (
            SamplerConfig("mpfr", 4, 4, TOKENS, tree="auto"), True, True, True,
        ),
    }  # fmt: skip
    names = list(variants)
    decode_calls: dict[str, dict[int, list[float]]] = {
        n: defaultdict(list) for n in [*names, "warm-up"]
    }
    current = [names[0]]
    original = gguf_target.GgufTarget._decode_part

    def timed_decode(self: Any, ctx: Any, part: Any, *rest: Any) -> None:
        began = time.perf_counter()
        original(self, ctx, part, *rest)
        if len(part) <= 8:  # the steps' forwards, not the prefills
            decode_calls[current[0]][len(part)].append(time.perf_counter() - began)

    gguf_target.GgufTarget._decode_part = timed_decode  # type: ignore[method-assign]
    prompts = shared_prompts(args.prompts)
    totals = {n: [0, 0.0] for n in names}
    ids_of: dict[str, list[list[int]]] = {n: [] for n in names}
    for rep in range(2):  # the first pass warms up, untimed
        for i, prompt in enumerate(prompts):
            ids = prompt_ids(loaded, messages=prompt["messages"])
            for name in names[i % len(names) :] + names[: i % len(names)]:
                config, clocks, top, law = variants[name]
                current[0] = name if rep else "warm-up"
                source = KeyedSource(Secret(hashlib.sha256(b"step-%d" % i).digest()), 4, True, i)
                speculative = config.method == "mpfr"
                with kernels(clocks, top, law):
                    out = complete(loaded, ids, config, source, drafter if speculative else None)
                if rep:
                    totals[name][0] += out.result.stats.emitted_tokens
                    totals[name][1] += out.result.stats.seconds
                    ids_of[name].append(list(out.result.token_ids))
    gguf_target.GgufTarget._decode_part = original  # type: ignore[method-assign]
    reference = ids_of["basic-uwm (default kernels)"]
    rows = {}
    for name in names:
        tokens, seconds = totals[name]
        rows[name] = {
            "tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_second": round(tokens / seconds, 2),
            "decode_calls": {
                str(q): {"count": len(v), "median_ms": round(statistics.median(v) * 1e3, 3)}
                for q, v in sorted(decode_calls[name].items())
            },
            "identical_to_basic_uwm": sum(
                a == b for a, b in zip(ids_of[name], reference, strict=True)
            ),
        }
    base = rows["basic-uwm (default kernels)"]["tokens_per_second"]
    result = {
        "bench": "gguf_step_costs",
        "model": DEFAULT_MODEL,
        "weights": target.weights,
        "threads": target.threads,
        "prompts": len(prompts),
        "tokens": TOKENS,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        **environment(),
        "after_forward_us": after_forward(target, args.calls),
        "variants": rows,
        "ratios_to_default_basic_uwm": {
            n: round(r["tokens_per_second"] / base, 3) for n, r in rows.items()
        },
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("after_forward_us", "ratios_to_default_basic_uwm")}))


if __name__ == "__main__":
    main()
