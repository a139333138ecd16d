"""The robustness card's markdown and plot, from its JSON (``bench.robustness``).

``write_report(path)`` writes ``<stem>.md`` and ``<stem>.png`` beside ``path``; where
``bench/results/robustness_before.json`` exists (a run on a detector without the canonical
reading) and ``path`` is another file, its TPR at α = 0.01 is shown beside each cell.

    python -m bench.robustness_report [bench/results/robustness.json]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from bench.common import RESULTS

BEFORE_JSON = RESULTS / "robustness_before.json"
GROUPS = ("reference", "edits", "characters", "dilution", "model")
GROUP_TITLES = {
    "reference": "reference",
    "edits": "edits",
    "characters": "character rewrites",
    "dilution": "copy-paste dilution",
    "model": "model rewrites",
}


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _pooled_h0(row: dict[str, Any], alpha: float) -> tuple[int, int, float] | None:
    """False positives, trials and the 95 % Clopper–Pearson bound, pooled over lengths."""
    from bench.robustness import clopper_pearson_upper

    cells = [c["h0"] for c in row["cells"].values() if "h0" in c]
    if not cells:
        return None
    k = sum(int(c[f"fp@{alpha}"]) for c in cells)
    n = sum(int(c["n"]) for c in cells)
    return k, n, clopper_pearson_upper(k, n)


def _h0_text(row: dict[str, Any], alpha: float) -> str:
    pooled = _pooled_h0(row, alpha)
    if pooled is None:
        return "–"
    k, n, bound = pooled
    return f"{k} / {n} (≤ {100 * bound:.2f} %)"


def _h0_check(rows: dict[str, Any], alpha: float) -> str:
    """Whether every cell's false positives are within the upper end of the central 99 %
    interval of Binomial(N, α), the check of ``bench.detector_robustness`` (a valid test
    exceeds it with probability <= 0.005 per cell)."""
    from scipy import stats

    over = []
    cells = 0
    for row in rows.values():
        for n, cell in row["cells"].items():
            if "h0" not in cell:
                continue
            cells += 1
            high = int(stats.binom.ppf(0.995, cell["h0"]["n"], alpha))
            if cell["h0"][f"fp@{alpha}"] > high:
                over.append(f"{row['label']} at n = {n} ({cell['h0'][f'fp@{alpha}']} > {high})")
    verdict = "every one is within it" if not over else "over it: " + "; ".join(over)
    return (
        f"Human text at α = {alpha}, per cell (attack × length): false positives against the "
        f"upper end of the central 99 % interval of Binomial(N, α), {cells} cells: {verdict}."
    )


def _ordered(rows: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return sorted(rows.items(), key=lambda item: GROUPS.index(item[1]["group"]))


def markdown(card: dict[str, Any], before: dict[str, Any] | None) -> str:
    """The card as markdown: setup, the two TPR tables with H0, dilution spans, notes."""
    setup, lengths = card["setup"], [str(n) for n in card["setup"]["lengths"]]
    hw = card["hardware"]
    rows = card["rows"]
    lines = [
        "# Robustness card",
        "",
        f"Detection of watermarked SmolLM2-135M-Instruct answers after each attack, by the "
        f"answer's length in tokens before the attack (its first n generated tokens, decoded, "
        f"then attacked). TPR at FPR α is the fraction of attacked answers whose verdict p is "
        f"below α (the detector's p-values are valid); the FPR is measured on human text put "
        f"through the same attack under {setup['h0_keys']} other keys (model rewrites: the "
        f"attacked texts under {setup['h0_keys_model_rows']} other keys), with its one-sided "
        f"95 % Clopper–Pearson bound. How it was made and what it means: "
        f"[docs/robustness.md](../../docs/robustness.md).",
        "",
        f"- command: `{card['command']}`; {card['seconds']:.0f} s",
        f"- commit {card['commit']}{' (uncommitted changes)' if card['dirty_tree'] else ''}, "
        f"{card['date']}; detector of commit {card['detector']['commit']}, canonical reading: "
        f"{'yes' if card['detector']['canonical_reading'] else 'no'}",
        f"- hardware: {hw['cpu']}, {hw['cores']} cores, {hw['platform']}",
        f"- texts: {setup['answers']} watermarked answers (`basic-uwm`, T = 1, top-k 50, up to "
        f"{setup['generation']['max_new_tokens']} new tokens; `{setup['generations']}`), "
        f"{setup['human_passages']} human passages, random attacks "
        f"{setup['copies_of_random_attacks']} copies per answer, seed {setup['seed']}",
    ]
    if before is not None:
        lines.append(
            f"- before: the detector without the canonical reading (commit "
            f"{before['detector']['commit']}, run {before['date']}), shown after the slash"
        )
    lines += ["", "## TPR at 1 % FPR (α = 0.01)", ""]
    head = (
        "| attack | "
        + " | ".join(f"n = {n}" for n in lengths)
        + " | human FPR, false positives / N (95 % bound) |"
    )
    lines += [head, "|---" * (len(lengths) + 2) + "|"]
    lines += _tpr_lines(rows, lengths, 0.01, before)
    lines += ["", _h0_check(rows, 0.01)]
    lines += ["", "## TPR at 0.1 % FPR (α = 0.001)", ""]
    lines += [head, "|---" * (len(lengths) + 2) + "|"]
    lines += _tpr_lines(rows, lengths, 0.001, None)
    lines += ["", _h0_check(rows, 0.001)]
    lines += ["", "Answers per cell (random attacks: × copies):", ""]
    counts = next(iter(rows.values()))["cells"]
    lines.append(
        ", ".join(f"n = {n}: {counts[n]['n']}" for n in lengths if n in counts)
        + " (answers that reach n tokens)"
    )
    lines += _dilution_lines(rows, lengths)
    lines += _model_lines(rows)
    return "\n".join(lines) + "\n"


def _tpr_lines(
    rows: dict[str, Any], lengths: list[str], alpha: float, before: dict[str, Any] | None
) -> list[str]:
    out = []
    for name, row in _ordered(rows):
        cells = []
        for n in lengths:
            cell = row["cells"].get(n)
            text = _rate(None if cell is None else cell.get(f"tpr@{alpha}"))
            old = None
            if before is not None and name in before["rows"]:
                old = before["rows"][name]["cells"].get(n)
            if old is not None and cell is not None:
                text += f" / {_rate(old.get(f'tpr@{alpha}'))}"
            cells.append(text)
        out.append(f"| {row['label']} | " + " | ".join(cells) + f" | {_h0_text(row, alpha)} |")
    return out


def _dilution_lines(rows: dict[str, Any], lengths: list[str]) -> list[str]:
    dilution = [(name, row) for name, row in rows.items() if row["group"] == "dilution"]
    if not dilution:
        return []
    lines = [
        "",
        "## Dilution: is the answer's span found? (α = 0.01)",
        "",
        "The fraction of diluted answers whose strongest span is significant at α and lies at "
        "least half inside the answer (`DetectOptions(spans=True)`).",
        "",
        "| dilution | " + " | ".join(f"n = {n}" for n in lengths) + " |",
        "|---" * (len(lengths) + 1) + "|",
    ]
    for _, row in dilution:
        spans = [_rate(row["cells"].get(n, {}).get("span@0.01")) for n in lengths]
        lines.append(f"| {row['label']} | " + " | ".join(spans) + " |")
    return lines


def _model_lines(rows: dict[str, Any]) -> list[str]:
    lines = ["", "## Model rewrites", ""]
    para = rows.get("paraphrase_shipped")
    if para is not None:
        tokens = ", ".join(f"{n}: {t:.0f}" for n, t in para["mean_tokens"].items())
        lines.append(
            f"- Paraphrase: mean tokens of the rewrite by source length ({tokens}). No "
            f"stronger paraphraser could be run: this machine reaches package registries "
            f"only, and no package found in PyPI's index ships a paraphrase model's weights."
        )
    emoji = rows.get("emoji_kept")
    if emoji is not None:
        c = emoji["emoji_per_word_gap"]
        lines.append(
            f"- Emoji attack: the model put an emoji run in {c['mean']:.2f} of the gaps between "
            f"words on average (median {c['median']:.2f}; {100 * c['answers_at_least_half']:.0f} "
            f"% of answers in at least half): SmolLM2-135M mostly ignores the instruction, so "
            f"the attack deletes little here; a model that obeys it leaves almost no scored "
            f"context that was raced (docs/limits.md)."
        )
    return lines


def plot(card: dict[str, Any], before: dict[str, Any] | None, path: Path) -> None:
    """Heat maps of TPR by attack and length: α = 0.01, α = 0.001 and, where known, before."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = _ordered(card["rows"])
    lengths = [str(n) for n in card["setup"]["lengths"]]
    panels: list[tuple[str, dict[str, Any], float]] = [
        ("TPR at α = 0.01", card, 0.01),
        ("TPR at α = 0.001", card, 0.001),
    ]
    if before is not None:
        panels.append(("before: TPR at α = 0.01", before, 0.01))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.2 * len(panels) + 2.6, 0.32 * len(rows) + 1.6), sharey=True
    )
    for ax, (title, source, alpha) in zip(np.atleast_1d(axes), panels, strict=True):
        grid = np.full((len(rows), len(lengths)), np.nan)
        for i, (name, _) in enumerate(rows):
            row = source["rows"].get(name)
            for j, n in enumerate(lengths):
                cell = None if row is None else row["cells"].get(n)
                value = None if cell is None else cell.get(f"tpr@{alpha}")
                if value is not None:
                    grid[i, j] = value
        ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            if not math.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), lengths)
        ax.set_xlabel("tokens before the attack")
        ax.set_title(title, fontsize=9)
    first = np.atleast_1d(axes)[0]
    first.set_yticks(range(len(rows)), [row["label"] for _, row in rows], fontsize=7)
    fig.suptitle(
        f"Robustness card, SmolLM2-135M-Instruct, commit {card['commit'][:10]}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(path: Path) -> None:
    """``<stem>.md`` and ``<stem>.png`` beside the card's JSON ``path``."""
    card = json.loads(path.read_text(encoding="utf-8"))
    before = None
    if path.resolve() != BEFORE_JSON.resolve() and BEFORE_JSON.exists():
        before = json.loads(BEFORE_JSON.read_text(encoding="utf-8"))
    path.with_suffix(".md").write_text(markdown(card, before), encoding="utf-8")
    plot(card, before, path.with_suffix(".png"))


if __name__ == "__main__":
    write_report(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "robustness.json")
