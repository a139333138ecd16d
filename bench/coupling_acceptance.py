"""First-level acceptance of the multi-draft couplings on the same contexts (Thm. 5.1).

The App. D harness (``bench.appd_eval``) measures each method on its own output: ``mpfr`` and
``gls`` write different texts, so their AATPS are compared across different contexts and the
gap sits inside the noise over prompts and keys. Here the couplings meet on the same contexts:

- contexts: for held-out prompts, ``basic-uwm`` generations of ``--tokens`` tokens (the text
  ``mpfr`` writes for the same key); at each position t, P_t is the processed target law and
  Q_t the processed level-1 law of the drafter (``heads``: from the target's h_{t−1} and the
  root token), i.e. the first level of a step rooted there;
- ``mpfr`` (MPFR paper Alg. 7, level 1): ``--draws`` keys per context; keyed clocks
  E_{u,j}; drafts = the B first MPFR samples of Q_t; target = the keyed race winner of P_t
  (first arrivals); accepted iff the target token is among the drafts — the decoder's rule;
- ``gls`` (Rowan et al. 2025, level 1): B rows of Gumbel noise; drafts argmax log Q_t + G_i;
  target argmax over (i, x) of log P_t + G_i(x); accepted iff the target is among the drafts;
- the Theorem 5.1 bound 1 − Σ_x P_t(x) (P_t(x) / (P_t(x) + Q_t(x)))^B at the same context.

Both couplings only ever look at the union of the two supports (top-k 50 each): the clocks and
noise are drawn for those tokens. Per B: the mean over contexts of each acceptance probability
(each estimated from ``--draws`` draws), the mean bound, and the paired difference with its
standard error over contexts (the Monte Carlo noise is inside it).

    python -m bench.coupling_acceptance [--prompts 10] [--tokens 64] [--draws 512]

Writes ``bench/results/coupling_acceptance.{json,md}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any

import torch
from rich.progress import track

from bench.appd_eval import PROCESSING, heldout_prompts, key_source, output_laws
from bench.common import RESULTS, environment
from keyed import Secret, label_key
from keyed.tensor import exponential_clocks, keys_tensor
from sampler.baselines import gumbels
from sampler.completion import eos_ids, prompt_ids
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import make_drafter
from sampler.heads import HeadsDrafter
from sampler.models import DEFAULT_MODEL, load_model
from sampler.processing import process
from sampler.race import acceptance_lower_bound, mpfr_samples, race_winner

DRAFTS = (1, 2, 4, 6, 8)


def union_laws(
    p_logits: torch.Tensor, q_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Processed P and Q of one context on the union of their supports.

    Args:
        p_logits, q_logits: (V,) raw target and drafter logits.
    Returns:
        tokens (K,) int64, log P (K,) and log Q (K,) float64 (−inf off each support).
    """
    p, q = (
        process(p_logits[None].double(), PROCESSING),
        process(q_logits[None].double(), PROCESSING),
    )
    tokens = torch.unique(torch.cat([p.tokens[0], q.tokens[0]]))  # (K,)
    logp = torch.full(tokens.shape, -math.inf, dtype=torch.float64)
    logq = logp.clone()
    logp[torch.searchsorted(tokens, p.tokens[0])] = p.logp[0]
    logq[torch.searchsorted(tokens, q.tokens[0])] = q.logp[0]
    return tokens, logp, logq


def mpfr_accepts(
    tokens: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor, keys: torch.Tensor, drafts: int
) -> torch.Tensor:
    """(S,) bool: the level-1 MPFR coupling accepted, one context under S keys — with the
    decoder's own ``race_winner`` (target) and ``mpfr_samples`` (drafts)."""
    s = keys.shape[0]
    ids = tokens.expand(s, -1)  # (S, K)
    clocks = exponential_clocks(keys, ids, drafts)  # (S, K, B)
    target = race_winner(logp.expand(s, -1), ids, clocks[..., 0]).tolist()  # (S,)
    drafted = mpfr_samples(logq.expand(s, -1), ids, clocks, [drafts] * s)  # S lists of B
    return torch.tensor([t in d for t, d in zip(target, drafted, strict=True)])


def gls_accepts(
    logp: torch.Tensor, logq: torch.Tensor, generator: torch.Generator, draws: int, drafts: int
) -> torch.Tensor:
    """(S,) bool: the level-1 GLS coupling accepted, one context, S draws of the noise."""
    k = logp.shape[0]
    noise = gumbels(generator, (draws, drafts, k))  # (S, B, K)
    drafted = torch.argmax(logq + noise, dim=-1)  # (S, B) slots
    target = torch.argmax((logp + noise).reshape(draws, -1), dim=-1) % k  # (S,) slot
    return (drafted == target[:, None]).any(dim=1)


