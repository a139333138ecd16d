"""The likelihood-ratio test (issue 15 item 5): tokens to α with and without the prompt, edits,
and its null on human and repetitive text.

The test (``detector.weighted.likelihood_ratio_test``, rule ``LIKELIHOOD_RATIO``, frozen on the
design split before this bench read the held-out one): S = Σ w_t (−ln r_t) with w_t =
round(4(1/max(p_t, 0.05) − 1))/4, p_t the processed probability of the text's own token
(``sampler.entropy.position_laws``: one forward of the target over the text through the served
default backend, llama.cpp where it is built, which is what the service has read since session
16; this run read a transformers float32 copy until session 17), after the tokenizer's BOS, or
after the generation's chat-templated prompt when the caller gives it;
p = P(S' <= S) under H0, exact (``weighted_log_cdf``).

Data: the generations of ``bench.detector_entropy`` (SmolLM2-135M-Instruct, mpfr, 128 tokens,
the bench key; T = 0.7 / top-p 0.95 and T = 1 / top-k 50; design = prompt ranks 0-9 of each
task, held-out = ranks 20-29). Reported:

- ``tokens_to_alpha``: per split and setting, the median scored tokens to reach α = 0.01 of
  the plain Aaronson test, the entropy-weighted test (``ENTROPY_WEIGHTING``), the LR test
  without the prompt and with it, and each one's ratio to plain (the issue: <= 0.7 at T = 0.7).
- ``edits``: TPR (whole text, p < α) after 30 % mixed random edits (``bench.detector_robustness
  .edit``), ``COPIES`` copies of each held-out T = 1 generation; the prompt-conditioned law is
  computed on the edited text after the true prompt.
- ``h0``: rejections at α = 0.01 and 0.1 with their binomial 99 % upper bounds: the 227 human
  passages (``data/human-pydoc.jsonl``) under ``H0_KEYS`` keys, laws at T = 0.7 without a prompt
  and after a design prompt (passage i gets prompt i mod 20), and at T = 1 after a prompt;
  ``REPETITIVE_TEXTS`` adversarially repetitive id sequences under ``H0_KEYS`` keys (T = 0.7, no
  prompt). The weights do not depend on the key, so each text's law is computed once.
- ``cost``: seconds of the law's forward per token on this CPU.

``choose`` reads the design split only: the median scored tokens to α of each candidate rule
(``CANDIDATES``: the linear grid of session 15 and geometric grids over floor and L), with and
without the prompt, at both settings, and the share of final p-values that are the exact series.
The rule is picked by the T = 0.7 with-prompt median (the issue's setting), ties broken by T =
0.7 without the prompt, then T = 1 with it, then the order of ``CANDIDATES``.

``laws`` (session 16): the LR test's median tokens to α on both splits with the law read
through transformers float32 (what the main run used before session 17) and through the served
default backend (llama.cpp where it is built: the law the generations were sampled from), after
BOS and after the prompt, and each backend's cost per token.

    python -m bench.detector_likelihood_ratio          # -> detector_likelihood_ratio.{json,md}
    python -m bench.detector_likelihood_ratio choose   # -> detector_likelihood_ratio_design.json
    python -m bench.detector_likelihood_ratio laws     # -> detector_likelihood_ratio_laws.json
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import numpy as np
from scipy import stats

from bench.common import RESULTS
from bench.detector_common import DATA, bench_source, data_home, run_metadata
from bench.detector_entropy import generations, processing_of, tokens_to_alpha
from bench.detector_generations import chosen_prompts
from bench.detector_robustness import edit
from detector import DetectOptions, detect
from detector.stats import LN10, aaronson_log_sf
from detector.weighted import (
    ENTROPY_WEIGHTING,
    LIKELIHOOD_RATIO,
    LikelihoodRatioWeighting,
    likelihood_ratio_test,
    weighted_log_sf,
)
from keyed import KeyedSource
from tests.detector.helpers import repetitive_ids

ALPHA = 0.01
COPIES = 5
EDIT_RATE = 0.3
H0_KEYS = 10
REPETITIVE_TEXTS = 150
OUT_JSON = RESULTS / "detector_likelihood_ratio.json"
OUT_MD = RESULTS / "detector_likelihood_ratio.md"
OUT_DESIGN = RESULTS / "detector_likelihood_ratio_design.json"
OUT_LAWS = RESULTS / "detector_likelihood_ratio_laws.json"
CANDIDATES = (
    LikelihoodRatioWeighting(0.05, 4, "linear"),  # session 15's rule
    *(
        LikelihoodRatioWeighting(floor, levels, "geometric")
        for floor in (0.02, 0.05, 0.1)
        for levels in (1, 2, 4)
    ),
)
TESTS = ("plain", "entropy_weighted", "lr_no_prompt", "lr_prompt")


class Model:
    """The target at ``precision`` (the main run: ``auto``, the service's default backend), its
    tokenizer, and the position laws of a text through that backend (timed)."""

    def __init__(self, precision: str = "auto") -> None:
        from sampler.models import DEFAULT_MODEL, load_model

        self.loaded = load_model(DEFAULT_MODEL, data_home(), device="cpu", precision=precision)
        self.tok = self.loaded.tokenizer
        bos = self.tok.bos_token_id
        self.bos = [] if bos is None else [int(bos)]
        self.seconds = 0.0
        self.tokens = 0

    def prompt(self, messages: Any) -> list[int]:
        from sampler.completion import prompt_ids

        return [int(t) for t in prompt_ids(self.loaded, messages=messages)]

    def laws(self, ids: list[int], setting: str, prefix: list[int] | None) -> Any:
        from sampler.entropy import position_laws

        start = time.perf_counter()
        laws = position_laws(
            self.loaded.target,
            ids,
            processing_of(setting),
            prefix=self.bos if prefix is None else prefix,
        )
        self.seconds += time.perf_counter() - start
        self.tokens += len(ids)
        return laws


def scored(tok: Any, source: KeyedSource, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    found = detect(tok, source, token_ids=ids, options=DetectOptions())
    return found.evidence.skip, found.evidence.terms["aaronson"]


def curves(
    skip: np.ndarray, x: np.ndarray, entropy: np.ndarray, logps: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """log10 p of every prefix (n = 1..M scored tokens) per test."""
    mask = skip == 0
    w_entropy = ENTROPY_WEIGHTING.weights(entropy)[mask]
    out: dict[str, list[float]] = {t: [] for t in TESTS}
    n_scored = x.size
    cut = np.flatnonzero(mask)
    for n in range(1, n_scored + 1):
        head = x[:n]
        out["plain"].append(aaronson_log_sf(n, float(head.sum())) / LN10)
        w = w_entropy[:n]
        out["entropy_weighted"].append(weighted_log_sf(w, float(w @ head))[0] / LN10)
        upto = int(cut[n - 1]) + 1  # text positions up to the n-th scored one
        for name, logp in logps.items():
            test = likelihood_ratio_test(skip[:upto], head, logp[:upto])
            out[name].append(test.log_p / LN10)
    return {t: np.array(v) for t, v in out.items()}


def tokens_section(model: Model, source: KeyedSource) -> dict[str, Any]:
    prompts = {str(p["id"]): p for split in (0, 20) for p in chosen_prompts(10, split)}
    result: dict[str, Any] = {}
    for split in ("design", "heldout"):
        for setting in ("t0.7", "t1"):
            reach: dict[str, list[float]] = {t: [] for t in TESTS}
            for row in generations(setting, split):
                ids = row["token_ids"]
                skip, x = scored(model.tok, source, ids)
                plain_law = model.laws(ids, setting, None)
                prompted = model.laws(ids, setting, model.prompt(prompts[row["id"]]["messages"]))
                logps = {
                    "lr_no_prompt": plain_law.token_logp.numpy(),
                    "lr_prompt": prompted.token_logp.numpy(),
                }
                for t, c in curves(skip, x, plain_law.entropy.numpy(), logps).items():
                    reach[t].append(tokens_to_alpha(c))
            base = float(np.median(reach["plain"]))
            cell: dict[str, Any] = {}
            for t in TESTS:
                med = float(np.median(reach[t]))
                cell[t] = {
                    "median_tokens_to_alpha": med if math.isfinite(med) else None,
                    "ratio_to_plain": med / base if math.isfinite(med) else None,
                    "never_reached": int(sum(map(math.isinf, reach[t]))),
                    "tokens_to_alpha": [None if math.isinf(v) else int(v) for v in reach[t]],
                }
            result[f"{split}/{setting}"] = cell
            print(split, setting, {t: cell[t]["median_tokens_to_alpha"] for t in TESTS}, flush=True)
    return result


def rule_name(rule: LikelihoodRatioWeighting) -> str:
    return f"{rule.grid}/f{rule.floor}/L{rule.levels}"


def lr_prefixes(
    skip: np.ndarray,
    x: np.ndarray,
    logp: np.ndarray,
    rule: LikelihoodRatioWeighting = LIKELIHOOD_RATIO,
) -> tuple[float, bool]:
    """(scored tokens until the LR p first falls below α, inf if never; whether the whole
    text's p is the exact series), from the test on every prefix of n scored tokens."""
    cut = np.flatnonzero(skip == 0)
    tests = [
        likelihood_ratio_test(skip[:upto], x[:n], logp[:upto], rule)
        for n, upto in enumerate(cut + 1, start=1)
    ]
    curve = np.array([t.log_p / LN10 for t in tests])
    return tokens_to_alpha(curve), bool(tests) and tests[-1].method == "exact"


def choose() -> None:
    """The design split only: every candidate's median tokens to α (module docstring)."""
    start = time.perf_counter()
    model = Model("float32")  # as chosen in session 16
    source = bench_source()
    prompts = {str(p["id"]): p for p in chosen_prompts(10, 0)}
    reach: dict[str, dict[str, list[float]]] = {}
    exact: dict[str, dict[str, list[bool]]] = {}
    for setting in ("t0.7", "t1"):
        for row in generations(setting, "design"):
            ids = row["token_ids"]
            skip, x = scored(model.tok, source, ids)
            logps = {
                "no_prompt": model.laws(ids, setting, None).token_logp.numpy(),
                "prompt": model.laws(
                    ids, setting, model.prompt(prompts[row["id"]]["messages"])
                ).token_logp.numpy(),
            }
            for rule in CANDIDATES:
                for given, logp in logps.items():
                    cell, name = f"{setting}/{given}", rule_name(rule)
                    tokens, is_exact = lr_prefixes(skip, x, logp, rule)
                    reach.setdefault(name, {}).setdefault(cell, []).append(tokens)
                    exact.setdefault(name, {}).setdefault(cell, []).append(is_exact)
        print(setting, "done", flush=True)
    table = {
        name: {
            cell: {
                "median_tokens_to_alpha": float(np.median(v)),
                "never_reached": int(sum(map(math.isinf, v))),
                "exact_share_full_text": float(np.mean(exact[name][cell])),
            }
            for cell, v in cells.items()
        }
        for name, cells in reach.items()
    }
    order = [rule_name(r) for r in CANDIDATES]
    keys = ("t0.7/prompt", "t0.7/no_prompt", "t1/prompt")
    best = min(
        order,
        key=lambda n: (*(table[n][k]["median_tokens_to_alpha"] for k in keys), order.index(n)),
    )
    result = {
        **run_metadata(),
        "alpha": ALPHA,
        "split": "design",
        "candidates": [r.to_json() for r in CANDIDATES],
        "median_tokens_to_alpha": table,
        "chosen": best,
        "seconds": round(time.perf_counter() - start, 1),
    }
    for name in order:
        print(name, {k: v["median_tokens_to_alpha"] for k, v in table[name].items()})
    print("chosen", best)
    OUT_DESIGN.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT_DESIGN}")


def laws() -> None:
    """Both splits: the LR test (``LIKELIHOOD_RATIO``) with the law read through transformers
    float32 and through the served default backend (``precision`` auto: llama.cpp where it is
    built), after BOS and after the prompt (module docstring)."""
    start = time.perf_counter()
    models = {"float32": Model("float32"), "served": Model("auto")}
    source = bench_source()
    table: dict[str, dict[str, Any]] = {}
    for split, offset in (("design", 0), ("heldout", 20)):
        prompts = {str(p["id"]): p for p in chosen_prompts(10, offset)}
        for setting in ("t0.7", "t1"):
            reach: dict[str, list[float]] = {"plain": []}
            for row in generations(setting, split):
                ids = row["token_ids"]
                skip, x = scored(models["float32"].tok, source, ids)
                plain = [
                    aaronson_log_sf(n, float(x[:n].sum())) / LN10 for n in range(1, x.size + 1)
                ]
                reach["plain"].append(tokens_to_alpha(np.array(plain)))
                prefix = models["float32"].prompt(prompts[row["id"]]["messages"])
                for law, model in models.items():
                    for given, pre in (("bos", None), ("prompt", prefix)):
                        logp = model.laws(ids, setting, pre).token_logp.numpy()
                        reach.setdefault(f"{law}/{given}", []).append(lr_prefixes(skip, x, logp)[0])
            table[f"{split}/{setting}"] = {
                name: {
                    "median_tokens_to_alpha": float(np.median(v)),
                    "never_reached": int(sum(map(math.isinf, v))),
                }
                for name, v in reach.items()
            }
            print(split, setting, table[f"{split}/{setting}"], flush=True)
    result = {
        **run_metadata(),
        "alpha": ALPHA,
        "rule": LIKELIHOOD_RATIO.to_json(),
        "served_precision": models["served"].loaded.precision,
        "median_tokens_to_alpha": table,
        "law_ms_per_token": {
            law: 1000.0 * m.seconds / max(m.tokens, 1) for law, m in models.items()
        },
        "seconds": round(time.perf_counter() - start, 1),
    }
    OUT_LAWS.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT_LAWS}")


