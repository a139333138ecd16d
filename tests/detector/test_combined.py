"""The verdict's test (detector/combined.py): whole text and windows in one valid p, its
family-wise error rate under H0, and the power statement.

Statistical checks: counts of p <= α against the upper end of the central 99% interval of
Binomial(N, α) (``binomial_bounds(..., 0.99)``): a valid test exceeds it with probability
<= 0.005 per check; seeded, so deterministic. Each has a negative control that must fail it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector import DetectOptions, detect
from detector.combined import (
    WHOLE_TEXT_WEIGHT,
    combine,
    combined_test,
    min_detectable_mean_score,
    needed_tokens,
    scan_min_log_p,
    scan_min_log_p_rows,
    whole_text_log_level,
    windows_scanned,
)
from detector.scores import aaronson_terms
from detector.spans import scan_windows
from detector.stats import aaronson_log_sf, aaronson_log_sf_many, min_scored_tokens
from tests.detector.helpers import fixed_source
from tests.detector.test_null import binomial_bounds


def test_combine_is_the_weighted_bonferroni() -> None:
    assert combine(-5.0, -1.0, 0) == -5.0  # no window: the whole text alone
    assert combine(-5.0, -1.0, 10) == pytest.approx(-5.0 - math.log(0.9))
    assert combine(-1.0, -20.0, 10) == pytest.approx(-20.0 + math.log(10) - math.log(0.1))
    assert combine(-0.01, -0.5, 100) == 0.0  # capped at p = 1
    assert WHOLE_TEXT_WEIGHT == 0.9


@pytest.mark.parametrize("m", [15, 16, 40, 200, 1000])
def test_scan_is_the_smallest_window_p(m: int) -> None:
    terms = aaronson_terms(np.random.default_rng(m).random(m))
    _, _, _, log_p = scan_windows(terms)
    assert windows_scanned(m) == log_p.size
    expected = float(log_p.min()) if log_p.size else 0.0
    assert scan_min_log_p(terms) == pytest.approx(expected, rel=1e-12, abs=0.0)
    rows = np.stack([terms, terms[::-1], np.zeros(m) + 0.5])  # (3, M)
    many = scan_min_log_p_rows(rows)
    assert [scan_min_log_p(row) for row in rows] == many.tolist()  # bit for bit per row


def test_combined_test_family_wise_error_rate_under_h0() -> None:
    # H0: M i.i.d. U(0, 1) pivots. The combined p must reject at most alpha of N = 4,000 texts
    # for alpha in {0.1, 0.01} at several M (the windows overlap heavily: the union bound is
    # what makes it valid whatever their dependence).
    for m, seed in ((20, 1), (64, 2), (300, 3)):
        terms = aaronson_terms(np.random.default_rng(seed).random((4000, m)))  # (N, M)
        whole = aaronson_log_sf_many(m, terms.sum(axis=1))
        scan = scan_min_log_p_rows(terms)
        w = windows_scanned(m)
        combined = np.array([combine(a, b, w) for a, b in zip(whole, scan, strict=True)])
        naive = np.minimum(whole, scan)  # negative control: no correction for the scan
        for alpha in (0.1, 0.01):
            _, high = binomial_bounds(4000, alpha, 0.99)
            assert int(np.sum(combined <= math.log(alpha))) <= high, (m, alpha)
        # The uncorrected minimum over the whole text and the windows is not a p-value: it
        # rejects well above alpha = 0.1, so the check above can fail.
        _, high = binomial_bounds(4000, 0.1, 0.99)
        assert int(np.sum(naive <= math.log(0.1))) > high, m


def test_verdict_uses_the_combined_p(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = list(range(1000, 1300))
    detection = detect(real_tokenizer, fixed_source("combined"), token_ids=ids)
    test = detection.test
    assert test is not None and test.windows_scanned == windows_scanned(detection.num_scored)
    assert test.whole_text_log_p == detection.p_value.log_p_value
    terms = detection.evidence.terms["aaronson"]
    assert test == combined_test(terms, detection.p_value.log_p_value)
    assert detection.verdict_log10_p_value == test.log10_p_value
    assert (detection.verdict == "watermarked") == (test.p_value < detection.alpha)


@pytest.mark.parametrize("m", [1, 5, 16, 29, 200, 5000])
@pytest.mark.parametrize("level", [0.01, 0.009, 1e-6])
def test_min_detectable_mean_score_reaches_the_level(m: int, level: float) -> None:
    mu = min_detectable_mean_score(m, math.log(level))
    assert mu is not None and mu > 1.0
    assert aaronson_log_sf(m, mu * m) <= math.log(level)
    assert aaronson_log_sf(m, mu * (1 - 1e-6) * m) > math.log(level)  # and no lower
    assert min_detectable_mean_score(0, math.log(level)) is None


def test_power_at_levels_that_underflow(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # alpha = the smallest subnormal float: 0.9 alpha rounds to 0, the level stays in logs
    # (schemathesis found the 500 this was).
    options = DetectOptions(alpha=5e-324)
    detection = detect(real_tokenizer, fixed_source("tiny"), token_ids=list(range(100, 160)))
    tiny = detect(
        real_tokenizer, fixed_source("tiny"), token_ids=list(range(100, 160)), options=options
    )
    assert tiny.min_detectable_mean_score is not None
    assert tiny.min_detectable_mean_score > (detection.min_detectable_mean_score or 0.0) > 1.0
    assert tiny.verdict == "insufficient_evidence" and tiny.min_scored_tokens > 100


def test_needed_tokens_is_where_the_reference_becomes_detectable() -> None:
    for alpha in (0.01, 0.05, 0.001):
        n = needed_tokens(alpha)
        at = min_detectable_mean_score(n, whole_text_log_level(alpha, n))
        before = min_detectable_mean_score(n - 1, whole_text_log_level(alpha, n - 1))
        assert at is not None and before is not None and at <= 1.5 < before, alpha
        alone = min_scored_tokens(alpha)
        assert n == (alone if alone < 16 else min_scored_tokens(alpha * 0.9)), alpha
    assert needed_tokens(0.01) == 29


def test_power_in_the_wire_shape(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    short = detect(real_tokenizer, fixed_source("power"), token_ids=list(range(500, 520)))
    power = short.to_json(tokens=False)["power"]
    assert short.verdict == "insufficient_evidence" and power["detectable"] is False
    assert power["min_detectable_mean_score"] > power["reference_mean_score"] == 1.5
    # A lower reference (a user who expects a strong watermark) changes the verdict's wording
    # only through M: 16 scored tokens at 3.0 nats each would reach alpha.
    strong = detect(
        real_tokenizer,
        fixed_source("power"),
        token_ids=list(range(500, 520)),
        options=DetectOptions(reference_mean_score=3.0),
    )
    assert strong.to_json(tokens=False)["power"]["detectable"] is True
    assert strong.verdict != "insufficient_evidence"  # detectable at this M: a plain answer
    with pytest.raises(ValueError, match="reference_mean_score"):
        DetectOptions(reference_mean_score=1.0)
    with pytest.raises(ValueError, match="reference_mean_score"):
        DetectOptions(reference_mean_score=1.1)  # below MIN_REFERENCE_MEAN_SCORE
