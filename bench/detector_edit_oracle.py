"""How far could any position filter take the plain test on edited text? (issue 15)

At context width m an edit destroys the labels of its own position and of the m after it; the
plain Aaronson test still sums every scored position, so the destroyed labels add H0 noise. A
test that knew which labels survived would score only those; its null stays exact (Gamma(K, 1)
for K kept positions) whenever the choice does not depend on the key. This bench measures,
on the same mixed-edit copies (``bench.detector_robustness.edit_with_origins``, which records
where every token came from), the plain test against:

- ``oracle_intact``: scores only the labels that are intact (the token and its m predecessors
  are the original tokens, consecutive). It needs the edit record, so it is *not a test*: it is
  the most any filter of positions can give the Aaronson sum on these copies;
- ``oracle_flagged``: leaves out every position whose label window t − m .. t holds a
  substituted or inserted token, as a perfect detector of foreign tokens would (deletions leave
  no foreign token and stay unseen). Also not a test;
- ``rank_filter_R``: the product's edit-filtered test (``detector.weighted.rank_filtered_test``
  with ``RankFilter(R)``; R = 1000 is the served ``RANK_FILTER``): a foreign token guessed as
  one that ranks R or lower in the target's raw law at its position
  (``sampler.entropy.position_laws`` after BOS, no prompt, read through the served backend). It
  is a test: key-independent, so its p is the exact Gamma tail. Reported with the share of
  foreign tokens it flags (recall) and of original tokens it flags (false flags), and under H0.

Data: the 20 held-out generations (``detector_heldout.jsonl``: mpfr, T = 1, top-k 50, 128
tokens, m = 4) and, for the oracles only, the 40 design generations (``detector_generations
.jsonl``). ``COPIES`` copies per generation and rate for each of the ``SEEDS`` (the copies'
noise is large at 20 answers: a seed is a fresh set of copies). The rank filter is run at 30 %
only. H0: the 227 human passages × ``H0_KEYS`` keys, count of p < α against the binomial 99 %
bound, at α = 0.01 and 0.1. TPR = share with p < α = 0.01. The filter against plain is also
paired on the generations (copies detected per generation over all seeds; exact sign test).

Writes ``bench/results/detector_edit_oracle.json``.

    python -m bench.detector_edit_oracle
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np
from scipy import stats

from bench.common import RESULTS
from bench.detector_common import (
    GENERATIONS,
    bench_source,
    data_home,
    human_token_ids,
    run_metadata,
)
from bench.detector_robustness import edit_with_origins
from detector import DetectOptions, detect
from detector.stats import aaronson_log_sf
from detector.weighted import RankFilter, label_windows_flagged, rank_filtered_test
from sampler.entropy import position_laws
from sampler.models import DEFAULT_MODEL, load_model
from sampler.processing_config import Processing

HELDOUT = RESULTS / "detector_heldout.jsonl"
OUT_JSON = RESULTS / "detector_edit_oracle.json"
ALPHA = 0.01
RATES = (0.2, 0.3, 0.4)
FILTER_RATE = 0.3
COPIES = 10
SEEDS = (20261204, 20261205, 20261206, 20261207)
MAX_RANKS = (200, 1000, 3000)
H0_KEYS = 30
H0_ALPHAS = (0.01, 0.1)
WIDTH = 4
GENERATION_PROCESSING = Processing(temperature=1.0, top_k=50)


def intact_labels(origin: list[int], width: int) -> np.ndarray:
    """(T,) bool: the token at t and its ``width`` predecessors are original and consecutive
    (positions before the text count as intact only where the original had them too).

    ``origin`` is ``edit_with_origins``'s record: the original index of each token, −1 for a
    substituted or inserted one. Approximate as a ceiling in one way: a position whose context
    repeated in the original (skipped there, its token drawn off the keyed labels) can be scored
    in the copy when an edit removed the first use; it counts as intact here."""
    o = np.asarray(origin, dtype=np.int64)
    ok = o >= 0
    for k in range(1, width + 1):
        before = np.full(o.size, -1, dtype=np.int64)
        if k < o.size:
            before[k:] = o[:-k]
        inside = np.arange(o.size) >= k
        ok &= np.where(inside, (before >= 0) & (before == o - k), o - k < 0)
    return ok


def kept_log10_p(terms: np.ndarray, keep: np.ndarray) -> float:
    """log10 of the Aaronson p over the kept scored positions (exact: Gamma(K, 1) tail)."""
    return aaronson_log_sf(int(keep.sum()), float(terms[keep].sum())) / math.log(10)


def scored_terms(tok: Any, source: Any, ids: list[int]) -> tuple[float, np.ndarray, np.ndarray]:
    """The plain log10 p, the skip codes (T,) and the scored terms −ln(1 − r_t)."""
    found = detect(tok, source, token_ids=ids, options=DetectOptions())
    return found.p_value.log10_p_value, found.evidence.skip, found.evidence.terms["aaronson"]


def filtered_log10_p(skip: np.ndarray, terms: np.ndarray, rank: np.ndarray, max_rank: int) -> float:
    """The product's edit-filtered log10 p at R = ``max_rank``."""
    test = rank_filtered_test(skip, terms, rank, WIDTH, RankFilter(max_rank))
    return test.log_p / math.log(10)