def human_ids(tok: Any) -> list[list[int]]:
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        passages = [json.loads(line)["text"] for line in f]
    return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in passages]


def edits_section(model: Model, source: KeyedSource, human: list[list[int]]) -> dict[str, Any]:
    prompts = {str(p["id"]): p for p in chosen_prompts(10, 20)}
    pool = np.concatenate([np.asarray(h, dtype=np.int64) for h in human])
    rng = np.random.default_rng(20261203)
    hits: dict[str, list[bool]] = {t: [] for t in ("plain", "lr_no_prompt", "lr_prompt")}
    level = math.log(ALPHA)
    for row in generations("t1", "heldout"):
        prefix = model.prompt(prompts[row["id"]]["messages"])
        for _ in range(COPIES):
            ids = edit(row["token_ids"], EDIT_RATE, "mixed", pool, rng)
            skip, x = scored(model.tok, source, ids)
            hits["plain"].append(aaronson_log_sf(x.size, float(x.sum())) < level)
            for name, pre in (("lr_no_prompt", None), ("lr_prompt", prefix)):
                logp = model.laws(ids, "t1", pre).token_logp.numpy()
                hits[name].append(likelihood_ratio_test(skip, x, logp).log_p < level)
    out = {t: float(np.mean(v)) for t, v in hits.items()}
    print("edits", out, flush=True)
    return {"edit_rate": EDIT_RATE, "copies": COPIES, "n": len(hits["plain"]), "tpr": out}


