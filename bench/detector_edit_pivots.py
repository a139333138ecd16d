"""Do tests that look for the intact labels among the pivots gain on edited text? (issue 15)

At context width m = 4, random edits at rate ε leave ≈ (1 − ε)^(m+1) of the labels intact (0.17
at ε = 0.3); the rest carry pivots that are U(0, 1), as under H0. The plain Aaronson test sums
every scored position's term. This bench asks whether a test that *looks for* the intact
labels in the pivots themselves does better, with three statistics of the scored pivots r_t
(text order), each against the plain test on the same edited copies:

- ``thresholded``: S_c = Σ max(−ln(1 − r_t) − c, 0), c = 1. Exact null: the excess of an Exp(1)
  over c is Exp(1) with probability e^−c, so S_c ~ Gamma(K, 1) with K ~ Binomial(M, e^−c);
  p = Σ_k P(K = k)·Q(k, S_c).
- ``mixture``: Σ ln(1 − q + q·h(r_t)), q = 0.3, the Neyman–Pearson statistic against its own
  alternative (positions independently intact with probability q; q = 0.3 is ε ≈ 0.21 at m = 4),
  with h the law of an intact pivot: a mixture of Beta(a, 1) (a = 1/p for a token of probability
  p; a ∈ {1, 2, 4, …, 256}) fitted by EM to the pivots of the unedited *design* generations (so
  the design rows are in-sample for h). Its 1 % critical value is simulated under H0
  (``NULL_DRAWS`` draws per M): a calibrated comparison, not a p-value the product could report.
- ``hmm``: a likelihood ratio over the edit process itself: a chain over "steps since the last
  edit" (0..m, then intact), an edit at each position with probability ε, emission h(r) on an
  intact scored label and 1 otherwise, averaged over ε ∈ ``HMM_RATES``. It is an e-value
  (E_H0 = 1 for any fixed h), so p = min(1, 1/E) is valid by Markov's inequality.

Data: the 40 design generations (``detector_generations.jsonl``, basic-uwm, T = 1, top-k 50,
160 tokens; h is fitted on them) and the 20 held-out ones (``detector_heldout.jsonl``, mpfr,
128 tokens); ``COPIES`` copies per generation and rate of ``bench.detector_robustness.edit``'s
mixed edits (fixed seed); H0: the 227 human passages × ``H0_KEYS`` keys. TPR = share with p <
α = 0.01 (``mixture``: above the simulated critical value), over all answers and over the
full-length ones (``max_new_tokens`` reached: 160 on the design split, 128 held out; the
held-out set has four answers that end early, at 11, 30, 81 and 90 tokens). ``paired``: each test
against plain on the same copies, the copies only it detects and only plain detects, with an exact
sign-test p over those discordant copies, and over the generations (more copies detected than
plain against fewer): the copies of one generation are not independent, the generations are.

Writes ``bench/results/detector_edit_pivots.json``.

    python -m bench.detector_edit_pivots
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np
from scipy import special, stats

from bench.common import RESULTS
from bench.detector_common import DATA, GENERATIONS, bench_source, data_home, run_metadata
from bench.detector_robustness import edit
from detector import DetectOptions, detect
from detector.stats import aaronson_log_sf
from sampler.models import DEFAULT_MODEL, load_tokenizer

HELDOUT = RESULTS / "detector_heldout.jsonl"
OUT_JSON = RESULTS / "detector_edit_pivots.json"
ALPHA = 0.01
RATES = (0.2, 0.3, 0.4)
COPIES = 10
H0_KEYS = 10
THRESHOLD = 1.0
SHARE = 0.3
HMM_RATES = (0.03, 0.1, 0.2, 0.3, 0.4)
WIDTH = 4
NULL_DRAWS = 4000
BETA_SHAPES = 2.0 ** np.arange(9)  # a = 1/p for p = 1, 1/2, ..., 1/256
TESTS = ("plain", "thresholded", "mixture", "hmm")


def fit_intact_law(pivots: np.ndarray, iterations: int = 500) -> np.ndarray:
    """Mixture weights over ``BETA_SHAPES`` fitted by EM (maximum likelihood) to intact pivots."""
    log_r = np.log(np.clip(pivots, 1e-300, 1.0))
    comp = np.log(BETA_SHAPES)[None, :] + (BETA_SHAPES[None, :] - 1) * log_r[:, None]
    weights = np.full(BETA_SHAPES.size, 1 / BETA_SHAPES.size)
    for _ in range(iterations):
        post = comp + np.log(weights)[None, :]
        post -= special.logsumexp(post, axis=1, keepdims=True)
        weights = np.exp(post).mean(axis=0)
    return weights


def log_h(pivots: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ln h(r): the fitted intact law's log density at each pivot."""
    log_r = np.log(np.clip(pivots, 1e-300, 1.0))
    comp = np.log(BETA_SHAPES)[None, :] + (BETA_SHAPES[None, :] - 1) * log_r[:, None]
    return special.logsumexp(comp + np.log(weights + 1e-300)[None, :], axis=1)