def contexts(loaded: Any, drafter: HeadsDrafter, prompt: list[int], ids: list[int]) -> list:
    """``union_laws`` (tokens, log P, log Q) at each position of ``ids`` (module docstring)."""
    p_logits, q_logits = output_laws(loaded, prompt, ids, drafter)
    assert q_logits is not None
    return [union_laws(p_logits[t].cpu(), q_logits[t].cpu()) for t in range(len(ids))]


def mean_se(values: list[float]) -> tuple[float, float]:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.fmean(values), se


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=10, help="held-out prompts per task")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--draws", type=int, default=512, help="keys / noise draws per context")
    parser.add_argument(
        "--home", type=Path, default=Path("~/.local/share/poissonmark").expanduser()
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "coupling_acceptance.json")
    args = parser.parse_args()

    loaded = load_model(DEFAULT_MODEL, args.home, device="cpu")
    drafter = make_drafter("heads", loaded.target)
    assert isinstance(drafter, HeadsDrafter)
    rows = heldout_prompts(args.prompts)
    laws = []
    secret = Secret(hashlib.sha256(b"coupling-acceptance").digest())
    for row in track(rows, description="generating contexts"):
        prompt = prompt_ids(loaded, messages=row["messages"])
        config = SamplerConfig("basic-uwm", 1, 1, args.tokens, PROCESSING)
        result = generate(
            loaded.target, prompt, config, key_source(0, row["id"]), None, eos_ids(loaded)
        )
        laws += contexts(loaded, drafter, prompt, list(result.token_ids))
    generator = torch.Generator().manual_seed(0)
    per_b: dict[str, Any] = {}
    for drafts in DRAFTS:
        mpfr, gls, bound, diff = [], [], [], []
        for index, (tokens, logp, logq) in enumerate(track(laws, description=f"B = {drafts}")):
            keys = keys_tensor([label_key(secret, (drafts, index, s)) for s in range(args.draws)])
            a = float(mpfr_accepts(tokens, logp, logq, keys, drafts).double().mean())
            g = float(gls_accepts(logp, logq, generator, args.draws, drafts).double().mean())
            mpfr.append(a)
            gls.append(g)
            diff.append(a - g)
            bound.append(acceptance_lower_bound(logp.exp(), logq.exp(), drafts))
        per_b[str(drafts)] = {
            "mpfr": mean_se(mpfr),
            "gls": mean_se(gls),
            "thm51_bound": mean_se(bound),
            "mpfr_minus_gls": mean_se(diff),
            "mpfr_minus_bound": mean_se([a - b for a, b in zip(mpfr, bound, strict=True)]),
        }
        print(drafts, json.dumps(per_b[str(drafts)]))
    payload = {
        "benchmark": "coupling_acceptance",
        "model": DEFAULT_MODEL,
        "environment": environment(),
        "setup": {
            "drafter": "heads",
            "prompts": [r["id"] for r in rows],
            "tokens": args.tokens,
            "contexts": len(laws),
            "draws_per_context": args.draws,
            "processing": {"temperature": 1.0, "top_k": 50, "top_p": 1.0},
            "entries": "[mean over contexts, standard error over contexts]",
        },
        "first_level_acceptance": per_b,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(report(payload))


def report(payload: dict[str, Any]) -> str:
    setup, env = payload["setup"], payload["environment"]
    lines = [
        "# First-level acceptance on the same contexts: mpfr vs gls vs Theorem 5.1",
        "",
        f"Model {payload['model']}, drafter `{setup['drafter']}`, {setup['contexts']} contexts "
        f"({len(setup['prompts'])} held-out prompts × {setup['tokens']} tokens of the "
        f"basic-uwm/mpfr text), {setup['draws_per_context']} draws per context; T = 1, top-k 50. "
        f"Commit `{env['commit'][:10]}`, {env['hardware']['cpu']}, {env['date']}. "
        "Entries: mean over contexts ± standard error over contexts "
        "(`python -m bench.coupling_acceptance`).",
        "",
        "| B | mpfr | gls | Thm 5.1 bound | mpfr − gls | mpfr − bound |",
        "|---|---|---|---|---|---|",
    ]
    for b, row in payload["first_level_acceptance"].items():
        cells = " | ".join(
            f"{row[k][0]:.4f} ± {row[k][1]:.4f}"
            for k in ("mpfr", "gls", "thm51_bound", "mpfr_minus_gls", "mpfr_minus_bound")
        )
        lines.append(f"| {b} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
