"""Entropy-aware weighting of the Aaronson test (issue 15 item 5): does it reach α sooner?

Generations: SmolLM2-135M-Instruct, ``mpfr`` (drafter ``ngram``, B = L = 4; its tokens equal
``basic-uwm``'s), 128 new tokens, the bench key with a per-prompt nonce, at T = 0.7, top-p
0.95, top-k off (the setting the issue names) and, for reference, at T = 1, top-k 50 (the
held-out file ``bench/results/detector_heldout.jsonl`` of ``bench.detector_generations``).
Prompts: ``bench.detector_generations.chosen_prompts`` — the *design* set is ranks 0-9 of
each task (the prompts the detector's statistics were designed on), the *held-out* set ranks
20-29 (the held-out prompts of issue 15). The weight function was chosen on the design set
only (``choose``) and frozen in ``detector.weighted`` before the held-out numbers were run.

Entropies: ``sampler.entropy.processed_entropy`` on the generated ids alone (what the detector
sees: no prompt), with the generation's processing.

For every generation and prefix length n (in scored tokens) the plain Aaronson p and the
weighted p (``detector.weighted``) are computed; "tokens to reach α" is the smallest n with
p < α = 0.01 (None: never within the 128 tokens, counted as +inf in the median). TPR at 1 %
FPR: the threshold is the 1 % quantile of each test's whole-text log10 p on the human passages
(``data/human-pydoc.jsonl``, their own entropies) under the bench key. H0 FPR of the weighted
test: the fraction of human passages × ``H0_KEYS`` keys with p < α, with its binomial 99 %
upper bound.

Run from the repository root::

    python -m bench.detector_entropy generate   # cached, resumable JSONL
    python -m bench.detector_entropy choose     # design set: weight-function candidates
    python -m bench.detector_entropy run        # held-out: writes detector_entropy.json/.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS
from bench.detector_common import BENCH_KEY_NAME, DATA, bench_source, data_home, run_metadata
from bench.detector_generations import _rank, chosen_prompts
from detector import DetectOptions, detect
from detector.stats import aaronson_log_sf
from detector.weighted import (
    ENTROPY_WEIGHTING,
    EntropyWeighting,
    entropy_weighted_test,
    weighted_log_sf,
)
from keyed import KeyedSource

GENERATIONS = RESULTS / "detector_entropy_generations.jsonl"
HELDOUT_T1 = RESULTS / "detector_heldout.jsonl"
OUT_JSON = RESULTS / "detector_entropy.json"
OUT_MD = RESULTS / "detector_entropy.md"
CACHE = Path(tempfile.gettempdir()) / "poissonmark-detector-entropy-cache.npz"
"""Entropies per (setting, text), so that ``choose`` and ``run`` compute each once."""
ALPHA = 0.01
H0_KEYS = 20
HUMAN_TEXTS_OF = {"t0.7": 20, "t1": 10}
"""Human passages per setting (whole passages, the first of ``data/human-pydoc.jsonl``): 20 at
T = 0.7 (the issue's setting), 10 at T = 1 (the reference). Few: the shared 2-core machine
gave this run about one core, and a first run over 100 passages per setting did not finish in
the session's time."""
TIMED_TEXTS = 5
"""Held-out generations per setting whose entropy computation is timed (the CPU cost)."""
MAX_NEW_TOKENS = 128
SETTINGS: dict[str, dict[str, Any]] = {
    "t0.7": {"temperature": 0.7, "top_k": 0, "top_p": 0.95},
    "t1": {"temperature": 1.0, "top_k": 50, "top_p": 1.0},
}
SPLITS = {"design": 0, "heldout": 20}  # prompts of each task skipped (chosen_prompts)


def generate(setting: str, split: str) -> None:
    """Generate (and cache in ``GENERATIONS``) 10 + 10 prompts of ``split`` at ``setting``."""
    from sampler.completion import complete, prompt_ids
    from sampler.decoder import SamplerConfig
    from sampler.models import DEFAULT_MODEL, load_model
    from sampler.processing import Processing

    done: set[tuple[str, str]] = set()
    if GENERATIONS.exists():
        rows = [json.loads(line) for line in GENERATIONS.read_text().splitlines() if line]
        done = {(r["setting"], r["id"]) for r in rows}
    todo = [p for p in chosen_prompts(10, SPLITS[split]) if (setting, p["id"]) not in done]
    print(f"{setting} {split}: {len(todo)} to generate -> {GENERATIONS}")
    if not todo:
        return
    loaded = load_model(DEFAULT_MODEL, data_home(), device="cpu")
    params = SETTINGS[setting]
    processing = Processing(params["temperature"], params["top_k"], params["top_p"])
    config = SamplerConfig("mpfr", 4, 4, MAX_NEW_TOKENS, processing)
    base = bench_source()
    for prompt in todo:
        nonce = int(_rank(str(prompt["id"])), 16)
        source = KeyedSource(base.secret, base.context_width, base.masking, nonce)
        ids = prompt_ids(loaded, messages=prompt["messages"])  # type: ignore[arg-type]
        start = time.perf_counter()
        out = complete(loaded, ids, config, source, "ngram")
        row = {
            "id": prompt["id"],
            "setting": setting,
            "split": split,
            "key": BENCH_KEY_NAME,
            "method": out.result.method,
            **params,
            "max_new_tokens": MAX_NEW_TOKENS,
            "nonce": nonce,
            "finish_reason": out.result.finish_reason,
            "watermark_applied": out.result.watermark_applied,
            "token_ids": list(out.result.token_ids),
            "text": out.text,
            "seconds": round(time.perf_counter() - start, 2),
        }
        with GENERATIONS.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"  {prompt['id']}: {len(row['token_ids'])} tokens, {row['seconds']} s")


