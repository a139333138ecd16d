"""Multi-key detection (detector/multikey.py): per-key results, the Bonferroni correction for
the number of keys, its family-wise error rate under H0, and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from detector import DetectOptions, Verdict, detect, multikey
from detector.multikey import best_key_corrected, detect_multi
from detector.scores import aaronson_terms
from detector.stats import LN10, aaronson_log_sf_many
from keyed import KeyedSource
from tests.detector.helpers import fixed_secret, fixed_source, keyed_race_ids


def test_best_key_corrected() -> None:
    best, corrected = best_key_corrected([-1.0, -9.0, -3.0])
    assert best == 1 and corrected == pytest.approx(-9.0 + math.log(3.0))
    assert best_key_corrected([-0.1, -0.5]) == (1, 0.0)  # capped at p = 1
    with pytest.raises(ValueError, match="K >= 1"):
        best_key_corrected([])


@pytest.mark.parametrize(
    "keys", [2, 10, pytest.param(50, marks=pytest.mark.slow)], ids=lambda k: f"K{k}"
)
def test_multi_key_family_wise_error_rate(keys: int) -> None:
    # H0: a text carrying none of K keys' marks has independent U(0, 1) pivots under each key
    # (distinct keys, distinct labels). The corrected best-key p must reject at most alpha of
    # the time for alpha in {0.1, 0.01}: count <= the upper 99.95% quantile of
    # Binomial(N, alpha) (a valid test exceeds it with probability 0.0005; seeded).
    draws, m = 20_000, 30
    pivots = np.random.default_rng(70 + keys).random((draws, keys, m))  # (N, K, M)
    sums = aaronson_terms(pivots).sum(axis=2)  # (N, K)
    log_p = aaronson_log_sf_many(m, sums.reshape(-1)).reshape(draws, keys)  # (N, K)
    corrected = np.array([best_key_corrected(row)[1] for row in log_p])  # (N,)
    for alpha in (0.1, 0.01):
        high = int(stats.binom.ppf(0.9995, draws, alpha))
        assert int(np.sum(corrected <= math.log(alpha))) <= high, alpha
    # Negative control: the uncorrected best key rejects at rate 1 − (1 − alpha)^K, far above
    # alpha = 0.01, so the check can fail and the correction is needed.
    uncorrected = np.mean(log_p.min(axis=1) <= math.log(0.01))
    assert uncorrected > 0.8 * (1 - 0.99**keys) > 0.015


def test_detect_multi_finds_the_right_key(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    secret = fixed_secret("multi-right")
    ids = keyed_race_ids(secret, num_new=120, seed=21)
    sources = {
        "pmk_a": fixed_source("multi-a"),
        "pmk_right": KeyedSource(secret),
        "pmk_b": fixed_source("multi-b", context_width=2),
        "pmk_c": fixed_source("multi-c"),
    }
    options = DetectOptions(scores=("u",), spans=True)
    result = detect_multi(real_tokenizer, sources, token_ids=ids, options=options)
    assert result.best_key_id == "pmk_right" and result.num_keys == 4
    assert result.key_ids == tuple(sources) and set(result.results) == set(sources)
    assert next(iter(result.results)) == "pmk_right"  # detailed results: best first
    for key_id, source in sources.items():
        single = detect(
            real_tokenizer,
            source,
            token_ids=ids,
            options=DetectOptions(key_id=key_id, scores=("u",), spans=True),
        )
        assert result.results[key_id] == single  # identical to testing that key alone
        k = result.key_ids.index(key_id)
        assert result.log_p_values[k] / LN10 == single.p_value.log10_p_value  # vectorised
        assert result.num_scored[k] == single.num_scored
    best = result.best.p_value
    test = result.best.test
    assert test is not None  # the verdict's test: whole text and windows (detector.combined)
    assert result.verdict_log_p_values is not None
    assert result.verdict_log_p_values[result.key_ids.index("pmk_right")] == test.log_p
    assert result.log10_p_value == pytest.approx((test.log_p + math.log(4)) / LN10)
    assert result.whole_text_log10_p_value == pytest.approx((best.log_p_value + math.log(4)) / LN10)
    assert result.span_log10_p_value is not None
    assert result.p_value == pytest.approx(10**result.log10_p_value, rel=1e-9, abs=1e-300)
    assert result.verdict is Verdict.WATERMARKED
    assert result.min_scored_tokens > 28  # alpha / 4 needs more tokens than alpha
    # The wire shape is the service's (service.jobs.detect_response, one for CLI and HTTP).
    assert secret.reveal().hex() not in repr(result)


def test_detect_multi_on_human_text(real_tokenizer, human_passages) -> None:  # type: ignore[no-untyped-def]
    # 30 human passages x 5 keys: the corrected p is a valid p-value, so at alpha = 0.01 at
    # most ~0.3 of these 30 texts are flagged on average; these fixed keys flag none.
    sources = {f"pmk_{i}": fixed_source(f"multi-human-{i}") for i in range(5)}
    for text in human_passages[:30]:
        result = detect_multi(real_tokenizer, sources, text=text)
        assert result.verdict is not Verdict.WATERMARKED
        assert result.log10_p_value >= result.best.p_value.log10_p_value  # never stronger


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ({}, "1..10000 key ids"),
        ([], "1..10000 key ids"),
        ({3: None}, "key ids to be strings"),
        ({"k": fixed_secret("raw")}, r"sources\['k'\] to be a KeyedSource"),
    ],
    ids=["empty", "not_a_mapping", "int_key", "not_a_source"],
)
def test_detect_multi_rejects_bad_sources(real_tokenizer, sources, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        detect_multi(real_tokenizer, sources, text="hello")


def test_detect_multi_validates_detect_options(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    sources = {"k": fixed_source("opts")}
    with pytest.raises(ValueError, match="alpha"):
        detect_multi(real_tokenizer, sources, text="x", options=DetectOptions(alpha=0.9))
    with pytest.raises(ValueError, match="key_id None"):  # each result's id is its source's
        detect_multi(real_tokenizer, sources, text="x", options=DetectOptions(key_id="k"))
    with pytest.raises(ValueError, match="at least one of text or token_ids"):
        detect_multi(real_tokenizer, sources)


@pytest.mark.parametrize("keys", [1, 7, 600], ids=lambda k: f"K{k}")
def test_every_key_equals_detect_bit_for_bit(real_tokenizer, keys: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The vectorised path (pivot_matrix in chunks, array sums and p-values) against detect()
    # per key: the same p-value, bit for bit, for keys of mixed context widths; small chunks so
    # that several pivot_matrix calls are joined.
    monkeypatch.setattr(multikey, "CHUNK_ELEMENTS", 5000)
    secret = fixed_secret("vector-right")
    ids = keyed_race_ids(secret, num_new=90, seed=5)
    sources = {
        f"pmk_{i:04d}": fixed_source(f"vec-{i}", context_width=2 + i % 3) for i in range(keys)
    }
    sources[f"pmk_{keys // 2:04d}"] = KeyedSource(secret)
    result = detect_multi(real_tokenizer, sources, token_ids=ids, detailed=3)
    assert len(result.results) == min(3, keys)
    assert result.best_key_id == f"pmk_{keys // 2:04d}"
    checked = list(sources) if keys <= 50 else [*list(sources)[::20], result.best_key_id]
    for key_id in checked:
        single = detect(real_tokenizer, sources[key_id], token_ids=ids)
        k = result.key_ids.index(key_id)
        # bit for bit: detect keeps log10 p (ln p / ln 10, so compare there)
        assert result.log_p_values[k] / LN10 == single.p_value.log10_p_value, key_id
        assert result.num_scored[k] == single.num_scored
    ranked = sorted(range(keys), key=lambda k: (result.log_p_values[k], k))[:3]
    assert list(result.results) == [result.key_ids[k] for k in ranked]


def test_the_verdict_needs_the_tokens_of_the_corrected_level(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # 1,000 keys: the best key's own p must reach alpha/K, so a short text that cannot is
    # insufficient evidence, not "not detected" (and the token count needed grows with K).
    sources = {f"pmk_{i}": fixed_source(f"needed-{i}") for i in range(1000)}
    one = detect_multi(real_tokenizer, dict(list(sources.items())[:1]), text="x " * 60)
    many = detect_multi(real_tokenizer, sources, text="x y z w " * 15 + "a b c d e f")
    # alpha = 0.01 alone: 0.9 alpha for the whole text (detector.combined.needed_tokens)
    assert one.min_scored_tokens == 29
    assert many.min_scored_tokens > 40 and many.best.num_scored < many.min_scored_tokens
    assert many.verdict is Verdict.INSUFFICIENT_EVIDENCE
    with pytest.raises(ValueError, match="detailed >= 1"):
        detect_multi(real_tokenizer, sources, text="x", detailed=0)


def _multi_key_h0(real_tokenizer, passages: list[str], keys: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Per alpha in {0.1, 0.01}: how many human passages each multi-key p rejects under
    ``keys`` fixed keys none of them was generated with."""
    sources = {f"pmk_h0_{i}": fixed_source(f"multi-h0-{i}") for i in range(keys)}
    counts: dict[str, int] = {}
    for text in passages:
        found = detect_multi(
            real_tokenizer, sources, text=text, options=DetectOptions(spans=True), detailed=1
        )
        best = found.best
        assert best.spans is not None
        # the old span p: the best key's best span, corrected for its windows only
        old = min((s.corrected_log10_p_value for s in best.spans.spans), default=0.0)
        values = {
            "verdict": found.log10_p_value,
            "whole_text": found.whole_text_log10_p_value,
            "span": 0.0 if found.span_log10_p_value is None else found.span_log10_p_value,
            "span_uncorrected_for_keys": old,
        }
        for alpha in (0.1, 0.01):
            for name, log10 in values.items():
                key = f"{name}@{alpha}"
                counts[key] = counts.get(key, 0) + int(log10 <= math.log10(alpha))
    return counts


