"""Validity under H0: P(p <= α) <= α for every score (docs/design.md §4).

Two nulls: fresh i.i.d. uniform pivots (the model of H0: a text independent of the key has
independent U(0, 1) pivots at distinct labels), and the real detector on human text under
fixed keys it was never generated with, including adversarially repetitive text.

Each statistical check names its α and why. Counts of p <= α are compared with Binomial(N, α)
quantiles at coverage 0.999: an exact test lands inside the two-sided interval, a valid bound
(Chernoff) below the upper end, except with probability 0.001 per check (seeded, so these are
deterministic anyway; 0.999 keeps a correct implementation from failing when seeds change).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from detector.chernoff import ChernoffTail
from detector.detect import tokenize_input
from detector.multikey import detect_multi
from detector.options import DetectOptions
from detector.scores import SCORE_NAMES, SCORES, LiShape, aaronson_terms, li_terms
from detector.stats import aaronson_log_sf_many
from tests.detector.helpers import fixed_source

DRAWS = 20_000
ALPHAS = (0.1, 0.01, 0.001)


def binomial_bounds(n: int, alpha: float, coverage: float = 0.999) -> tuple[int, int]:
    """Central ``coverage`` interval of Binomial(n, alpha): where a valid, exact test's count of
    p <= alpha falls, except with probability 1 - coverage."""
    tail = (1.0 - coverage) / 2.0
    return int(stats.binom.ppf(tail, n, alpha)), int(stats.binom.ppf(1.0 - tail, n, alpha))


def simulated_null_log_p(name: str, m: int, seed: int) -> tuple[np.ndarray, str]:
    """(DRAWS,) natural-log p-values of M fresh U(0, 1) pivots under score ``name``."""
    pivots = np.random.default_rng(seed).random((DRAWS, m))  # (DRAWS, M)
    return SCORES[name].evaluate_many(pivots)


@pytest.mark.parametrize("m", [1, 5, 30, 300], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("name", SCORE_NAMES)
def test_simulated_null_is_valid(name: str, m: int) -> None:
    log_p, method = simulated_null_log_p(name, m, seed=1000 + m)
    assert np.all(np.isfinite(log_p)) and np.all(log_p <= 0.0)
    p = np.exp(log_p)
    for alpha in ALPHAS:
        low, high = binomial_bounds(DRAWS, alpha)
        count = int(np.sum(p <= alpha))
        # Validity, every method: no more rejections than an exact level-alpha test allows.
        assert count <= high, (name, m, alpha, count, high)
        if method == "exact":
            # An exact test also rejects *as often as* alpha (not a vacuous p = 1).
            assert low <= count, (name, m, alpha, count, low)
    if method == "exact":
        # Uniformity of the whole p distribution: KS at alpha = 0.001 (one check per (score, M)).
        assert stats.kstest(p, "uniform").pvalue > 0.001


def test_simulated_null_check_has_power() -> None:
    # Negative controls — the checks above must be able to fail:
    # (1) the Aaronson sum of M = 30 pivots tested with the law of M = 29 (one series term short)
    #     fails the KS check;
    pivots = np.random.default_rng(1030).random((DRAWS, 30))
    p = np.exp(aaronson_log_sf_many(29, aaronson_terms(pivots).sum(axis=1)))
    assert stats.kstest(p, "uniform").pvalue < 1e-6
    # (2) a Chernoff bound whose log-MGF is understated by 0.01 nats per token (an MGF
    #     quadrature 1% low) rejects far more than alpha = 0.01 at M = 300.
    shape = LiShape.of(0.1)
    true_tail = SCORES["li"].chernoff
    assert true_tail is not None
    wrong = ChernoffTail(
        true_tail.lambdas, true_tail.log_mgf - 0.01, true_tail.mean, true_tail.h_max
    )
    sums = li_terms(np.random.default_rng(1300).random((DRAWS, 300)), shape).sum(axis=1)
    _, high = binomial_bounds(DRAWS, 0.01)
    assert int(np.sum(np.exp(wrong.log_sf_many(300, sums)) <= 0.01)) > high


KEYS = [f"h0-human-{i}" for i in range(5)]


def test_human_text_is_not_flagged(real_tokenizer, human_passages: list[str]) -> None:  # type: ignore[no-untyped-def]
    # 227 human passages x 5 fixed keys = 1,135 detections whose text never saw the key, every
    # score at once. The five keys give independent p-values per passage (independent keys);
    # within a passage, distinct labels give independent pivots.
    # (detect_multi tokenizes each passage once; its per-key results equal detect's:
    # test_multikey.py.)
    log_p: dict[str, list[float]] = {name: [] for name in (*SCORE_NAMES, "verdict")}
    exact: list[float] = []  # the Aaronson p of the text as submitted (one reading: exact)
    sources = {name: fixed_source(name) for name in KEYS}
    for text in human_passages:
        result = detect_multi(
            real_tokenizer, sources, text=text, options=DetectOptions(scores=SCORE_NAMES)
        )
        as_submitted = detect_multi(
            real_tokenizer, sources, tokenized=tokenize_input(real_tokenizer, text, None)
        )
        exact.extend(d.scores["aaronson"].log_p_value for d in as_submitted.results.values())
        for detection in result.results.values():
            for score, p in detection.scores.items():
                log_p[score].append(p.log_p_value)
            # The verdict's test (whole text and windows, detector.combined) is held to the
            # same false-positive bound below, as "verdict".
            log_p["verdict"].append(detection.verdict_log10_p_value * math.log(10))
            if 10**detection.verdict_log10_p_value >= detection.alpha:
                assert detection.verdict in {"not_detected", "insufficient_evidence"}
            else:
                assert detection.verdict == "watermarked"
    n = len(KEYS) * len(human_passages)
    assert n == 1135
    for score, values in log_p.items():
        p = np.exp(np.array(values))
        for alpha in ALPHAS:
            # False positives at alpha: at most the upper 99.95% quantile of Binomial(1135,
            # alpha) — a valid test (exact or bound) cannot exceed it but with prob. 0.0005.
            _, high = binomial_bounds(n, alpha)
            assert int(np.sum(p <= alpha)) <= high, (score, alpha)
    # Uniformity under H0 for the exact Aaronson p of one reading: KS at alpha = 0.001. (A text
    # read two ways reports min(1, 2 min p): valid, held above, but conservative, not uniform.)
    assert stats.kstest(np.exp(exact), "uniform").pvalue > 0.001
    low, _ = binomial_bounds(n, 0.1)
    assert int(np.sum(np.exp(exact) <= 0.1)) >= low  # exact: not vacuous
