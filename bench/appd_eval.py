"""The MPFR paper's App. D evaluation in one harness, real model, this machine.

Cells (same prompts, keys, processing T = 1 / top-k 50 / top-p 1, stopping):
- single-draft: ``basic-uwm``; ``vsps``, ``pfr-nowm``, ``pfr`` for L ∈ {1, 2, 3, 4};
- multi-draft: ``mpfr`` and ``gls`` at L = 4, B ∈ {2, 4, 6, 8}; ``mpfr-nowm`` at B = 4;
- drafter substitution: ``mpfr`` and ``gls`` (B = 4, L = 4) with two more drafters;
- detection budget: ``basic-uwm``, ``pfr`` (L = 4), ``mpfr`` (B = 4, L = 4) at 128 tokens.
Every cell runs every held-out prompt under every key (nonce from prompt and key).

Per run: AATPS, tokens/s, ANLPPT (−ln p / M, natural log) for the Aaronson, U, Li and
Lattimore scores, LPPL (mean −ln P(y_t | prefix) under the raw target), the empirical first-level
acceptance (steps that accepted ≥ 1 draft / steps) and — with the ``heads`` drafter — the
Theorem 5.1 bound 1 − Σ_i P(i) (P(i)/(P(i)+Q(i)))^B averaged over the output's contexts (P, Q the
processed target law and level-1 drafter law there). Per cell: mean ± std over runs and the std
of the per-key means. TPR at 1 % FPR per token budget (16, 32, 64, 128): thresholds are the
per-key 1 % quantiles of the Aaronson p-value on the human passages (``human-pydoc.jsonl``),
truncated to the same budget. Drafter substitution: min-pair ROUGE-L (``rouge-score``) across
drafters per (prompt, key).

Resumable (``<out>.partial.jsonl``). Writes ``bench/results/appd.json``, ``appd_*.png`` and
the report ``appd.md`` (the tables, with the goals checked against the numbers and, when
``coupling_acceptance.json`` lies beside it, both couplings on shared contexts); ``--report``
writes the report alone from an existing JSON.

    python -m bench.appd_eval [--prompts 4] [--keys 3] [--tokens 64] [--drafter heads]
    python -m bench.appd_eval --report [--out bench/results/appd.json]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import track

from bench.common import DATA, RESULTS, environment
from detector.detect import detect
from detector.options import DetectOptions
from detector.scores import anlppt
from keyed import KeyedSource, Secret
from sampler.completion import eos_ids, prompt_ids
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import make_drafter
from sampler.drafters.heads import HeadsDrafter
from sampler.models import DEFAULT_MODEL, load_model
from sampler.processing import Processing, dense_logp, process
from sampler.race import acceptance_lower_bound
from sampler.training.rollouts import load_prompts, split_of

PROCESSING = Processing(1.0, 50, 1.0)
SCORES = ("aaronson", "u", "li", "lattimore")
BUDGETS = (16, 32, 64, 128)


@dataclass(frozen=True)
class Cell:
    name: str
    method: str
    drafts: int
    lookahead: int
    drafter: str | None
    tokens: int
    group: str


def cells(drafter: str, others: list[str], tokens: int) -> list[Cell]:
    out = [Cell("basic-uwm", "basic-uwm", 1, 1, None, tokens, "single")]
    for lookahead, method in itertools.product((1, 2, 3, 4), ("vsps", "pfr-nowm", "pfr")):
        out.append(Cell(f"{method} L={lookahead}", method, 1, lookahead, drafter, tokens, "single"))
    for b, method in itertools.product((2, 4, 6, 8), ("mpfr", "gls")):
        out.append(Cell(f"{method} B={b}", method, b, 4, drafter, tokens, "multi"))
    out.append(Cell("mpfr-nowm B=4", "mpfr-nowm", 4, 4, drafter, tokens, "multi"))
    for other, method in itertools.product(others, ("mpfr", "gls")):
        out.append(Cell(f"{method} B=4 / {other}", method, 4, 4, other, tokens, "substitution"))
    out.append(Cell("tpr basic-uwm", "basic-uwm", 1, 1, None, 128, "tpr"))
    out.append(Cell("tpr pfr L=4", "pfr", 1, 4, drafter, 128, "tpr"))
    out.append(Cell("tpr mpfr B=4", "mpfr", 4, 4, drafter, 128, "tpr"))
    return out


def heldout_prompts(per_task: int) -> list[dict[str, Any]]:
    """The first ``per_task`` held-out prompts (never trained on) of each shared task, in a
    fixed order (by a hash of the id)."""
    rows: list[dict[str, Any]] = []
    for name in ("prompts-eli5.jsonl", "prompts-summarize.jsonl"):
        held = [p for p in load_prompts([DATA / name]) if split_of(p["id"]) == "heldout"]
        held.sort(key=lambda p: hashlib.sha256(p["id"].encode()).hexdigest())
        rows += held[:per_task]
    return rows


def key_source(key: int, prompt_id: str) -> KeyedSource:
    secret = Secret(hashlib.sha256(b"appd-key-%d" % key).digest())
    nonce = int.from_bytes(hashlib.sha256(f"{prompt_id}/{key}".encode()).digest()[:7], "little")
    return KeyedSource(secret, 4, True, nonce)


@torch.inference_mode()
def output_laws(
    loaded: Any, prompt: list[int], ids: list[int], drafter: Any = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One target forward over prompt + output: the raw target logits (n, V) float64 of each
    output position and, for a heads drafter, its level-1 logits (n, V) float64 at a step
    rooted there (from h_{t−1} and the root token x_t), else None."""
    full = torch.tensor([prompt + ids], device=loaded.device)
    heads = isinstance(drafter, HeadsDrafter)
    out = loaded.model(input_ids=full, output_hidden_states=heads)
    n = len(prompt)
    logits = out.logits[0, n - 1 : n - 1 + len(ids)].double()
    if not heads:
        return logits, None
    hidden = out.hidden_states[-1][0]
    roots = full[0, n - 1 : n - 1 + len(ids)]  # root token x_t of each context
    before = hidden[n - 2 : n - 2 + len(ids)]  # h_{t−1}
    return logits, drafter.heads.logits(loaded.target, before, roots)[:, 0, :].double()