def h0_count(log_p: list[float], alpha: float) -> dict[str, Any]:
    n = len(log_p)
    count = int(sum(v < math.log(alpha) for v in log_p))
    bound = int(stats.binom.ppf(0.995, n, alpha))
    return {"n": n, "count": count, "rate": count / n, "bound_99": bound, "ok": count <= bound}


def h0_section(model: Model, human: list[list[int]]) -> dict[str, Any]:
    design = [p["messages"] for p in chosen_prompts(10, 0)]
    keys = [bench_source(f"h0-lr-{k}") for k in range(H0_KEYS)]
    cases: dict[str, list[float]] = {
        "human/t0.7/no_prompt": [],
        "human/t0.7/prompt": [],
        "human/t1/prompt": [],
        "repetitive/t0.7/no_prompt": [],
    }
    for i, ids in enumerate(human):
        if i % 25 == 0:
            print(f"h0: passage {i} of {len(human)}", flush=True)
        prefix = model.prompt(design[i % len(design)])
        laws = {
            "human/t0.7/no_prompt": model.laws(ids, "t0.7", None),
            "human/t0.7/prompt": model.laws(ids, "t0.7", prefix),
            "human/t1/prompt": model.laws(ids, "t1", prefix),
        }
        for source in keys:
            skip, x = scored(model.tok, source, ids)
            for name, law in laws.items():
                cases[name].append(likelihood_ratio_test(skip, x, law.token_logp.numpy()).log_p)
    rng = np.random.default_rng(7)
    for i in range(REPETITIVE_TEXTS):
        ids = repetitive_ids(rng, i % 3)
        logp = model.laws(ids, "t0.7", None).token_logp.numpy()
        for source in keys:
            skip, x = scored(model.tok, source, ids)
            cases["repetitive/t0.7/no_prompt"].append(likelihood_ratio_test(skip, x, logp).log_p)
    out = {name: {str(a): h0_count(v, a) for a in (0.01, 0.1)} for name, v in cases.items()}
    print("h0", out, flush=True)
    return out


