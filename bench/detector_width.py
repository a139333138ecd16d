"""Edit robustness against the key's context width m (issue 15): how many labels survive edits.

An edit destroys the labels of the m positions after it (their context holds the edited token),
so a fraction ~(1 − ε)^(m+1) of the labels survives edits at rate ε: 0.17 at m = 4 and ε = 0.3,
0.34 at m = 2, 0.49 at m = 1. No test can score a destroyed label; the width is the lever. It is
a per-key setting (``POST /v1/keys`` ``context_width``, default 4, docs/design.md §2) and it costs
something at small m: more contexts repeat, and repeated contexts are masked at generation and
skipped at detection (fewer scored tokens; case C-series: masking keeps the output exact).

For each m in ``WIDTHS``: the 20 held-out prompts of ``bench.detector_robustness`` (ranks 20-29
of each task) generated with ``mpfr`` (drafter ``ngram``, B = L = 4, T = 1, top-k 50, 128
tokens) under the bench secret at width m; then the attacks of ``bench.detector_robustness``
(``edit``, ``dilute``; ``REPEATS`` copies each, fixed seeds) and its tests (``p_values``:
whole text, the verdict's test, the re-aligned test); H0 at the same width: the 227 human
passages under ``H0_KEYS`` keys and ``REPETITIVE_TEXTS`` adversarially repetitive texts under
``H0_KEYS_REPETITIVE`` keys, against the binomial 99 % bound. TPR is the fraction with
p < α = 0.01.

Generations are cached in ``bench/results/detector_width_generations.jsonl`` (resumable).
Writes ``bench/results/detector_width.json`` and ``detector_width.md``.

    python -m bench.detector_width
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS
from bench.detector_common import DATA, bench_secret, data_home, run_metadata
from bench.detector_generations import _rank, chosen_prompts
from bench.detector_robustness import ALPHA, dilute, edit, h0_row, p_values, rates_of
from detector import detect
from keyed import KeyedSource
from sampler.completion import complete, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.models import DEFAULT_MODEL, load_model, load_tokenizer
from sampler.processing import Processing
from tests.detector.helpers import repetitive_ids

WIDTHS = (1, 2, 3, 4)
ATTACKS = (("mixed", 0.2), ("mixed", 0.3), ("sub", 0.3), ("ins", 0.3), ("del", 0.3))
REPEATS = 10
H0_KEYS = 10
H0_KEYS_REPETITIVE = 5
REPETITIVE_TEXTS = 300
CACHE = RESULTS / "detector_width_generations.jsonl"
OUT_JSON = RESULTS / "detector_width.json"
OUT_MD = RESULTS / "detector_width.md"
TOKENS = 128


def source_at(width: int, name: str | None = None, nonce: int = 0) -> KeyedSource:
    secret = bench_secret(name) if name else bench_secret()
    return KeyedSource(secret, context_width=width, masking=True, nonce=nonce)


def generations(cache: Path = CACHE) -> dict[int, list[dict[str, Any]]]:
    """The held-out generations at every width (generated once, then read from ``cache``)."""
    rows: list[dict[str, Any]] = []
    if cache.exists():
        rows = [json.loads(line) for line in cache.read_text().splitlines() if line.strip()]
    done = {(r["width"], r["id"]) for r in rows}
    prompts = chosen_prompts(10, 20)
    todo = [(m, p) for m in WIDTHS for p in prompts if (m, p["id"]) not in done]
    if todo:
        loaded = load_model(DEFAULT_MODEL, data_home(), device="cpu")
        config = SamplerConfig("mpfr", 4, 4, TOKENS, Processing(1.0, 50, 1.0))
        for width, prompt in todo:
            nonce = int(_rank(str(prompt["id"])), 16)
            ids = prompt_ids(loaded, messages=prompt["messages"])  # type: ignore[arg-type]
            out = complete(loaded, ids, config, source_at(width, nonce=nonce), "ngram")
            row = {
                "width": width,
                "id": prompt["id"],
                "nonce": nonce,
                "token_ids": list(out.result.token_ids),
                "precision": loaded.precision,
            }
            with cache.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
            print(width, prompt["id"], len(row["token_ids"]), flush=True)
    by_width: dict[int, list[dict[str, Any]]] = {m: [] for m in WIDTHS}
    for r in rows:
        by_width[r["width"]].append(r)
    return by_width


def main() -> None:
    start = time.perf_counter()
    tok = load_tokenizer(DEFAULT_MODEL, data_home())
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        passages = [json.loads(line)["text"] for line in f]
    human = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in passages]
    pool = np.concatenate([np.asarray(h, dtype=np.int64) for h in human])
    result: dict[str, Any] = {**run_metadata(), "alpha": ALPHA, "repeats": REPEATS, "widths": {}}
    for width, gens in generations().items():
        source = source_at(width)
        rng = np.random.default_rng(20261202 + width)
        row: dict[str, Any] = {"generations": len(gens)}
        intact = [p_values(tok, source, g["token_ids"]) for g in gens]
        row["intact"] = rates_of(intact)
        scored = []
        for g in gens:
            found = detect(tok, source, token_ids=g["token_ids"])
            scored.append(found.num_scored / max(found.num_tokens, 1))
        row["scored_share_intact"] = float(np.mean(scored))
        for kind, rate in ATTACKS:
            values = [
                p_values(tok, source, edit(g["token_ids"], rate, kind, pool, rng))
                | {"length": len(g["token_ids"])}
                for g in gens
                for _ in range(REPEATS)
            ]
            row[f"{kind}_{rate}"] = rates_of(values)
        diluted = [
            p_values(tok, source, dilute(g["token_ids"], human, rng))
            | {"length": len(g["token_ids"])}
            for g in gens
            for _ in range(REPEATS)
        ]
        row["dilution_1_to_15"] = rates_of(diluted)
        h0 = [p_values(tok, source_at(width, f"h0-w{k}"), ids) for ids in human
              for k in range(H0_KEYS)]  # fmt: skip
        rep_rng = np.random.default_rng(70 + width)
        texts = [repetitive_ids(rep_rng, i % 3) for i in range(REPETITIVE_TEXTS)]
        h0_rep = [p_values(tok, source_at(width, f"h0-wr{k}"), ids) for ids in texts
                  for k in range(H0_KEYS_REPETITIVE)]  # fmt: skip
        row["h0_human"], row["h0_repetitive"] = h0_row(h0), h0_row(h0_rep)
        result["widths"][str(width)] = row
        print(width, json.dumps({k: row[k] for k in ("intact", "mixed_0.3")}), flush=True)
    result["seconds"] = round(time.perf_counter() - start, 1)
    OUT_JSON.write_text(json.dumps(result, indent=1) + "\n")
    OUT_MD.write_text(report(result))
    print(f"wrote {OUT_JSON} and {OUT_MD}")


def report(result: dict[str, Any]) -> str:
    tests = ("whole_text", "verdict", "realigned")
    lines = [
        "# Edit robustness against the key's context width m",
        "",
        "Generated by `python -m bench.detector_width` (see its docstring). TPR at α = 0.01 "
        f"(p < α), {REPEATS} copies of each of the 20 held-out generations per attack; "
        "whole text / verdict / re-aligned. H0: count at α = 0.01 against the binomial 99 % "
        f"bound. Commit {result.get('commit', '?')}, {result.get('hardware', {}).get('cpu', '?')}.",
        "",
        "| m | scored share | intact | mixed 20 % | mixed 30 % | sub 30 % | ins 30 % | del 30 % "
        "| dilution 1:15 | H0 human (verdict) | H0 repetitive (verdict) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for width, row in result["widths"].items():
        cells = [width, f"{row['scored_share_intact']:.2f}"]
        for key in ("intact", "mixed_0.2", "mixed_0.3", "sub_0.3", "ins_0.3", "del_0.3",
                    "dilution_1_to_15"):  # fmt: skip
            cells.append(" / ".join(f"{row[key][t]:.3f}" for t in tests))
        for key in ("h0_human", "h0_repetitive"):
            cell = row[key]["verdict@0.01"]
            cells.append(f"{cell['count']}/{row[key]['n']} (bound {cell['bound_99']})")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