def audit(loaded: Any, prompt: list[int], ids: list[int], drafter: Any, drafts: int) -> dict:
    """LPPL under the raw target and, for a heads drafter, the Thm 5.1 bound per context."""
    logits, q_logits = output_laws(loaded, prompt, ids, drafter)
    logp = torch.log_softmax(logits, -1)
    chosen = torch.tensor(ids, device=loaded.device)[:, None]
    lppl = float(-logp.gather(1, chosen).mean()) if ids else 0.0
    result: dict[str, Any] = {"lppl": lppl}
    if q_logits is not None and ids:
        vocab = loaded.model.config.vocab_size
        p = dense_logp(process(logits, PROCESSING), vocab).exp()
        q = dense_logp(process(q_logits, PROCESSING), vocab).exp()
        bounds = [acceptance_lower_bound(p[t], q[t], drafts) for t in range(len(ids))]
        result["thm51_bound"] = statistics.fmean(bounds)
    return result


def run_cell(loaded: Any, cell: Cell, row: dict, key: int, drafter_cache: dict) -> dict:
    prompt = row["ids"]
    source = key_source(key, row["id"])
    drafter = None
    if cell.drafter is not None:
        if cell.drafter not in drafter_cache:
            drafter_cache[cell.drafter] = make_drafter(cell.drafter, loaded.target)
        drafter = drafter_cache[cell.drafter]
    config = SamplerConfig(cell.method, cell.drafts, cell.lookahead, cell.tokens, PROCESSING)
    result = generate(loaded.target, prompt, config, source, drafter, eos_ids(loaded))
    ids = list(result.token_ids)
    stats = result.stats
    options = DetectOptions(scores=SCORES[1:])
    found = detect(loaded.tokenizer, source, token_ids=ids, options=options)
    record = {
        "cell": cell.name,
        "prompt": row["id"],
        "key": key,
        "ids": ids,
        "text": loaded.tokenizer.decode(ids),
        "aatps": stats.aatps,
        "tokens_per_second": stats.tokens_per_second,
        "emitted": stats.emitted_tokens,
        "steps": stats.target_forward_passes,
        "first_level_acceptance": (stats.accepted_per_level[0] if stats.accepted_per_level else 0)
        / max(stats.target_forward_passes, 1),
        "anlppt": {name: anlppt(found.scores[name], found.num_scored) for name in SCORES},
        "scored": found.num_scored,
    }
    record.update(audit(loaded, prompt, ids, drafter, config.effective_drafts))
    return record


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(records: list[dict], keys: int) -> dict[str, Any]:
    by_cell: dict[str, list[dict]] = {}
    for r in records:
        by_cell.setdefault(r["cell"], []).append(r)
    table = {}
    for cell, runs in by_cell.items():
        row: dict[str, Any] = {"runs": len(runs)}
        metrics = {
            "aatps": [r["aatps"] for r in runs],
            "tokens_per_second": [r["tokens_per_second"] for r in runs],
            "lppl": [r["lppl"] for r in runs],
            "first_level_acceptance": [r["first_level_acceptance"] for r in runs],
        }
        for name in SCORES:
            metrics[f"anlppt_{name}"] = [r["anlppt"][name] for r in runs]
        if all("thm51_bound" in r for r in runs):
            metrics["thm51_bound"] = [r["thm51_bound"] for r in runs]
        for name, values in metrics.items():
            mean, std = _mean_std(values)
            per_key = [
                statistics.fmean(v for r, v in zip(runs, values, strict=True) if r["key"] == k)
                for k in range(keys)
                if any(r["key"] == k for r in runs)
            ]
            row[name] = {
                "mean": mean,
                "std": std,
                "std_over_keys": statistics.stdev(per_key) if len(per_key) > 1 else 0.0,
            }
        table[cell] = row
    return table


