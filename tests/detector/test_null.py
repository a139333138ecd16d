"""Validity under H0: p-values are uniform, so P(p <= alpha) = alpha (DESIGN §4).

Two nulls: fresh i.i.d. uniform pivots (the model of H0), and the real detector on human text
under fixed keys it was never generated with. Each check names its alpha and why.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from detector import detect
from detector.scores import aaronson_terms
from detector.stats import aaronson_log_sf_many
from tests.detector.helpers import fixed_source

DRAWS = 20_000


def binomial_bounds(n: int, alpha: float, coverage: float = 0.999) -> tuple[int, int]:
    """Central ``coverage`` interval of Binomial(n, alpha): where a valid, exact test's count of
    p <= alpha falls, except with probability 1 - coverage."""
    tail = (1.0 - coverage) / 2.0
    return int(stats.binom.ppf(tail, n, alpha)), int(stats.binom.ppf(1.0 - tail, n, alpha))


def simulated_null_p(m: int, seed: int, shift: int = 0) -> np.ndarray:
    """(DRAWS,) Aaronson p-values of M fresh U(0,1) pivots, tested as if M + shift were scored."""
    rng = np.random.default_rng(seed)
    pivots = rng.random((DRAWS, m))  # (DRAWS, M)
    sums = aaronson_terms(pivots).sum(axis=1)  # (DRAWS,)
    return np.exp(aaronson_log_sf_many(m + shift, sums))


@pytest.mark.parametrize("m", [1, 5, 30, 300], ids=lambda m: f"M{m}")
def test_simulated_null_is_valid(m: int) -> None:
    p = simulated_null_p(m, seed=1000 + m)
    for alpha in (0.1, 0.01):
        # The count of p <= alpha is Binomial(DRAWS, alpha) for an exact test; a 99.9% interval
        # keeps a correct implementation from failing (seeded, so deterministic anyway).
        low, high = binomial_bounds(DRAWS, alpha)
        count = int(np.sum(p <= alpha))
        assert low <= count <= high, (m, alpha, count, (low, high))
    # Uniformity of the whole p distribution: KS at alpha = 0.001 (one check per M).
    assert stats.kstest(p, "uniform").pvalue > 0.001


def test_simulated_null_check_has_power() -> None:
    # Negative control: testing M = 30 pivots with the law of M = 29 (one series term short)
    # must fail the same KS check, or the validity test above could not catch such a bug.
    p = simulated_null_p(30, seed=1030, shift=-1)
    assert stats.kstest(p, "uniform").pvalue < 1e-6


KEYS = [f"h0-human-{i}" for i in range(5)]


def test_human_text_is_not_flagged(real_tokenizer, human_passages: list[str]) -> None:  # type: ignore[no-untyped-def]
    # 227 human passages x 5 fixed keys = 1,135 detections whose text never saw the key.
    p_values: list[float] = []
    for name in KEYS:
        source = fixed_source(name)
        for text in human_passages:
            detection = detect(real_tokenizer, source, text=text)
            p_values.append(detection.p_value.p_value)
            if detection.p_value.p_value >= detection.alpha:
                assert detection.verdict in {"not_detected", "insufficient_evidence"}
    p = np.array(p_values)
    assert p.size == len(KEYS) * 227
    # False positives at alpha = 0.01: Binomial(1135, 0.01) for a valid test; 99.9% interval.
    low, high = binomial_bounds(p.size, 0.01)
    false_positives = int(np.sum(p < 0.01))
    assert low <= false_positives <= high, (false_positives, (low, high))
    # Uniformity under H0: KS at alpha = 0.001. The five keys give independent p-values per
    # passage (independent keys); within a passage, distinct labels give independent pivots.
    assert stats.kstest(p, "uniform").pvalue > 0.001