def thresholded_log10_p(pivots: np.ndarray) -> float:
    """Exact log10 p of S_c (module docstring)."""
    m = pivots.size
    if m == 0:
        return 0.0
    excess = np.maximum(-np.log1p(-pivots) - THRESHOLD, 0.0)
    s = float(excess.sum())
    ks = np.arange(m + 1)
    log_pk = stats.binom.logpmf(ks, m, math.exp(-THRESHOLD))
    # K = 0 gives S_c = 0: P(S_c' >= s) is 1 at s = 0, else 0
    tails = [0.0 if s == 0 else -math.inf] + [aaronson_log_sf(int(k), s) for k in ks[1:]]
    return float(special.logsumexp(log_pk + np.array(tails)) / math.log(10))


def mixture_score(pivots: np.ndarray, weights: np.ndarray) -> float:
    return float(np.logaddexp(math.log(1 - SHARE), math.log(SHARE) + log_h(pivots, weights)).sum())


def hmm_log10_e(skip: np.ndarray, pivots: np.ndarray, weights: np.ndarray) -> float:
    """log10 of the e-value over the edit process (module docstring), all rates at once."""
    emission = np.zeros(skip.size)
    scored = skip == 0
    emission[scored] = log_h(pivots, weights)
    rates = np.asarray(HMM_RATES)[:, None]
    states = WIDTH + 2  # steps since the last edit 0..m, then intact
    log_edit, log_keep = np.log(rates), np.log1p(-rates)
    steps = np.arange(WIDTH + 1)[None, :]
    start = np.concatenate([rates * (1 - rates) ** steps, (1 - rates) ** (WIDTH + 1)], axis=1)
    alpha = np.log(start)  # (rates, states): the chain's stationary law
    for t in range(skip.size):
        if t:
            new = np.empty_like(alpha)
            new[:, :1] = special.logsumexp(alpha, axis=1, keepdims=True) + log_edit
            new[:, 1 : states - 1] = alpha[:, : states - 2] + log_keep
            new[:, -1:] = np.logaddexp(alpha[:, -2:-1], alpha[:, -1:]) + log_keep
            alpha = new
        if scored[t]:
            alpha[:, -1] += emission[t]
    per_rate = special.logsumexp(alpha, axis=1)
    return float((special.logsumexp(per_rate) - math.log(len(HMM_RATES))) / math.log(10))


class MixtureNull:
    """Simulated 1 % critical values of the mixture statistic, per M."""

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights
        self.rng = np.random.default_rng(20261203)
        self.cache: dict[int, float] = {}

    def critical(self, m: int) -> float:
        if m not in self.cache:
            draws = self.rng.random((NULL_DRAWS, m)).ravel()
            terms = np.logaddexp(math.log(1 - SHARE), math.log(SHARE) + log_h(draws, self.weights))
            self.cache[m] = float(np.quantile(terms.reshape(NULL_DRAWS, m).sum(axis=1), 1 - ALPHA))
        return self.cache[m]


def statistics(
    tok: Any, source: Any, ids: list[int], weights: np.ndarray, null: MixtureNull
) -> dict[str, bool]:
    """Whether each test rejects at α on one text."""
    found = detect(tok, source, token_ids=ids, options=DetectOptions())
    pivots, skip = found.evidence.pivots, found.evidence.skip
    level = math.log10(ALPHA)
    return {
        "plain": found.p_value.log10_p_value < level,
        "thresholded": thresholded_log10_p(pivots) < level,
        "mixture": pivots.size > 0 and mixture_score(pivots, weights) > null.critical(pivots.size),
        "hmm": hmm_log10_e(skip, pivots, weights) > -level,
    }