@pytest.mark.parametrize(
    ("keys", "passages"), [(20, 227), pytest.param(200, 227, marks=pytest.mark.slow)]
)
def test_multi_key_span_p_is_valid_under_h0(real_tokenizer, human_passages, keys, passages) -> None:  # type: ignore[no-untyped-def]
    # H0: the 227 human passages under K fixed keys. The corrected verdict, whole-text and span
    # p-values must each reject at most alpha of the passages (count <= the upper end of the
    # central 99% Binomial(N, alpha) interval: a valid test exceeds it with probability
    # <= 0.005; fixed keys, deterministic). Negative control: the best key's span p corrected
    # for its windows only (what the API returned before) rejects far more at alpha = 0.1.
    counts = _multi_key_h0(real_tokenizer, human_passages[:passages], keys)
    for alpha in (0.1, 0.01):
        high = int(stats.binom.ppf(0.995, passages, alpha))
        for name in ("verdict", "whole_text", "span"):
            assert counts[f"{name}@{alpha}"] <= high, (name, alpha, counts)
    assert counts["span_uncorrected_for_keys@0.1"] > int(stats.binom.ppf(0.995, passages, 0.1))


def test_multi_key_wire_shape_corrects_spans_for_the_keys(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # service.jobs.detect_response (HTTP and CLI --json): each detailed key's spans carry
    # their windows-corrected p times K (the page shows it as is), and the top level the
    # whole-text and span p corrected for K and the power statement; the schema takes it all.
    from service.jobs.detect_response import detect_response

    secret = fixed_secret("multi-wire")
    ids = keyed_race_ids(secret, num_new=120, seed=9)
    sources = {"pmk_right": KeyedSource(secret)} | {
        f"pmk_{i}": fixed_source(f"multi-wire-{i}") for i in range(7)
    }
    found = detect_multi(real_tokenizer, sources, token_ids=ids, options=DetectOptions(spans=True))
    shaped = detect_response(found, tokens=False).model_dump()
    for result in shaped["results"]:
        for span in result["spans"]["spans"]:
            expected = min(0.0, span["corrected_log10_p_value"] + math.log10(8))
            assert span["keys_corrected_log10_p_value"] == pytest.approx(expected, abs=1e-12)
    assert shaped["span_log10_p_value"] == found.span_log10_p_value
    best_span = min(
        s["corrected_log10_p_value"] for r in shaped["results"] for s in r["spans"]["spans"]
    )
    assert shaped["span_log10_p_value"] == pytest.approx(min(0.0, best_span + math.log10(8)))
    assert shaped["power"]["detectable"] is True and shaped["verdict"] == "watermarked"


def test_multi_key_edit_tolerant_p_is_corrected_for_the_keys(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # H0: 300 random 120-token id sequences against 20 keys, the re-aligned test of the best
    # key (detailed=1, ranked by the verdict's p). That key's own re-aligned p shares its plain
    # pivots with the p that chose it, so it rejects far above alpha (measured: 70 % at
    # alpha = 0.1, 13 % at 0.01); the wire shape's keys-corrected p (K·p) must reject at most
    # alpha: count <= the upper end of the central 99 % interval of Binomial(300, alpha).
    from service.jobs.detect_response import detect_response
    from tests.detector.test_null import binomial_bounds

    rng = np.random.default_rng(31)
    sources = {f"pmk_{i}": fixed_source(f"multi-edit-{i}") for i in range(20)}
    options = DetectOptions(realign=True)
    own, corrected = [], []
    for _ in range(300):
        ids = rng.integers(3, 49152, size=120).tolist()
        found = detect_multi(real_tokenizer, sources, token_ids=ids, options=options, detailed=1)
        shaped = detect_response(found, tokens=False).model_dump()
        edit = shaped["results"][0]["edit_tolerant"]
        own.append(edit["log10_p_value"])
        corrected.append(edit["keys_corrected_log10_p_value"])
    own_a, corrected_a = np.array(own), np.array(corrected)
    for alpha in (0.1, 0.01):
        _, high = binomial_bounds(300, alpha, 0.99)
        assert int(np.sum(corrected_a <= math.log10(alpha))) <= high, alpha
    _, high = binomial_bounds(300, 0.1, 0.99)
    assert int(np.sum(own_a <= math.log10(0.1))) > high  # negative control: the check can fail


def test_multi_key_realigns_the_best_key_alone(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # the re-aligned test costs seconds per key on long, wide-context texts: only the reported
    # (best) key's runs, however many keys are detailed; its value equals a single-key run
    secret = fixed_secret("multi-realign-best")
    ids = keyed_race_ids(secret, num_new=80, seed=4)
    sources = {"pmk_right": KeyedSource(secret)}
    sources |= {f"pmk_{i}": fixed_source(f"multi-realign-{i}") for i in range(4)}
    found = detect_multi(
        real_tokenizer, sources, token_ids=ids, options=DetectOptions(realign=True), detailed=5
    )
    assert found.best_key_id == "pmk_right" and len(found.results) == 5
    assert [k for k, r in found.results.items() if r.realigned is not None] == ["pmk_right"]
    alone = detect(real_tokenizer, KeyedSource(secret), token_ids=ids,
                   options=DetectOptions(realign=True))  # fmt: skip
    realigned = found.results["pmk_right"].realigned
    assert alone.realigned is not None and realigned is not None
    assert realigned.log10_p_value == alone.realigned.log10_p_value
