"""Write ``bench/results/detector.md`` from the detector benchmark results.

Reads ``detector_power.json`` (``python -m bench.detector_power``),
``detector_throughput.json`` (``python -m bench.detector_throughput``) and, when present,
``detector_robustness.json`` (``python -m bench.detector_robustness``: edits, dilution, the
H0 table; plot ``detector_robustness.png``) and ``detector_realign_cost.json``; the power
plot is ``detector_power.png``. Run from the repository root::

    python -m bench.detector_report
"""

from __future__ import annotations

import json
from typing import Any

from bench.common import RESULTS

POWER = RESULTS / "detector_power.json"
THROUGHPUT = RESULTS / "detector_throughput.json"
REPORT = RESULTS / "detector.md"
ROBUSTNESS = RESULTS / "detector_robustness.json"
REALIGN_COST = RESULTS / "detector_realign_cost.json"
LIKELIHOOD_RATIO = RESULTS / "detector_likelihood_ratio.md"
EXPOSED_H0 = RESULTS / "detector_exposed_h0.json"
_TESTS = ("whole_text", "verdict", "realigned", "verdict_or_realigned")


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


def main() -> None:
    power = json.loads(POWER.read_text(encoding="utf-8"))
    throughput = json.loads(THROUGHPUT.read_text(encoding="utf-8"))
    decision = (RESULTS / "detector_decision.md").read_text(encoding="utf-8")
    lines = [
        "# Detector: power per score, throughput, edits and dilution",
        "",
        "Generated by `python -m bench.detector_report` from `detector_power.json` and "
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


if __name__ == "__main__":
    main()