def processing_of(setting: str) -> Any:
    from sampler.processing import Processing

    params = SETTINGS[setting]
    return Processing(params["temperature"], params["top_k"], params["top_p"])


def generations(setting: str, split: str) -> list[dict[str, Any]]:
    """The cached generations of (setting, split); T = 1 comes from the issue-15 files."""
    if setting == "t1":
        path = HELDOUT_T1 if split == "heldout" else RESULTS / "detector_generations.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        if split == "design":  # ranks 0-9 of each task, like the T = 0.7 design set
            wanted = {str(p["id"]) for p in chosen_prompts(10, 0)}
            rows = [r for r in rows if r["id"] in wanted]
        return rows
    rows = [json.loads(line) for line in GENERATIONS.read_text().splitlines() if line]
    return [r for r in rows if r["setting"] == setting and r["split"] == split]


class Entropies:
    """Per-text entropies under a setting, cached in ``CACHE`` (keyed by setting and text id)."""

    def __init__(self) -> None:
        from sampler.models import DEFAULT_MODEL, load_model

        self.loaded = load_model(DEFAULT_MODEL, data_home(), device="cpu")
        bos = self.loaded.tokenizer.bos_token_id
        self.prefix = [] if bos is None else [int(bos)]
        self.cache: dict[str, np.ndarray] = {}
        if CACHE.exists():
            with np.load(CACHE) as f:
                self.cache = {k: f[k] for k in f.files}
        self.seconds = 0.0
        self.tokens = 0

    def of(self, setting: str, name: str, ids: list[int], timed: bool = False) -> np.ndarray:
        """The entropies of ``ids``; ``timed``: their computing time must be known (in the
        cache as ``key|seconds``), else they are computed again."""
        key = f"{setting}|{name}"
        stale = key not in self.cache or self.cache[key].shape != (len(ids),)
        if stale or (timed and f"{key}|seconds" not in self.cache):
            from sampler.entropy import processed_entropy

            start = time.perf_counter()
            h = processed_entropy(
                self.loaded.target, ids, processing_of(setting), prefix=self.prefix
            )
            self.cache[f"{key}|seconds"] = np.array([time.perf_counter() - start])
            self.cache[key] = h.numpy()
        if timed:
            self.seconds += float(self.cache[f"{key}|seconds"][0])
            self.tokens += len(ids)
        return self.cache[key]

    def save(self) -> None:
        np.savez_compressed(CACHE, **self.cache)