def human_thresholds(loaded: Any, keys: int) -> dict[int, dict[int, float]]:
    """Per key and budget: the 1 % quantile of the Aaronson log10 p on human passages."""
    texts = [
        json.loads(line)["text"] for line in (DATA / "human-pydoc.jsonl").read_text().splitlines()
    ]
    ids = [loaded.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    out: dict[int, dict[int, float]] = {}
    for key in range(keys):
        source = key_source(key, "human")
        out[key] = {}
        for budget in BUDGETS:
            logs = [
                detect(loaded.tokenizer, source, token_ids=i[:budget])
                .scores["aaronson"]
                .log10_p_value
                for i in ids
            ]
            out[key][budget] = float(np.quantile(logs, 0.01, method="lower"))
    return out


def tpr(records: list[dict], thresholds: dict[int, dict[int, float]], loaded: Any) -> dict:
    out: dict[str, dict[str, float]] = {}
    for r in records:
        if not r["cell"].startswith("tpr "):
            continue
        source = key_source(r["key"], r["prompt"])
        for budget in BUDGETS:
            log10 = (
                detect(loaded.tokenizer, source, token_ids=r["ids"][:budget])
                .scores["aaronson"]
                .log10_p_value
            )
            hit = log10 <= thresholds[r["key"]][budget]
            cell = out.setdefault(r["cell"][4:], {})
            cell.setdefault(str(budget), []).append(float(hit))  # type: ignore[arg-type]
    return {c: {b: statistics.fmean(v) for b, v in d.items()} for c, d in out.items()}  # type: ignore[misc]


def substitution(records: list[dict], drafter: str, others: list[str]) -> dict[str, Any]:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    texts: dict[tuple[str, str, int], dict[str, str]] = {}
    for r in records:
        for method in ("mpfr", "gls"):
            if r["cell"] == f"{method} B=4":
                texts.setdefault((method, r["prompt"], r["key"]), {})[drafter] = r["text"]
            for other in others:
                if r["cell"] == f"{method} B=4 / {other}":
                    texts.setdefault((method, r["prompt"], r["key"]), {})[other] = r["text"]
    out: dict[str, Any] = {}
    for method in ("mpfr", "gls"):
        mins, identical = [], 0
        for (m, _, _), by_drafter in texts.items():
            if m != method or len(by_drafter) < 1 + len(others):
                continue
            pairs = itertools.combinations(by_drafter.values(), 2)
            mins.append(min(scorer.score(a, b)["rougeL"].fmeasure for a, b in pairs))
            identical += len(set(by_drafter.values())) == 1
        if mins:
            out[method] = {
                "min_pair_rouge_l_mean": statistics.fmean(mins),
                "min_pair_rouge_l_min": min(mins),
                "identical_outputs": identical,
                "runs": len(mins),
                "drafters": [drafter, *others],
            }
    return out


def plots(summary: dict, rates: dict, out: Path, caption: str = "") -> list[str]:
    """The three report figures; ``caption`` (model, drafter, hardware, commit) goes under each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []

    def save(fig: Any, name: str) -> str:
        fig.tight_layout()
        fig.text(0.01, 0.005, caption, fontsize=6, color="0.4")
        fig.savefig(out / name, dpi=110)
        return name

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for method, marker in (("vsps", "s"), ("pfr-nowm", "^"), ("pfr", "o")):
        xs = [summary[f"{method} L={k}"]["aatps"]["mean"] for k in (1, 2, 3, 4)]
        ys = [summary[f"{method} L={k}"]["anlppt_u"]["mean"] for k in (1, 2, 3, 4)]
        ax.plot(xs, ys, marker=marker, label=method)
    base = summary["basic-uwm"]
    ax.scatter(
        [base["aatps"]["mean"]],
        [base["anlppt_u"]["mean"]],
        marker="*",
        s=150,
        color="k",
        label="basic-uwm",
        zorder=3,
    )
    ax.set_xlabel("AATPS")
    ax.set_ylabel("ANLPPT-U (nats / token)")
    ax.set_title("single-draft frontier, L = 1..4", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    names.append(save(fig, "appd_frontier.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    bs = (2, 4, 6, 8)
    for method in ("mpfr", "gls"):
        axes[0].errorbar(
            bs,
            [summary[f"{method} B={b}"]["aatps"]["mean"] for b in bs],
            yerr=[summary[f"{method} B={b}"]["aatps"]["std_over_keys"] for b in bs],
            marker="o",
            capsize=3,
            label=method,
        )
        axes[1].plot(
            bs,
            [summary[f"{method} B={b}"]["first_level_acceptance"]["mean"] for b in bs],
            marker="o",
            label=f"{method} measured",
        )
    if "thm51_bound" in summary["mpfr B=2"]:
        axes[1].plot(
            bs,
            [summary[f"mpfr B={b}"]["thm51_bound"]["mean"] for b in bs],
            linestyle="--",
            color="k",
            label="Thm 5.1 bound, all output contexts",
        )
    axes[0].set_xlabel("drafts B (L = 4)")
    axes[0].set_ylabel("AATPS")
    axes[1].set_xlabel("drafts B (L = 4)")
    axes[1].set_ylabel("P(step accepts ≥ 1 draft)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    names.append(save(fig, "appd_multidraft.png"))

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for method, by_budget in rates.items():
        ax.plot(BUDGETS, [by_budget[str(b)] for b in BUDGETS], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token budget")
    ax.set_ylabel("TPR at 1 % FPR (human-text thresholds)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    names.append(save(fig, "appd_tpr.png"))
    return names


def caption(env: dict, drafter: str) -> str:
    """Model, drafter, hardware and commit, for the figures."""
    hw = env["hardware"]
    return (
        f"{DEFAULT_MODEL} · drafter {drafter} · {hw['cpu']}, {hw['cores']} cores"
        f"{' + CUDA' if hw['cuda'] else ''} · commit {env['commit'][:10]}"
    )


# ---- the report (appd.md) ---------------------------------------------------------------

COLUMNS = (
    "aatps",
    "tokens_per_second",
    "anlppt_aaronson",
    "anlppt_u",
    "anlppt_li",
    "anlppt_lattimore",
    "lppl",
)


def _cell(row: dict, name: str) -> str:
    m = row[name]
    return f"{m['mean']:.3f} ± {m['std']:.3f} ({m['std_over_keys']:.3f})"


def _table(cells: dict, names: list[str]) -> list[str]:
    lines = [
        "| cell | AATPS | tokens/s | ANLPPT-A | ANLPPT-U | ANLPPT-Li | ANLPPT-PL | LPPL |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        if name in cells:
            lines.append(f"| {name} | " + " | ".join(_cell(cells[name], c) for c in COLUMNS) + " |")
    return lines


def same_contexts(coupling: dict) -> list[str]:
    """Goal lines from ``coupling_acceptance.json``: both couplings on shared contexts."""
    rows = coupling["first_level_acceptance"]
    setup = coupling["setup"]
    diff = ", ".join(
        f"B = {b}: {rows[b]['mpfr_minus_gls'][0]:+.4f} ± {rows[b]['mpfr_minus_gls'][1]:.4f}"
        for b in rows
    )
    over = ", ".join(
        f"B = {b}: {rows[b]['mpfr_minus_bound'][0]:+.4f} ± {rows[b]['mpfr_minus_bound'][1]:.4f}"
        for b in rows
    )
    return [
        f"- On the same {setup['contexts']} contexts (`coupling_acceptance.md`: both level-1 "
        f"couplings under {setup['draws_per_context']} draws per context of the real target "
        "and heads laws, paired; mean ± standard error over contexts), first-level acceptance "
        f"mpfr − gls: {diff}.",
        f"  mpfr − Thm 5.1 bound: {over}. The AATPS gaps above compare different texts (each "
        "method's own output), with std over keys of 0.05–0.10 at 3 keys; these rows do not.",
    ]


def goals(data: dict, coupling: dict | None = None) -> list[str]:
    cells = data["cells"]
    out = []
    for b in (2, 4, 6, 8):
        m, g = cells.get(f"mpfr B={b}"), cells.get(f"gls B={b}")
        if m and g:
            diff = m["aatps"]["mean"] - g["aatps"]["mean"]
            ok = "met" if diff >= -0.02 else "**missed**"
            out.append(
                f"- B = {b}: mpfr AATPS − gls AATPS = {diff:+.3f} (goal ≥ −0.02: {ok}; "
                f"std over keys {m['aatps']['std_over_keys']:.3f} / "
                f"{g['aatps']['std_over_keys']:.3f})"
            )
        if m and "thm51_bound" in m:
            acc, bound = m["first_level_acceptance"]["mean"], m["thm51_bound"]["mean"]
            out.append(
                f"  - first-level acceptance {acc:.3f} (measured at step roots) next to the "
                f"Thm 5.1 bound {bound:.3f} (averaged over every context of the output: "
                "not the same contexts, so a reference, not a test)"
            )
    if coupling is not None:
        out += same_contexts(coupling)
    base, mp = cells.get("basic-uwm"), cells.get("mpfr B=4")
    if base and mp:
        out.append(
            f"- ANLPPT-Aaronson: mpfr B=4 {_cell(mp, 'anlppt_aaronson')} vs basic-uwm "
            f"{_cell(base, 'anlppt_aaronson')}"
        )
    nowm = cells.get("mpfr-nowm B=4")
    if nowm and mp:
        out.append(
            f"- AATPS: mpfr-nowm B=4 {_cell(nowm, 'aatps')} vs mpfr B=4 {_cell(mp, 'aatps')}"
        )
    for method, row in data.get("drafter_substitution", {}).items():
        out.append(
            f"- drafter substitution, {method}: min-pair ROUGE-L mean "
            f"{row['min_pair_rouge_l_mean']:.3f}, min {row['min_pair_rouge_l_min']:.3f}; "
            f"identical across {', '.join(row['drafters'])} in "
            f"{row['identical_outputs']}/{row['runs']} (prompt, key) pairs"
        )
    return out


def render(data: dict, coupling: dict | None = None) -> str:
    env, setup = data["environment"], data["setup"]
    cells = data["cells"]
    keys = setup["keys"]
    lines = [
        "# MPFR paper App. D on SmolLM2-135M-Instruct",
        "",
        f"Model {data['model']} ({setup['device']}, {setup['dtype']}); "
        f"{env['hardware']['cpu']}, {env['hardware']['cores']} cores; commit "
        f"`{env['commit'][:10]}`{' (dirty tree)' if env['dirty_tree'] else ''}; {env['date']}.",
        f"Drafter `{setup['drafter']}`; {len(setup['prompts'])} held-out prompts "
        f"({', '.join(setup['prompts'])}) × {keys} keys, {setup['tokens']} new tokens, "
        "T = 1, top-k 50, top-p 1. Each entry: mean ± std over prompts × keys (std of the "
        "per-key means). ANLPPT = −ln p / M (nats per scored token); LPPL = mean −ln P(y_t | "
        "prefix) under the raw target. Tokens/s on this CPU are diagnostics, not claims.",
        "",
        "## Goals",
        "",
        *goals(data, coupling),
        "",
        "## Single draft (B = 1)",
        "",
        *_table(
            cells,
            ["basic-uwm"]
            + [f"{m} L={k}" for k in (1, 2, 3, 4) for m in ("vsps", "pfr-nowm", "pfr")],
        ),
        "",
        "![frontier](appd_frontier.png)",
        "",
        "## Multi-draft (L = 4)",
        "",
        *_table(
            cells, [f"{m} B={b}" for b in (2, 4, 6, 8) for m in ("mpfr", "gls")] + ["mpfr-nowm B=4"]
        ),
        "",
        "| cell | first-level acceptance | Thm 5.1 bound |",
        "|---|---|---|",
    ]
    for b in (2, 4, 6, 8):
        for m in ("mpfr", "gls"):
            row = cells.get(f"{m} B={b}")
            if row:
                bound = _cell(row, "thm51_bound") if "thm51_bound" in row else "—"
                lines.append(f"| {m} B={b} | {_cell(row, 'first_level_acceptance')} | {bound} |")
    lines += [
        "",
        "![multi-draft](appd_multidraft.png)",
        "",
        "## Detection at 1 % FPR",
        "",
        "Thresholds: per key, the 1 % quantile of the Aaronson p-value over the 227 human "
        "passages cut to the same budget. Each method: "
        f"{len(setup['prompts']) * keys} generations of 128 tokens.",
        "",
        "| method | " + " | ".join(f"T = {b}" for b in (16, 32, 64, 128)) + " |",
        "|---|---|---|---|---|",
    ]
    for method, rates in data["tpr_at_1pct_fpr"].items():
        lines.append(
            f"| {method} | " + " | ".join(f"{rates[str(b)]:.2f}" for b in (16, 32, 64, 128)) + " |"
        )
    lines += [
        "",
        "![tpr](appd_tpr.png)",
        "",
        "## Drafter substitution (B = 4, L = 4)",
        "",
        "| method | min-pair ROUGE-L (mean) | (min) | identical |",
        "|---|---|---|---|",
    ]
    for method, row in data.get("drafter_substitution", {}).items():
        lines.append(
            f"| {method} | {row['min_pair_rouge_l_mean']:.3f} | "
            f"{row['min_pair_rouge_l_min']:.3f} | "
            f"{row['identical_outputs']}/{row['runs']} |"
        )
    lines.append("")
    return "\n".join(lines)


def write_report(path: Path) -> Path:
    """``appd.md`` beside ``path`` (an ``appd.json``), from it and ``coupling_acceptance.json``
    when that lies beside it."""
    data = json.loads(path.read_text())
    shared = path.parent / "coupling_acceptance.json"
    coupling = json.loads(shared.read_text()) if shared.exists() else None
    report = path.with_suffix(".md")
    report.write_text(render(data, coupling))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts per task")
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--drafter", default="heads")
    parser.add_argument("--others", nargs="+", default=["ngram", "self:4"])
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "appd.json")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="CELL",
        help="run only these cells (e.g. 'mpfr B=4' 'mpfr-nowm B=4') and write "
        "their summary alone: no TPR, substitution, plots or report",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="write the report (appd.md) from --out's JSON and stop",
    )
    parser.add_argument(
        "--finalize",
        action="store_true",
        help="summarise the runs finished so far without generating more",
    )
    args = parser.parse_args()
    if args.report:
        print(f"wrote {write_report(args.out)}")
        return

    loaded = load_model(DEFAULT_MODEL, args.home, device="auto")
    rows = heldout_prompts(args.prompts)
    for row in rows:
        row["ids"] = prompt_ids(loaded, messages=row["messages"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(".partial.jsonl")
    done: dict[tuple[str, str, int], dict] = {}
    if partial.exists():
        for line in partial.read_text().splitlines():
            r = json.loads(line)
            done[(r["cell"], r["prompt"], r["key"])] = r
    chosen = cells(args.drafter, args.others, args.tokens)
    if args.only:
        if args.out == RESULTS / "appd.json":
            parser.error("--only needs its own --out (it would replace the full appd.json)")
        unknown = set(args.only) - {c.name for c in chosen}
        if unknown:
            parser.error(f"--only: unknown cells {sorted(unknown)}")
        chosen = [c for c in chosen if c.name in args.only]
    plan = [(c, row, k) for c in chosen for row in rows for k in range(args.keys)]
    drafter_cache: dict[str, Any] = {}
    with partial.open("a") as sink:
        for cell, row, key in track(plan, description="App. D cells"):
            if (cell.name, row["id"], key) in done or args.finalize:
                continue
            record = run_cell(loaded, cell, row, key, drafter_cache)
            done[(cell.name, row["id"], key)] = record
            sink.write(json.dumps(record) + "\n")
            sink.flush()
    records = list(done.values())
    summary = summarise(records, args.keys)
    setup = {
        "drafter": args.drafter,
        "prompts": [r["id"] for r in rows],
        "keys": args.keys,
        "tokens": args.tokens,
        "processing": {"temperature": 1.0, "top_k": 50, "top_p": 1.0},
        "device": str(loaded.device),
        "dtype": str(loaded.dtype),
    }
    if args.only:
        payload = {
            "benchmark": "appd_eval",
            "model": DEFAULT_MODEL,
            "environment": environment(),
            "setup": setup | {"only": args.only},
            "cells": {name: row for name, row in summary.items() if name in args.only},
        }
        args.out.write_text(json.dumps(payload, indent=1) + "\n")
        print(json.dumps(payload["cells"], indent=1))
        return
    thresholds = human_thresholds(loaded, args.keys)
    rates = tpr(records, thresholds, loaded)
    stability = substitution(records, args.drafter, args.others)
    images = plots(summary, rates, args.out.parent, caption(environment(), args.drafter))
    payload = {
        "benchmark": "appd_eval",
        "model": DEFAULT_MODEL,
        "environment": environment(),
        "setup": setup | {"substitution_drafters": args.others},
        "cells": summary,
        "tpr_at_1pct_fpr": rates,
        "human_log10_thresholds": thresholds,
        "drafter_substitution": stability,
        "plots": images,
    }
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    write_report(args.out)
    print(json.dumps({"tpr": rates, "substitution": stability}, indent=1))


if __name__ == "__main__":
    main()
