"""Markdown report of ``bench/results/distill_objectives.json`` (``bench.distill_compare``).

python -m bench.distill_report
"""

from __future__ import annotations

import json

from bench.common import RESULTS
from sampler.methods import METHODS, parse_method


def render(data: dict) -> str:
    env, setup = data["environment"], data["setup"]
    lines = [
        "# Drafter objectives on SmolLM2-135M-Instruct",
        "",
        f"Model {data['model']}; {env['hardware']['cpu']}, {env['hardware']['cores']} cores, "
        f"torch threads {env['hardware']['torch_threads']}; commit `{env['commit'][:10]}`"
        f"{' (dirty tree)' if env['dirty_tree'] else ''}; {env['date']}.",
        f"Parallel heads, L = {setup['lookahead']}, trained on {setup['train_rollouts']} rollouts "
        f"(target samples, T = 1, {setup['rollout_tokens']} new tokens per prompt). As in the "
        "MDraft paper (which post-trains a DFlash drafter), every objective starts from the same "
        f"off-policy heads (`ce`, {setup['init_steps']} steps × {setup['init_anchors']} anchors, "
        f"lr {setup['init_lr']}) and gets the same post-training: {setup['steps']} steps × "
        f"{setup['anchors']} anchors, lr {setup['lr']}, seed 0 (`mdraft`: α = 0.9, "
        f"K = {setup['proposals']}, survival weights; `rkl`/`fkl`: per-prefix, K = 1, uniform; "
        "`ce`: DFlash weights, continued). Evaluated on "
        f"{setup['heldout_rollouts']} held-out rollouts (prompts split by a hash of their id).",
        "",
        "## Acceptance (held-out), standard speculative sampling, one chain of 4 drafts",
        "",
        "τ = expected accepted drafts + 1 per target pass, computed from the exact acceptance "
        "probabilities min(1, p/q) of sampled drafts (T = 0: greedy match) at 16 anchors per "
        "rollout; ± is the std over rollouts.",
        "",
        "| objective | τ T=0 | τ T=0.6 | τ T=1 | P(accept ℓ=1..4 \\| previous) at T=1 "
        "| train min (total) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in data["objectives"].items():
        ev = row["evaluation"]
        cells = " | ".join(
            f"{ev[t]['tau']:.3f} ± {ev[t]['tau_std_over_sequences']:.2f}"
            for t in ("T=0", "T=0.6", "T=1")
        )
        cond = ", ".join(f"{c:.2f}" for c in ev["T=1"]["conditional"])
        best = " **(best)**" if name == data["best"] else ""
        lines.append(f"| {name}{best} | {cells} | {cond} | {row['train_seconds'] / 60:.1f} |")
    lines += [
        "",
        "![acceptance per position](distill_acceptance.png)",
        "",
        f"## The real decoder, {setup['decode_prompts']} held-out prompts × "
        f"{setup['decode_tokens']} tokens, T = 1, top-k 50",
        "",
        "AATPS = emitted tokens per target forward pass; tokens/s on this CPU (2 cores; a "
        "17-node tree costs ~2× a one-token step here, REFERENCE.md). *identical* counts the "
        "prompts whose output equals `basic-uwm` for the same key and nonce.",
        "",
        "| cell | AATPS | tokens/s | identical |",
        "|---|---|---|---|",
    ]
    for cell, row in data["decoding"].items():
        keyed = METHODS[parse_method(cell.split()[0])].watermarked  # identity is a keyed claim
        same = f"{row['identical']}/{row['prompts']}" if keyed else "— (unkeyed baseline)"
        lines.append(
            f"| {cell} | {row['aatps_mean']:.2f} ± {row['aatps_std']:.2f} | "
            f"{row['tokens_per_second_mean']:.1f} | {same} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    data = json.loads((RESULTS / "distill_objectives.json").read_text())
    (RESULTS / "distill_objectives.md").write_text(render(data))


if __name__ == "__main__":
    main()