def text_curves(
    tokenizer: Any, ids: list[int], entropy: np.ndarray, weighting: EntropyWeighting, source: Any
) -> dict[str, np.ndarray]:
    """log10 p of every prefix, indexed by its number of scored tokens n = 1..M: the plain
    whole-text Aaronson p and the weighted p (a prefix's plan is the whole plan cut there)."""
    found = detect(tokenizer, source, token_ids=ids, options=DetectOptions())
    x = found.evidence.terms["aaronson"]  # (M,)
    w = weighting.weights(entropy)[found.evidence.skip == 0]  # (M,)
    plain = np.cumsum(x)
    weighted = np.cumsum(w * x)
    m = x.size
    plain_log10 = np.array([aaronson_log_sf(n, float(plain[n - 1])) for n in range(1, m + 1)])
    weighted_log10 = np.array(
        [weighted_log_sf(w[:n], float(weighted[n - 1]))[0] for n in range(1, m + 1)]
    )
    return {
        "plain": plain_log10 / math.log(10),
        "weighted": weighted_log10 / math.log(10),
        "weights": w,
        "terms": x,
    }


def tokens_to_alpha(curve: np.ndarray) -> float:
    """Smallest n (scored tokens) with log10 p < log10 α; inf if none."""
    hits = np.flatnonzero(curve < math.log10(ALPHA))
    return float(hits[0] + 1) if hits.size else math.inf


def tokens_to_stay(curve: np.ndarray) -> float:
    """Smallest n from which every longer prefix has p < α (the last passage); inf if the
    whole text is not below α."""
    above = np.flatnonzero(curve >= math.log10(ALPHA))
    if above.size == 0:
        return 1.0
    return math.inf if above[-1] + 1 == curve.size else float(above[-1] + 2)


BUDGETS = (16, 32, 64)


def median(values: list[float]) -> float | None:
    value = float(np.median(values))
    return value if math.isfinite(value) else None


def summarise(curves: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Tokens to reach α per generation, their medians and ratio, whole-text log10 p."""
    plain = [tokens_to_alpha(c["plain"]) for c in curves]
    weighted = [tokens_to_alpha(c["weighted"]) for c in curves]
    med_plain, med_weighted = median(plain), median(weighted)
    stay_plain = median([tokens_to_stay(c["plain"]) for c in curves])
    stay_weighted = median([tokens_to_stay(c["weighted"]) for c in curves])
    at_budget = {
        str(n): {
            test: float(np.median([c[test][n - 1] for c in curves if c[test].size >= n]))
            for test in ("plain", "weighted")
        }
        for n in BUDGETS
    }
    return {
        "generations": len(curves),
        "tokens_to_alpha_plain": [None if math.isinf(v) else int(v) for v in plain],
        "tokens_to_alpha_weighted": [None if math.isinf(v) else int(v) for v in weighted],
        "median_tokens_to_alpha_plain": med_plain,
        "median_tokens_to_alpha_weighted": med_weighted,
        "ratio_weighted_over_plain": None
        if med_plain is None or med_weighted is None
        else med_weighted / med_plain,
        "median_tokens_to_stay_below_alpha_plain": stay_plain,
        "median_tokens_to_stay_below_alpha_weighted": stay_weighted,
        "median_log10_p_at_scored_tokens": at_budget,
        "never_reached_plain": int(sum(map(math.isinf, plain))),
        "never_reached_weighted": int(sum(map(math.isinf, weighted))),
        "whole_text_log10_p_plain": [round(float(c["plain"][-1]), 4) for c in curves],
        "whole_text_log10_p_weighted": [round(float(c["weighted"][-1]), 4) for c in curves],
        "mean_weight": float(np.mean(np.concatenate([c["weights"] for c in curves]))),
        "zero_weight_fraction": float(
            np.mean(np.concatenate([c["weights"] for c in curves]) == 0.0)
        ),
    }


CANDIDATES = [
    EntropyWeighting(shape, scale, levels)
    for shape in ("ratio", "clip")
    for scale in (0.25, 0.5, 1.0, 2.0)
    for levels in (1, 4)
    if not (shape == "ratio" and levels == 1)
]


def choose() -> None:
    """Design set only: every candidate weighting's median tokens to α at T = 0.7 and T = 1."""
    from sampler.models import DEFAULT_MODEL, load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL, data_home())
    entropies = Entropies()
    source = bench_source()
    out: dict[str, Any] = {"candidates": {}}
    design = {s: generations(s, "design") for s in SETTINGS}
    for setting, rows in design.items():
        for r in rows:
            entropies.of(setting, r["id"], r["token_ids"])
    entropies.save()
    for weighting in CANDIDATES:
        name = f"{weighting.shape}:{weighting.scale}:{weighting.levels}"
        out["candidates"][name] = {}
        for setting, rows in design.items():
            curves = [
                text_curves(
                    tokenizer,
                    r["token_ids"],
                    entropies.of(setting, r["id"], r["token_ids"]),
                    weighting,
                    source,
                )
                for r in rows
            ]
            summary = summarise(curves)
            out["candidates"][name][setting] = {
                k: summary[k]
                for k in (
                    "median_tokens_to_alpha_plain",
                    "median_tokens_to_alpha_weighted",
                    "ratio_weighted_over_plain",
                    "never_reached_weighted",
                    "median_tokens_to_stay_below_alpha_plain",
                    "median_tokens_to_stay_below_alpha_weighted",
                    "median_log10_p_at_scored_tokens",
                    "mean_weight",
                )
            }
            print(name, setting, out["candidates"][name][setting])
    (RESULTS / "detector_entropy_design.json").write_text(json.dumps(out, indent=2) + "\n")


