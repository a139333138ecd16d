"""Detection power per score versus the number of scored tokens, on real watermarked text.

Input: the cached SmolLM2-135M-Instruct ``basic-uwm`` generations of
``bench.detector_generations`` (T = 1, top-k 50; identical to ``mpfr`` output). For each budget
n in {16, 32, 64, 128} and each generation with at least n scored tokens, the shortest prefix of
its token ids holding exactly n scored tokens is detected with every score; the detection rate
is the fraction with p < α = 0.01 (the verdict's rule), with a Wilson 95% interval. The same is
done on the human passages (``data/human-pydoc.jsonl``) under the same key: the false-positive
rate at each budget (expected <= 1%).

Writes ``bench/results/detector_power.json`` and ``detector_power.png``. ``--report`` writes
``bench/results/detector.md`` instead, from ``detector_power.json``,
``detector_throughput.json`` (``python -m bench.detector_throughput``) and, when present,
``detector_robustness.json`` (``python -m bench.detector_robustness``: edits, dilution, the H0
table), ``detector_realign_cost.json``, ``detector_exposed_h0.json`` and
``detector_likelihood_ratio.md``.

Run from the repository root (after ``python -m bench.detector_generations``)::

    python -m bench.detector_power
    python -m bench.detector_power --report
"""

from __future__ import annotations

import argparse
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
THROUGHPUT = RESULTS / "detector_throughput.json"
REPORT = RESULTS / "detector.md"
ROBUSTNESS = RESULTS / "detector_robustness.json"
REALIGN_COST = RESULTS / "detector_realign_cost.json"
LIKELIHOOD_RATIO = RESULTS / "detector_likelihood_ratio.md"
EXPOSED_H0 = RESULTS / "detector_exposed_h0.json"
_TESTS = ("whole_text", "verdict", "realigned", "verdict_or_realigned")


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


# ---- the report (detector.md) ------------------------------------------------------------


def _meta_line(meta: dict[str, Any]) -> str:
    hw = meta["hardware"]
    return (
        f"model {meta['model']} · {hw['cpu']}, {hw['cores']} cores ({hw.get('platform', '')}) · "
        f"commit `{meta['commit'][:12]}`{' (dirty tree)' if meta.get('dirty_tree') else ''} · "
        f"{meta['date']}"
    )


