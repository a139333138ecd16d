"""Detection under edits and dilution, and every exposed test under H0.

Input: the held-out generations ``bench/results/detector_heldout.jsonl`` (20 prompts never
used to design the tests: ranks 20-29 of each task in ``bench.detector_generations``'s hash
order; SmolLM2-135M-Instruct, ``mpfr``, T = 1, top-k 50, 128 new tokens, the bench key) and
the 227 human passages of ``data/human-pydoc.jsonl``.

Attacks (fixed seeds; replacement and inserted tokens drawn from the human passages' tokens):
- edits at rate ε in {0.1, 0.2, 0.3, 0.4}: round(ε·n) edits at uniform positions, each a
  substitution, an insertion or a deletion (``sub``, ``ins``, ``del``; ``mixed``: each edit's
  kind uniform over the three); ``REPEATS`` edited copies per generation;
- dilution 1:15: the answer placed at a uniform token offset inside human text 15 times its
  length (passages in a seeded random order), ``REPEATS`` placements per generation.

Tests (each reports an exact or valid p; TPR = the fraction with p < α = 0.01, which is the
TPR at 1 % FPR for a test whose FPR <= α, checked in the H0 table):
- ``whole_text``: the plain Aaronson p of the whole text;
- ``verdict``: the verdict's test, whole text and windows (``detector.combined``);
- ``realigned``: the edit-tolerant re-aligned test (``detector.realign``);
- ``verdict_or_realigned``: not exposed, what the two together would give (Bonferroni,
  min(1, 2·min)), to inform the decision.

H0: the human passages under ``H0_KEYS`` keys (single-key tests), adversarially repetitive
id sequences (short cycles, a few-token vocabulary, a repeated phrase with one varying slot)
under ``H0_KEYS_REPETITIVE`` keys, and multi-key detection of every human passage against
``MULTI_KEYS`` keys (the verdict's, whole-text and span p corrected for K). Each count is
compared with the upper end of the central 99 % interval of Binomial(N, α).

Writes ``bench/results/detector_robustness.json`` and ``detector_robustness.png``.

    python -m bench.detector_robustness
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np
from scipy import stats

from bench.common import RESULTS
from bench.detector_common import DATA, bench_source, data_home, run_metadata
from detector import DetectOptions, detect
from detector.multikey import detect_multi
from keyed import KeyedSource
from sampler.models import DEFAULT_MODEL, load_tokenizer
from tests.detector.helpers import repetitive_ids

HELDOUT = RESULTS / "detector_heldout.jsonl"
OUT_JSON = RESULTS / "detector_robustness.json"
OUT_PNG = RESULTS / "detector_robustness.png"
ALPHA = 0.01
RATES = (0.0, 0.1, 0.2, 0.3, 0.4)
KINDS = ("sub", "ins", "del", "mixed")
REPEATS = 10
DILUTION = 15
H0_KEYS = 20
H0_KEYS_REPETITIVE = 10
REPETITIVE_TEXTS = 300
MULTI_KEYS = 20
FULL = 128
TESTS = ("whole_text", "verdict", "realigned", "verdict_or_realigned")


def edit(
    ids: list[int], rate: float, kind: str, pool: np.ndarray, rng: np.random.Generator
) -> list[int]:
    """``ids`` after round(rate·n) random edits of ``kind`` (module docstring)."""
    return edit_with_origins(ids, rate, kind, pool, rng)[0]


def edit_with_origins(
    ids: list[int], rate: float, kind: str, pool: np.ndarray, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """``edit``'s copy (the same draws from ``rng``) and, per token of it, the index of the
    original token it is (-1: substituted or inserted)."""
    out = list(ids)
    origin = list(range(len(ids)))
    for _ in range(round(rate * len(ids))):
        which = kind if kind != "mixed" else ("sub", "ins", "del")[int(rng.integers(3))]
        j = int(rng.integers(len(out)))
        token = int(pool[rng.integers(pool.size)])
        if which == "sub":
            out[j], origin[j] = token, -1
        elif which == "ins":
            out.insert(j, token)
            origin.insert(j, -1)
        elif len(out) > 1:
            del out[j], origin[j]
    return out, origin


def dilute(ids: list[int], human: list[list[int]], rng: np.random.Generator) -> list[int]:
    """``ids`` at a uniform offset inside DILUTION × len(ids) human tokens."""
    need = DILUTION * len(ids)
    filler: list[int] = []
    for i in rng.permutation(len(human)).tolist():
        filler += human[i] + [198, 198]  # passages separated by a blank line ("\n\n")
        if len(filler) >= need:
            break
    filler = filler[:need]
    cut = int(rng.integers(need + 1))
    return filler[:cut] + ids + filler[cut:]


def p_values(tok: Any, source: KeyedSource, ids: list[int]) -> dict[str, float]:
    """log10 p of every test on one text."""
    found = detect(tok, source, token_ids=ids, options=DetectOptions(realign=True))
    assert found.realigned is not None and found.test is not None
    out = {
        "whole_text": found.p_value.log10_p_value,
        "verdict": found.test.log10_p_value,
        "realigned": found.realigned.log10_p_value,
    }
    out["verdict_or_realigned"] = min(0.0, min(out["verdict"], out["realigned"]) + math.log10(2))
    return out


def rates_of(values: list[dict[str, float]], alpha: float = ALPHA) -> dict[str, Any]:
    """TPR per test over all texts, and over the copies of full-length (128-token) answers
    (``full``: four of the 20 answers stop early, at 11, 30, 81 and 90 tokens)."""
    level = math.log10(alpha)
    full = [v for v in values if v.get("length", FULL) >= FULL]
    out: dict[str, Any] = {t: float(np.mean([v[t] < level for v in values])) for t in TESTS}
    out["full_length"] = {t: float(np.mean([v[t] < level for v in full])) for t in TESTS}
    out["full_length"]["n"] = len(full)
    return out


def h0_row(values: list[dict[str, float]]) -> dict[str, Any]:
    n = len(values)
    row: dict[str, Any] = {"n": n}
    for alpha in (0.1, 0.01):
        high = int(stats.binom.ppf(0.995, n, alpha))
        level = math.log10(alpha)
        for t in TESTS[:3]:
            count = int(sum(v[t] <= level for v in values))
            row[f"{t}@{alpha}"] = {
                "count": count,
                "rate": count / n,
                "bound_99": high,
                "ok": count <= high,
            }
    return row


def main() -> None:
    start = time.perf_counter()
    tok = load_tokenizer(DEFAULT_MODEL, data_home())
    base = bench_source()
    with HELDOUT.open(encoding="utf-8") as f:
        generations = [json.loads(line) for line in f if line.strip()]
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        passages = [json.loads(line)["text"] for line in f]
    human = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in passages]
    pool = np.concatenate([np.asarray(h, dtype=np.int64) for h in human])
    # the generations' key (their nonces only keyed repeated contexts, which are never scored)
    source = {g["id"]: base for g in generations}

    rng = np.random.default_rng(20261201)
    edits: dict[str, dict[str, dict[str, float]]] = {}
    for kind in KINDS:
        edits[kind] = {}
        for rate in RATES:
            if rate == 0.0 and kind != "mixed":
                continue
            values = []
            for g in generations:
                for _ in range(REPEATS if rate > 0 else 1):
                    ids = edit(g["token_ids"], rate, kind, pool, rng)
                    values.append(
                        p_values(tok, source[g["id"]], ids) | {"length": len(g["token_ids"])}
                    )
            edits[kind][str(rate)] = {**rates_of(values), "n": len(values)}
            print(kind, rate, edits[kind][str(rate)], flush=True)
    diluted = []
    for g in generations:
        for _ in range(REPEATS):
            ids = dilute(g["token_ids"], human, rng)
            diluted.append(p_values(tok, source[g["id"]], ids) | {"length": len(g["token_ids"])})
    dilution = {
        **rates_of(diluted),
        "n": len(diluted),
        "median_log10_p": {t: float(np.median([v[t] for v in diluted])) for t in TESTS},
    }
    print("dilution", dilution, flush=True)

    h0_human = [
        p_values(tok, bench_source(f"h0-{k}"), ids) for ids in human for k in range(H0_KEYS)
    ]
    rep_rng = np.random.default_rng(7)
    rep_texts = [repetitive_ids(rep_rng, i % 3) for i in range(REPETITIVE_TEXTS)]
    h0_rep = [
        p_values(tok, bench_source(f"h0-rep-{k}"), ids)
        for ids in rep_texts
        for k in range(H0_KEYS_REPETITIVE)
    ]
    multi_sources = {f"k{k}": bench_source(f"h0-multi-{k}") for k in range(MULTI_KEYS)}
    multi = {"verdict": [], "whole_text": [], "span": [], "span_uncorrected_for_keys": []}
    for ids in human:
        found = detect_multi(
            tok, multi_sources, token_ids=ids, options=DetectOptions(spans=True), detailed=1
        )
        spans = found.best.spans
        assert spans is not None
        multi["verdict"].append(found.log10_p_value)
        multi["whole_text"].append(found.whole_text_log10_p_value)
        multi["span"].append(found.span_log10_p_value or 0.0)
        multi["span_uncorrected_for_keys"].append(
            min((s.corrected_log10_p_value for s in spans.spans), default=0.0)
        )
    multi_row: dict[str, Any] = {"n": len(human), "keys": MULTI_KEYS}
    for alpha in (0.1, 0.01):
        high = int(stats.binom.ppf(0.995, len(human), alpha))
        for name, values in multi.items():
            count = int(sum(v <= math.log10(alpha) for v in values))
            multi_row[f"{name}@{alpha}"] = {
                "count": count,
                "rate": count / len(human),
                "bound_99": high,
                "ok": count <= high,
            }

    result = {
        **run_metadata(),
        "machine_load": "2 shared CPU cores with other helpers running tests; timings are not "
        "the point of this file",
        "generations": {
            "file": str(HELDOUT.relative_to(RESULTS.parent.parent)),
            "count": len(generations),
            "scored_tokens_mean": float(np.mean([len(g["token_ids"]) for g in generations])),
        },
        "alpha": ALPHA,
        "repeats": REPEATS,
        "edits": edits,
        "dilution_1_to_15": dilution,
        "h0": {
            "human": {**h0_row(h0_human), "keys": H0_KEYS},
            "repetitive": {**h0_row(h0_rep), "keys": H0_KEYS_REPETITIVE},
            "multi_key_human": multi_row,
        },
        "seconds": round(time.perf_counter() - start, 1),
    }
    OUT_JSON.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    plot(edits)
    print(f"wrote {OUT_JSON} and {OUT_PNG} in {result['seconds']} s")


def plot(edits: dict[str, dict[str, dict[str, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(KINDS), figsize=(4 * len(KINDS), 3.6), sharey=True)
    for ax, kind in zip(axes, KINDS, strict=True):
        cells = edits[kind]
        xs = (
            sorted(float(r) for r in cells)
            if kind == "mixed"
            else [0.0, *sorted(float(r) for r in cells)]
        )
        for test, style in zip(TESTS, ("-o", "-s", "-^", ":x"), strict=True):
            ys = [(edits["mixed"]["0.0"] if x == 0.0 else cells[str(x)])[test] for x in xs]
            ax.plot(xs, ys, style, label=test)
        ax.axhline(0.9, color="grey", lw=0.6, ls="--")
        ax.set_title(f"{kind} edits")
        ax.set_xlabel("edit rate")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TPR at α = 0.01")
    axes[-1].legend(loc="lower left", fontsize=8)
    fig.suptitle("20 held-out SmolLM2 generations (mpfr, T = 1, 128 tokens) × 10 edited copies")
    fig.tight_layout()
    fig.savefig(OUT_PNG, dpi=110)


if __name__ == "__main__":
    main()