def per_answer(
    tok: Any, source: Any, generations: list[dict[str, Any]], rows: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Per generation: length, scored tokens and plain log10 p unedited, and how many of its
    copies each test detects at each rate (which answers the misses come from)."""
    out = []
    for i, g in enumerate(generations):
        found = detect(tok, source, token_ids=g["token_ids"], options=DetectOptions())
        copies = {rate: cells[i * COPIES : (i + 1) * COPIES] for rate, cells in rows.items()}
        out.append(
            {
                "id": g["id"],
                "length": len(g["token_ids"]),
                "scored": found.num_scored,
                "log10_p_unedited": round(found.p_value.log10_p_value, 2),
                "detected_of_copies": {
                    rate: {t: int(sum(c[t] for c in cells)) for t in TESTS}
                    for rate, cells in copies.items()
                },
            }
        )
    return out


def rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
    full = [r for r in rows if r["full"]]
    return {
        "n": len(rows),
        "tpr": {t: float(np.mean([r[t] for r in rows])) for t in TESTS},
        "full_length": {
            "n": len(full),
            "tpr": {t: float(np.mean([r[t] for r in full])) for t in TESTS},
        },
        "paired": {t: paired(rows, t) for t in TESTS[1:]},
    }


def paired(rows: list[dict[str, Any]], test: str) -> dict[str, Any]:
    """``test`` against plain on the same copies (module docstring)."""
    only_test = sum(r[test] and not r["plain"] for r in rows)
    only_plain = sum(r["plain"] and not r[test] for r in rows)
    by_generation = [
        sum(r[test] for r in rows[i : i + COPIES]) - sum(r["plain"] for r in rows[i : i + COPIES])
        for i in range(0, len(rows), COPIES)
    ]
    more = sum(d > 0 for d in by_generation)
    fewer = sum(d < 0 for d in by_generation)

    def sign_p(a: int, b: int) -> float:
        return float(stats.binomtest(a, a + b).pvalue) if a + b else 1.0

    return {
        "copies_only_this": only_test,
        "copies_only_plain": only_plain,
        "copies_sign_test_p": sign_p(only_test, only_plain),
        "generations_more": more,
        "generations_fewer": fewer,
        "generations_sign_test_p": sign_p(more, fewer),
    }


def main() -> None:
    begin = time.perf_counter()
    tok = load_tokenizer(DEFAULT_MODEL, data_home())
    source = bench_source()
    splits = {}
    for name, path in (("design", GENERATIONS), ("heldout", HELDOUT)):
        with path.open(encoding="utf-8") as f:
            splits[name] = [json.loads(line) for line in f if line.strip()]
    intact = np.concatenate(
        [
            detect(tok, source, token_ids=g["token_ids"], options=DetectOptions()).evidence.pivots
            for g in splits["design"]
        ]
    )
    weights = fit_intact_law(intact)
    null = MixtureNull(weights)
    law = (weights, null)
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    human = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    pool = np.concatenate([np.asarray(h, dtype=np.int64) for h in human])
    rng = np.random.default_rng(20261203)
    edits: dict[str, dict[str, Any]] = {}
    answers: dict[str, list[dict[str, Any]]] = {}
    for name, generations in splits.items():
        edits[name] = {}
        split_rows: dict[str, list[dict[str, Any]]] = {}
        for rate in RATES:
            rows = [
                statistics(tok, source, edit(g["token_ids"], rate, "mixed", pool, rng), *law)
                | {"full": len(g["token_ids"]) >= g["max_new_tokens"]}
                for g in generations
                for _ in range(COPIES)
            ]
            edits[name][str(rate)] = rates(rows)
            split_rows[str(rate)] = rows
            print(name, rate, edits[name][str(rate)], flush=True)
        answers[name] = per_answer(tok, source, generations, split_rows)
    h0 = [
        statistics(tok, bench_source(f"h0-ceiling-{k}"), ids, *law)
        for ids in human
        for k in range(H0_KEYS)
    ]
    h0_row = {
        "n": len(h0),
        "bound_99": int(stats.binom.ppf(0.995, len(h0), ALPHA)),
        "rejections": {t: int(sum(r[t] for r in h0)) for t in TESTS},
    }
    print("h0", h0_row, flush=True)
    result = {
        **run_metadata(),
        "alpha": ALPHA,
        "copies": COPIES,
        "context_width": WIDTH,
        "threshold_c": THRESHOLD,
        "mixture_share_q": SHARE,
        "hmm_rates": list(HMM_RATES),
        "intact_law": {
            "beta_shapes": BETA_SHAPES.tolist(),
            "weights": weights.round(4).tolist(),
            "mean_log_h_nats": float(log_h(intact, weights).mean()),
            "design_pivots": int(intact.size),
        },
        "h_fitted_on": "design (its rows are in-sample for mixture and hmm)",
        "edits_mixed": edits,
        "per_answer": answers,
        "h0_human": h0_row,
        "seconds": round(time.perf_counter() - begin, 1),
    }
    OUT_JSON.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT_JSON} in {result['seconds']} s")


if __name__ == "__main__":
    main()