def power_section(power: dict[str, Any]) -> list[str]:
    names = list(power["watermarked"][str(power["budgets"][0])]["scores"])
    budgets = power["budgets"]
    settings = power["generation_settings"]
    lines = [
        "## Power on real watermarked generations",
        "",
        f"{power['generations']} SmolLM2-135M-Instruct generations, method "
        f"`{settings['method']}` (output identical to `mpfr`), T = {settings['temperature']}, "
        f"top-k {settings['top_k']}, up to {settings['max_new_tokens']} new tokens, one bench "
        "key; each is cut to the shortest prefix holding exactly n scored tokens (generations "
        "that end earlier drop out of larger n). Detection rate = fraction with p < α = "
        f"{power['alpha']} (the verdict's rule), Wilson 95% interval in brackets.",
        "",
        _meta_line(power["meta"]),
        "",
        "| scored tokens n | texts | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for n in budgets:
        entry = power["watermarked"][str(n)]
        cells = [
            f"{s['rate']:.3f} [{s['wilson95'][0]:.2f}, {s['wilson95'][1]:.2f}]"
            for s in (entry["scores"][name] for name in names)
        ]
        lines.append(f"| {n} | {entry['texts']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "TPR at 1% FPR with the threshold calibrated on the human passages at the same n "
        "(MPFR paper App. D; removes the effect of how conservative each p-value is):",
        "",
        "| n | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for n in budgets:
        row = power["tpr_at_1pct_fpr"][str(n)]
        lines.append(f"| {n} | " + " | ".join(f"{row[name]:.3f}" for name in names) + " |")
    lines += [
        "",
        "Mean ANLPPT (nats per scored token, −ln p / n) on the watermarked prefixes:",
        "",
        "| n | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for n in budgets:
        scores = power["watermarked"][str(n)]["scores"]
        lines.append(
            f"| {n} | " + " | ".join(f"{scores[name]['mean_anlppt']:.2f}" for name in names) + " |"
        )
    human_n = power["human"][str(budgets[0])]["texts"]
    lines += [
        "",
        f"False-positive rate on the {human_n} human passages (`data/human-pydoc.jsonl`) under "
        "the same key, cut the same way (a valid test stays near or below 0.01; "
        f"Binomial({human_n}, 0.01) puts up to 6 rejections, 0.026, inside its 99% range):",
        "",
        "| n | texts | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for n in budgets:
        entry = power["human"][str(n)]
        cells = [f"{entry['scores'][name]['rate']:.3f}" for name in names]
        lines.append(f"| {n} | {entry['texts']} | " + " | ".join(cells) + " |")
    lines += ["", "![detection rate and false-positive rate](detector_power.png)", ""]
    return lines


def throughput_section(throughput: dict[str, Any]) -> list[str]:
    rows = throughput["results"]
    load = ", ".join(f"{v:.1f}" for v in throughput["load_average_after"])
    lines = [
        "## Throughput",
        "",
        f"{throughput['texts']} texts of {throughput['text_tokens']} tokens (human passages), "
        f"best of {throughput['repeats']} interleaved runs, one process; load average after the "
        f"run: {load} (the machine is shared).",
        "",
        _meta_line(throughput["meta"]),
        "",
        "| pipeline | per second (best) | per second (median) | vs tokenizer only |",
        "|---|---|---|---|",
    ]
    for name in (
        "tokenizer_only",
        "tokenizer_call",
        "aaronson_evidence",
        "aaronson_evidence_rows",
        "all_scores",
        "aaronson_spans",
    ):
        row = rows[name]
        lines.append(
            f"| {name} ({row['units']}) | {row['best_per_second']:,.0f} | "
            f"{row['median_per_second']:,.0f} | {row['fraction_of_tokenizer_only']:.0%} |"
        )
    stages = rows.get("stages_us_per_text")
    if stages:
        names = list(stages["compiled"])
        lines += [
            "",
            f"Stages ({stages['units']}; the NumPy fallback where numba is absent):",
            "",
            "| | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
            "| compiled | " + " | ".join(str(stages["compiled"][n]) for n in names) + " |",
            "| NumPy fallback | "
            + " | ".join(str(stages["numpy_fallback"].get(n, "")) for n in names)
            + " |",
        ]
    lines += [
        "",
        "Corpus mode (`detect_many`, Aaronson with evidence): wall clock including the pool's "
        "start-up, time to the first result, and the rate after it:",
        "",
        "| workers | texts | scored tokens/s (wall) | seconds | first result (s) | "
        "scored tokens/s after it |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        if name.startswith("corpus_workers_"):
            workers = name.rsplit("_", 1)[1]
            lines.append(
                f"| {workers} | {row['texts']} | {row['per_second']:,.0f} | {row['seconds']} | "
                f"{row['first_result_seconds']} | {row['per_second_after_first_result']:,.0f} |"
            )
    lines.append("")
    return lines


def robustness_section(robust: dict[str, Any], cost: dict[str, Any] | None) -> list[str]:
    gens = robust["generations"]
    lines = [
        "## Edits, dilution and H0",
        "",
        f"{gens['count']} held-out generations (`{gens['file']}`: prompts never used to design "
        "the tests, `mpfr`, T = 1, top-k 50, 128 new tokens; four stop early (EOS) at 11, 30, 81 "
        f"and 90 tokens), {robust['repeats']} attacked copies each (fixed seeds). TPR = "
        f"fraction with p < α = {robust['alpha']}; every test's FPR <= α is checked in the H0 "
        "table below, so this is the TPR at 1% FPR. In brackets: over the copies of the 16 "
        "full-length answers. Tests: `whole_text` (plain Aaronson), `verdict` (whole text and "
        "windows, `detector.combined`, what the verdict uses), `realigned` (edit-tolerant, "
        "`detector.realign`, reported beside it with `realign`), `verdict_or_realigned` "
        "(not exposed: both, Bonferroni).",
        "",
        _meta_line(robust),
        "",
        "![TPR vs edit rate](detector_robustness.png)",
        "",
        "| attack | rate | " + " | ".join(_TESTS) + " |",
        "|---|---|" + "---|" * len(_TESTS),
    ]
    for kind, cells in robust["edits"].items():
        for rate, cell in cells.items():
            full = cell["full_length"]
            values = " | ".join(f"{cell[t]:.3f} ({full[t]:.3f})" for t in _TESTS)
            lines.append(f"| {kind} | {rate} | {values} |")
    dil = robust["dilution_1_to_15"]
    full = dil["full_length"]
    lines += [
        "| diluted 1:15 in human text | — | "
        + " | ".join(f"{dil[t]:.3f} ({full[t]:.3f})" for t in _TESTS)
        + " |",
        "",
        "Median log10 p of the diluted answers: "
        + ", ".join(f"{t} {dil['median_log10_p'][t]:.1f}" for t in _TESTS)
        + ".",
        "",
        "H0: counts of p <= α against the upper end of the central 99% interval of "
        "Binomial(N, α) (a valid test exceeds it with probability <= 0.005).",
        "",
        "| texts | N | test | count at α = 0.1 (bound) | count at α = 0.01 (bound) | ok |",
        "|---|---|---|---|---|---|",
    ]
    h0 = robust["h0"]
    rows = [
        (f"human passages × {h0['human']['keys']} keys", h0["human"], _TESTS[:3]),
        (f"repetitive ids × {h0['repetitive']['keys']} keys", h0["repetitive"], _TESTS[:3]),
        (
            f"multi-key: human × {h0['multi_key_human']['keys']} keys",
            h0["multi_key_human"],
            ("verdict", "whole_text", "span", "span_uncorrected_for_keys"),
        ),
    ]
    for label, row, tests in rows:
        for t in tests:
            a, b = row[f"{t}@0.1"], row[f"{t}@0.01"]
            ok = "yes" if a["ok"] and b["ok"] else "**no** (negative control)"
            lines.append(
                f"| {label} | {row['n']} | {t} | {a['count']} ({a['bound_99']}) | "
                f"{b['count']} ({b['bound_99']}) | {ok} |"
            )
    lines.append("")
    if cost is not None:
        us = cost["us_per_scored_token"]
        lines += [
            f"CPU per scored token ({cost['texts']} human passages from token ids, best of "
            f"{cost['rounds']} interleaved rounds, {cost['machine_load']}): detect "
            f"{us['plain']:.1f} µs (of which the window scan of the verdict's test "
            f"{us['scan']:.2f} µs, {100 * cost['scan_share_of_plain']:.1f}%), with `realign` "
            f"{us['realign']:.1f} µs ({cost['realign_over_plain']:.2f}×).",
            "",
        ]
    return lines


def exposed_h0_section(h0: dict[str, Any]) -> list[str]:
    """The H0 table of the model tests reported beside the verdict (``detector_exposed_h0``)."""
    proc = h0["processing"]
    lines = [
        "## The model tests under H0",
        "",
        "From `detector_exposed_h0.json` (the check is the slow test "
        "`tests/detector/test_exposed_h0.py`, see its docstring): the tests that "
        "read the target's law (`entropy_weighting`, `likelihood_ratio` without a prompt, "
        "`edit_filter`), with the law after BOS through the served backend "
        f"(`{h0['law_precision']}`), T = {proc['temperature']}, top-k {proc['top_k']}; the "
        "plain Aaronson test on the same (text, key) pairs for reference. Counts of p < α "
        "against the upper end of the central 99% interval of Binomial(N, α).",
        "",
        _meta_line(h0),
        "",
        "| texts | N | test | count at α = 0.1 (bound) | count at α = 0.01 (bound) | ok |",
        "|---|---|---|---|---|---|",
    ]
    for name, block in h0["h0"].items():
        label = f"{name} × {block['keys']} keys ({block['texts']} texts)"
        a, b = block["by_alpha"]["0.1"], block["by_alpha"]["0.01"]
        for t in a["rejections"]:
            ok = a["rejections"][t] <= a["bound_99"] and b["rejections"][t] <= b["bound_99"]
            lines.append(
                f"| {label} | {a['n']} | {t} | {a['rejections'][t]} ({a['bound_99']}) | "
                f"{b['rejections'][t]} ({b['bound_99']}) | {'yes' if ok else '**no**'} |"
            )
    return [*lines, ""]


def write_report() -> None:
    """``detector.md`` from the detector results (module docstring)."""
    power = json.loads(OUT_JSON.read_text(encoding="utf-8"))
    throughput = json.loads(THROUGHPUT.read_text(encoding="utf-8"))
    decision = (RESULTS / "detector_decision.md").read_text(encoding="utf-8")
    lines = [
        "# Detector: power per score, throughput, edits and dilution",
        "",
        "Generated by `python -m bench.detector_power --report` from `detector_power.json` and "
        "`detector_throughput.json` (scripts: `bench/detector_generations.py`, "
        "`bench/detector_power.py`, `bench/detector_throughput.py`).",
        "",
        decision.strip(),
        "",
        *power_section(power),
        *throughput_section(throughput),
    ]
    if ROBUSTNESS.exists():
        robust = json.loads(ROBUSTNESS.read_text(encoding="utf-8"))
        cost = (
            json.loads(REALIGN_COST.read_text(encoding="utf-8")) if REALIGN_COST.exists() else None
        )
        lines += robustness_section(robust, cost)
    if EXPOSED_H0.exists():
        lines += exposed_h0_section(json.loads(EXPOSED_H0.read_text(encoding="utf-8")))
    if LIKELIHOOD_RATIO.exists():  # its own study (docs/experiments/); one level down
        body = LIKELIHOOD_RATIO.read_text(encoding="utf-8").strip()
        lines += ["", body.replace("# ", "## ", 1), ""]
    REPORT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {REPORT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--report", action="store_true", help="write bench/results/detector.md and stop"
    )
    if parser.parse_args().report:
        write_report()
        return
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
