"""Detection power per score versus the number of scored tokens, on real watermarked text.

Input: the cached SmolLM2-135M-Instruct ``basic-uwm`` generations of
``bench.detector_generations`` (T = 1, top-k 50; identical to ``mpfr`` output). For each budget
n in {16, 32, 64, 128} and each generation with at least n scored tokens, the shortest prefix of
its token ids holding exactly n scored tokens is detected with every score; the detection rate
is the fraction with p < α = 0.01 (the verdict's rule), with a Wilson 95% interval. The same is
done on the human passages (``data/human-pydoc.jsonl``) under the same key: the false-positive
rate at each budget (expected <= 1%).

Writes ``bench/results/detector_power.json`` and ``detector_power.png``.

Run from the repository root (after ``python -m bench.detector_generations``)::

    python -m bench.detector_power
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from bench.common import RESULTS
from bench.detector_common import DATA, GENERATIONS, bench_source, data_home, run_metadata
from detector import SCORE_NAMES, DetectOptions, detect
from keyed import detection_plan
from sampler.models import DEFAULT_MODEL, load_tokenizer

BUDGETS = (8, 16, 32, 64, 128)  # the goals are at 16-128; 8 separates the scores better
ALPHA = 0.01
OUT_JSON = RESULTS / "detector_power.json"
OUT_PNG = RESULTS / "detector_power.png"


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval for a binomial proportion."""
    if n == 0:
        return 0.0, 1.0
    phat = successes / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def prefix_with_scored(ids: list[int], special: frozenset[int], width: int, n: int) -> list[int]:
    """The shortest prefix of ``ids`` with exactly n scored positions ([] if there are fewer).

    The detection plan of a prefix is the plan of the whole text cut at that length (labels and
    the repeated-context rule only look backwards), so this is what a detector sees when the
    text stops there.
    """
    scored = [p.position for p in detection_plan(ids, width, True, special) if p.skip is None]
    return ids[: scored[n - 1] + 1] if len(scored) >= n else []


def evaluate(
    tokenizer: Any, texts: list[list[int]], special: frozenset[int]
) -> dict[str, dict[str, Any]]:
    """Per budget: how many texts qualify, and per score the rejections at α, the rate with its
    Wilson interval, the median log10 p, the mean ANLPPT and every log10 p (for calibration)."""
    source = bench_source()
    out: dict[str, dict[str, Any]] = {}
    for n in BUDGETS:
        log10: dict[str, list[float]] = {name: [] for name in SCORE_NAMES}
        methods: dict[str, set[str]] = {name: set() for name in SCORE_NAMES}
        for ids in texts:
            prefix = prefix_with_scored(ids, special, source.context_width, n)
            if not prefix:
                continue
            options = DetectOptions(scores=SCORE_NAMES)
            detection = detect(tokenizer, source, token_ids=prefix, options=options)
            assert detection.num_scored == n
            for name, p in detection.scores.items():
                log10[name].append(p.log10_p_value)
                methods[name].add(p.method)
        count = len(log10["aaronson"])
        per_score = {}
        for name in SCORE_NAMES:
            values = np.array(log10[name])
            hits = int(np.sum(values < math.log10(ALPHA)))
            low, high = wilson(hits, count)
            per_score[name] = {
                "rejected": hits,
                "rate": hits / count if count else None,
                "wilson95": [low, high],
                "median_log10_p": float(np.median(values)) if count else None,
                "mean_anlppt": float(np.mean(-values * math.log(10) / n)) if count else None,
                "methods": sorted(methods[name]),
                "log10_p": [round(v, 6) for v in values.tolist()],
            }
        out[str(n)] = {"texts": count, "scores": per_score}
    return out


def calibrated_tpr(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """TPR at 1% FPR calibrated on human text (MPFR paper App. D): per budget and score, the
    threshold is the 1% quantile of the human log10 p-values, so the comparison does not
    depend on how conservative each score's p-value is."""
    out: dict[str, dict[str, float]] = {}
    for n in BUDGETS:
        out[str(n)] = {}
        for name in SCORE_NAMES:
            human = np.array(results["human"][str(n)]["scores"][name]["log10_p"])
            marked = np.array(results["watermarked"][str(n)]["scores"][name]["log10_p"])
            threshold = float(np.quantile(human, 0.01, method="lower"))
            out[str(n)][name] = float(np.mean(marked < threshold))
    return out


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in SCORE_NAMES:
        rates, lows, highs = [], [], []
        for n in BUDGETS:
            entry = results["watermarked"][str(n)]["scores"][name]
            rates.append(entry["rate"])
            lows.append(max(0.0, entry["rate"] - entry["wilson95"][0]))
            highs.append(max(0.0, entry["wilson95"][1] - entry["rate"]))
        left.errorbar(BUDGETS, rates, yerr=[lows, highs], marker="o", capsize=3, label=name)
        fpr = [results["human"][str(n)]["scores"][name]["rate"] for n in BUDGETS]
        right.plot(BUDGETS, fpr, marker="o", label=name)
    for axis, title in (
        (left, "watermarked: detection rate at α = 0.01"),
        (right, "human text: false-positive rate at α = 0.01"),
    ):
        axis.set_xscale("log", base=2)
        axis.set_xticks(BUDGETS, [str(n) for n in BUDGETS])
        axis.set_xlabel("scored tokens")
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
    left.set_ylim(0, 1.02)
    right.axhline(ALPHA, color="grey", linestyle="--", linewidth=1)
    right.set_ylim(0, 0.05)
    left.legend()
    meta = results["meta"]
    fig.suptitle(
        f"{meta['model']} basic-uwm T=1 top-k 50, {results['generations']} generations · "
        f"{meta['hardware']['cpu']} · commit {meta['commit'][:10]}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(OUT_PNG, dpi=120)


def main() -> None:
    tokenizer = load_tokenizer(DEFAULT_MODEL, data_home())
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    with GENERATIONS.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    marked = [list(r["token_ids"]) for r in rows if r["watermark_applied"]]
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        human_texts = [json.loads(line)["text"] for line in f]
    human = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in human_texts]
    results: dict[str, Any] = {
        "meta": run_metadata(),
        "alpha": ALPHA,
        "budgets": list(BUDGETS),
        "generation_settings": {
            key: rows[0][key] for key in ("method", "temperature", "top_k", "max_new_tokens")
        },
        "generations": len(marked),
        "generated_tokens": [len(ids) for ids in marked],
        "watermarked": evaluate(tokenizer, marked, special),
        "human": evaluate(tokenizer, human, special),
    }
    results["tpr_at_1pct_fpr"] = calibrated_tpr(results)
    OUT_JSON.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    plot(results)
    print(f"wrote {OUT_JSON} and {OUT_PNG}")
    for kind in ("watermarked", "human"):
        for n in BUDGETS:
            entry = results[kind][str(n)]
            rates = "  ".join(f"{name} {entry['scores'][name]['rate']:.3f}" for name in SCORE_NAMES)
            print(f"{kind:11s} n={n:3d} ({entry['texts']:3d} texts): {rates}")


if __name__ == "__main__":
    main()