def report(result: dict[str, Any]) -> str:
    lines = [
        "# The likelihood-ratio test: tokens to α, edits, H0",
        "",
        f"Generated by `python -m bench.detector_likelihood_ratio` (its docstring). Commit "
        f"{result['commit']}, {result['hardware']['cpu']}. α = {ALPHA}. The law is read through "
        f"the `{result.get('law_precision', 'float32')}` backend.",
        "",
        "Median scored tokens to reach α (ratio to plain; texts that never reach it):",
        "",
        "| split / setting | plain | entropy-weighted | LR, no prompt | LR, with prompt |",
        "|---|---|---|---|---|",
    ]
    for cell_name, cell in result["tokens_to_alpha"].items():
        row = [cell_name]
        for t in TESTS:
            c = cell[t]
            ratio = "" if c["ratio_to_plain"] is None else f" ({c['ratio_to_plain']:.2f}×)"
            row.append(f"{c['median_tokens_to_alpha']}{ratio}, {c['never_reached']}")
        lines.append("| " + " | ".join(row) + " |")
    e = result["edits"]
    lines += [
        "",
        f"30 % mixed edits, held-out T = 1, {e['n']} copies, whole-text TPR at α: "
        + ", ".join(f"{k} {v:.3f}" for k, v in e["tpr"].items()),
        "",
        "H0 (count of p < α, binomial 99 % upper bound):",
        "",
        "| texts / law | n | α = 0.01 | α = 0.1 |",
        "|---|---|---|---|",
    ]
    for name, row in result["h0"].items():
        a, b = row["0.01"], row["0.1"]
        lines.append(
            f"| {name} | {a['n']} | {a['count']} (bound {a['bound_99']}) | "
            f"{b['count']} (bound {b['bound_99']}) |"
        )
    c = result["cost"]
    lines += ["", f"Cost of the law: {c['ms_per_token']:.2f} ms per token ({c['tokens']} tokens)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    start = time.perf_counter()
    model = Model()
    source = bench_source()
    human = human_ids(model.tok)
    result: dict[str, Any] = {
        **run_metadata(),
        "alpha": ALPHA,
        "rule": LIKELIHOOD_RATIO.to_json(),
        "law_precision": model.loaded.precision,
    }
    result["tokens_to_alpha"] = tokens_section(model, source)
    result["edits"] = edits_section(model, source, human)
    result["h0"] = h0_section(model, human)
    result["cost"] = {
        "tokens": model.tokens,
        "seconds": round(model.seconds, 2),
        "ms_per_token": 1000.0 * model.seconds / max(model.tokens, 1),
    }
    result["seconds"] = round(time.perf_counter() - start, 1)
    OUT_JSON.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    OUT_MD.write_text(report(result), encoding="utf-8")
    print(f"wrote {OUT_JSON} and {OUT_MD}")


if __name__ == "__main__":
    {"choose": choose, "laws": laws}.get(" ".join(sys.argv[1:]), main)()