def tpr(hits: list[bool]) -> float:
    return float(np.mean(hits))


def paired_by_generation(detected: dict[str, dict[str, int]], test: str) -> dict[str, Any]:
    """``test`` against plain, paired on the generations (the independent unit; copies of one
    generation are not): how many generations it detects in more copies, in fewer, and the
    two-sided exact sign test over those that differ."""
    more = sum(c[test] > c["plain"] for c in detected.values())
    fewer = sum(c[test] < c["plain"] for c in detected.values())
    p = float(stats.binomtest(more, more + fewer, 0.5).pvalue) if more + fewer else 1.0
    return {
        "generations_more": more,
        "generations_fewer": fewer,
        "sign_test_p": p,
        "copies_detected": {g: {"plain": c["plain"], test: c[test]} for g, c in detected.items()},
    }


def main() -> None:
    begin = time.perf_counter()
    metadata = run_metadata()  # the code measured is the tree at the start
    loaded = load_model(DEFAULT_MODEL, data_home(), device="cpu")
    tok = loaded.tokenizer
    prefix = [tok.bos_token_id] if tok.bos_token_id is not None else []
    source = bench_source()
    splits = {}
    for name, path in (("design", GENERATIONS), ("heldout", HELDOUT)):
        with path.open(encoding="utf-8") as f:
            splits[name] = [json.loads(line) for line in f if line.strip()]
    human = human_token_ids(tok)
    pool = np.concatenate([np.asarray(h, dtype=np.int64) for h in human])
    level = math.log10(ALPHA)

    oracles: dict[str, Any] = {}
    misses: dict[str, int] = {}
    # held-out, FILTER_RATE: copies detected per generation over all seeds, per test
    detected: dict[str, dict[str, int]] = {}
    for name, generations in splits.items():
        oracles[name] = {}
        for rate in RATES:
            per_seed = []
            for seed in SEEDS:
                rng = np.random.default_rng(seed)
                with_filter = name == "heldout" and rate == FILTER_RATE
                hits: dict[str, list[bool]] = {
                    t: [] for t in ("plain", "oracle_intact", "oracle_flagged")
                }
                if with_filter:
                    hits |= {f"rank_filter_{r}": [] for r in MAX_RANKS}
                    recall: dict[int, list[float]] = {r: [] for r in MAX_RANKS}
                    false_flags: dict[int, list[float]] = {r: [] for r in MAX_RANKS}
                for g in generations:
                    for _ in range(COPIES):
                        ids, origin = edit_with_origins(g["token_ids"], rate, "mixed", pool, rng)
                        plain, skip, terms = scored_terms(tok, source, ids)
                        scored = skip == 0
                        foreign = np.asarray(origin) < 0
                        intact = intact_labels(origin, WIDTH)[scored]
                        unflagged = ~label_windows_flagged(foreign, WIDTH)[scored]
                        hits["plain"].append(plain < level)
                        hits["oracle_intact"].append(kept_log10_p(terms, intact) < level)
                        hits["oracle_flagged"].append(kept_log10_p(terms, unflagged) < level)
                        if with_filter and seed == SEEDS[0] and not hits["oracle_intact"][-1]:
                            misses[g["id"]] = misses.get(g["id"], 0) + 1
                        if not with_filter:
                            continue
                        rank = position_laws(
                            loaded.target, ids, GENERATION_PROCESSING, prefix=prefix
                        ).raw_rank.numpy()
                        counts = detected.setdefault(g["id"], {})
                        counts["plain"] = counts.get("plain", 0) + bool(plain < level)
                        for r in MAX_RANKS:
                            flag = rank >= r
                            filtered = filtered_log10_p(skip, terms, rank, r)
                            hits[f"rank_filter_{r}"].append(filtered < level)
                            test = f"rank_filter_{r}"
                            counts[test] = counts.get(test, 0) + bool(filtered < level)
                            if foreign.any():
                                recall[r].append(float(flag[foreign].mean()))
                            false_flags[r].append(float(flag[~foreign].mean()))
                row: dict[str, Any] = {"seed": seed, "n": len(hits["plain"])}
                row["tpr"] = {t: tpr(h) for t, h in hits.items()}
                if with_filter:
                    row["flags"] = {
                        str(r): {
                            "recall_foreign": float(np.mean(recall[r])),
                            "false_flag_original": float(np.mean(false_flags[r])),
                        }
                        for r in MAX_RANKS
                    }
                per_seed.append(row)
                print(name, rate, row, flush=True)
            names = per_seed[0]["tpr"].keys()
            oracles[name][str(rate)] = {
                "per_seed": per_seed,
                "mean_tpr": {t: float(np.mean([r["tpr"][t] for r in per_seed])) for t in names},
            }

    paired = {str(r): paired_by_generation(detected, f"rank_filter_{r}") for r in MAX_RANKS}
    print("paired", paired, flush=True)

    tests = ("plain", *(f"rank_filter_{r}" for r in MAX_RANKS))
    h0_hits = {str(a): dict.fromkeys(tests, 0) for a in H0_ALPHAS}
    for ids in human:
        ranks = position_laws(loaded.target, ids, GENERATION_PROCESSING, prefix=prefix).raw_rank
        for k in range(H0_KEYS):
            plain, skip, terms = scored_terms(tok, bench_source(f"h0-oracle-{k}"), ids)
            log10 = {"plain": plain} | {
                f"rank_filter_{r}": filtered_log10_p(skip, terms, ranks.numpy(), r)
                for r in MAX_RANKS
            }
            for a in H0_ALPHAS:
                for t in tests:
                    h0_hits[str(a)][t] += log10[t] < math.log10(a)
    n_h0 = len(human) * H0_KEYS
    h0 = {
        "n": n_h0,
        "keys": H0_KEYS,
        "by_alpha": {
            str(a): {
                "bound_99": int(stats.binom.ppf(0.995, n_h0, a)),
                "rejections": {t: int(v) for t, v in h0_hits[str(a)].items()},
            }
            for a in H0_ALPHAS
        },
    }
    print("h0", h0, flush=True)
    result = {
        **metadata,
        "law_precision": loaded.precision,
        "alpha": ALPHA,
        "copies": COPIES,
        "seeds": list(SEEDS),
        "context_width": WIDTH,
        "edits_mixed": oracles,
        "heldout_oracle_intact_misses_by_answer_first_seed": misses,
        "heldout_rank_filter_paired_by_generation": paired,
        "h0_human": h0,
        "seconds": round(time.perf_counter() - begin, 1),
    }
    OUT_JSON.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT_JSON} in {result['seconds']} s")


if __name__ == "__main__":
    main()