def human_ids(tokenizer: Any) -> list[tuple[str, list[int]]]:
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [
        (str(r["id"]), tokenizer(r["text"], add_special_tokens=False)["input_ids"]) for r in rows
    ]


def binomial_upper(k: int, n: int, level: float = 0.99) -> float:
    """One-sided Clopper–Pearson upper bound on a rate from k of n."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(level, k + 1, n - k))


def run() -> None:
    """Held-out: the frozen ``ENTROPY_WEIGHTING``, both settings, human H0."""
    from bench.service_load import cpu_facts
    from sampler.models import DEFAULT_MODEL, load_tokenizer

    load_start = os.getloadavg()
    tokenizer = load_tokenizer(DEFAULT_MODEL, data_home())
    entropies = Entropies()
    weighting = ENTROPY_WEIGHTING
    source = bench_source()
    humans = human_ids(tokenizer)
    results: dict[str, Any] = {
        "meta": {**run_metadata(), **cpu_facts(), "load_average_at_start": load_start},
        "alpha": ALPHA,
        "weighting": weighting.to_json(),
        "entropy_prefix": entropies.prefix,
        "settings": {},
    }
    for setting in SETTINGS:
        rows = generations(setting, "heldout")
        start_s, start_t = entropies.seconds, entropies.tokens
        curves = [
            text_curves(
                tokenizer,
                r["token_ids"],
                entropies.of(setting, r["id"], r["token_ids"], timed=i < TIMED_TEXTS),
                weighting,
                source,
            )
            for i, r in enumerate(rows)
        ]
        entropies.save()
        gen_s, gen_t = entropies.seconds - start_s, entropies.tokens - start_t
        summary = summarise(curves)
        # H0: human passages under H0_KEYS keys (entropies are key-independent: once per text)
        human_plain, human_weighted, methods = [], [], set()
        for key in range(H0_KEYS):
            key_source = bench_source(f"poissonmark-bench:entropy-h0:{key}")
            for name, ids in humans[: HUMAN_TEXTS_OF[setting]]:
                found = detect(tokenizer, key_source, token_ids=ids, options=DetectOptions())
                test = entropy_weighted_test(
                    found.evidence.skip,
                    found.evidence.terms["aaronson"],
                    entropies.of(setting, name, ids),
                    weighting,
                )
                human_plain.append(found.p_value.log10_p_value)
                human_weighted.append(test.log_p / math.log(10))
                methods.add(test.method)
        entropies.save()
        n = len(human_weighted)
        fp = int(np.sum(np.array(human_weighted) < math.log10(ALPHA)))
        fp_plain = int(np.sum(np.array(human_plain) < math.log10(ALPHA)))
        tpr = {}
        for test, human in (("plain", human_plain), ("weighted", human_weighted)):
            threshold = float(np.quantile(human, 0.01, method="lower"))
            marked = np.array([c[test][-1] for c in curves])
            tpr[test] = {"threshold_log10_p": threshold, "tpr": float(np.mean(marked < threshold))}
        results["settings"][setting] = {
            "processing": SETTINGS[setting],
            "generations_file": str((HELDOUT_T1 if setting == "t1" else GENERATIONS).name),
            **summary,
            "tpr_at_1pct_fpr": tpr,
            "h0_human": {
                "texts": HUMAN_TEXTS_OF[setting],
                "tokens_per_text": "whole passage (the first passages of the file)",
                "keys": H0_KEYS,
                "tests": n,
                "weighted_rejections": fp,
                "weighted_fpr": fp / n,
                "weighted_fpr_binomial99_upper": binomial_upper(fp, n),
                "plain_rejections": fp_plain,
                "plain_fpr": fp_plain / n,
                "plain_fpr_binomial99_upper": binomial_upper(fp_plain, n),
                "weighted_methods": sorted(methods),
                "human_tokens_median": float(np.median([len(ids) for _, ids in humans])),
            },
            "entropy_cpu": {
                "tokens": gen_t,
                "seconds": round(gen_s, 3),
                "ms_per_token": None if gen_t == 0 else round(1000 * gen_s / gen_t, 3),
                "note": f"sampler.entropy.processed_entropy on the first {TIMED_TEXTS} "
                "held-out generations (one "
                "causal forward per text, then the processing in float64), float32 weights, "
                "CPU, torch threads as in meta.hardware, measured while other jobs shared "
                "the CPU (see the load averages)",
            },
        }
        print(
            setting,
            json.dumps(
                {k: v for k, v in results["settings"][setting].items() if not isinstance(v, list)},
                indent=1,
            ),
        )
    results["meta"]["load_average_at_end"] = os.getloadavg()
    OUT_JSON.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    write_md(results)
    print(f"wrote {OUT_JSON} and {OUT_MD}")


def write_md(results: dict[str, Any]) -> None:
    """The short report ``detector_entropy.md`` from the JSON."""
    meta = results["meta"]
    lines = [
        "# Entropy-weighted Aaronson test (issue 15 item 5)",
        "",
        f"`python -m bench.detector_entropy run` · commit `{meta['commit'][:10]}` "
        f"(dirty tree: {meta['dirty_tree']}) · {meta['cpu_model']} (AMX: {meta['amx']}), "
        f"{meta['hardware']['cores']} cores · load {meta['load_average_at_start'][0]:.1f} → "
        f"{meta['load_average_at_end'][0]:.1f} · {meta['date']}",
        "",
        f"Weighting (frozen before the held-out run, chosen on the design prompts: "
        f"`bench/results/detector_entropy_design.json`): `{results['weighting']}`; "
        f"α = {results['alpha']}. Held-out: 20 prompts (ranks 20-29 of each task) × 128 "
        "tokens, mpfr. Tokens to α: the smallest number of scored tokens at which the "
        "whole-text p of the prefix is below α (never within the text: +∞ in the median).",
        "",
        "| setting | median tokens to α, plain | weighted | ratio | never reached (plain / "
        "weighted) | TPR @ 1 % FPR plain | weighted | H0 FPR weighted (99 % upper) | "
        "entropy CPU ms/token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["settings"].items():
        h0 = r["h0_human"]
        ratio = r["ratio_weighted_over_plain"]
        lines.append(
            f"| {name} {r['processing']} | {r['median_tokens_to_alpha_plain']} | "
            f"{r['median_tokens_to_alpha_weighted']} | "
            f"{'—' if ratio is None else f'{ratio:.2f}'} | "
            f"{r['never_reached_plain']} / {r['never_reached_weighted']} | "
            f"{r['tpr_at_1pct_fpr']['plain']['tpr']:.2f} | "
            f"{r['tpr_at_1pct_fpr']['weighted']['tpr']:.2f} | "
            f"{h0['weighted_fpr']:.4f} ({h0['weighted_fpr_binomial99_upper']:.4f}; "
            f"{h0['weighted_rejections']} of {h0['tests']}) | "
            f"{r['entropy_cpu']['ms_per_token']} |"
        )
    lines += ["", "Per generation (tokens to α, plain → weighted):", ""]
    for name, r in results["settings"].items():
        pairs = ", ".join(
            f"{a}→{b}"
            for a, b in zip(r["tokens_to_alpha_plain"], r["tokens_to_alpha_weighted"], strict=True)
        )
        lines.append(f"- {name}: {pairs}")
    lines.append("")
    OUT_MD.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["generate", "choose", "run"])
    args = parser.parse_args()
    if args.step == "generate":
        generate("t0.7", "design")
        generate("t0.7", "heldout")
    elif args.step == "choose":
        choose()
    else:
        run()


if __name__ == "__main__":
    main()
