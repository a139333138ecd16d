"""The edit-tolerant re-aligned test (detector/realign.py): its candidates, its exact
per-position law, validity under H0 on human and adversarially repetitive text, and that it
recovers what insertions destroy.

Statistical checks: counts of p <= α against the upper end of the central 99% interval of
Binomial(N, α) (``binomial_bounds(..., 0.99)``; a valid test exceeds it with probability
<= 0.005), fixed seeds, each with a negative control that fails it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from detector import DetectOptions, detect
from detector.realign import PLAIN_WEIGHT, candidates, position_terms, realigned_test
from keyed import KeyedSource
from tests.detector.helpers import fixed_secret, fixed_source, keyed_race_ids, repetitive_ids
from tests.detector.test_null import binomial_bounds


def test_candidates_are_the_plain_and_skip_one_labels() -> None:
    ids = np.array([10, 11, 12, 13, 14, 15, 16], dtype=np.int64)
    labels, owner, plain = candidates(ids, 3, frozenset(), fixed_secret("candidates"))
    rows = [tuple(r) for r in labels.tolist()]
    # t = 3: the plain label alone (no token before its window)
    assert owner[0] == 3 and rows[0] == (10, 11, 12) and plain[0]
    # t = 4: plain (11, 12, 13), then (10, 11, 12, 13) without w_1, w_2, w_3 — but
    # (10, 11, 12) was t = 3's plain label: used once in the text, so dropped at t = 4
    at4 = [rows[i] for i in np.flatnonzero(owner == 4)]
    assert at4 == [(11, 12, 13), (10, 12, 13), (10, 11, 13)]
    assert plain[owner == 4].tolist() == [True, False, False]
    assert len(set(rows)) == len(rows)  # every label at most once
    # special tokens are never scored
    _, owner_special, _ = candidates(ids, 3, frozenset({14}), fixed_secret("candidates"))
    assert 4 not in owner_special.tolist()


def test_position_law_is_exact() -> None:
    # v_t = F(u_t) ~ U(0, 1) for any group sizes and the plain/skip weights: KS at 0.001 on
    # 20,000 positions of each shape; and a lone candidate's term is the Aaronson term.
    rng = np.random.default_rng(11)
    for sizes, has_plain in (((5,), True), ((3,), False), ((2,), True), ((1,), True)):
        n, groups = sizes[0], 20_000
        r = rng.random(n * groups)
        owner = np.repeat(np.arange(groups), n)
        plain = np.tile(np.arange(n) == 0, groups) & has_plain
        x = position_terms(r, owner, plain)
        assert x.shape == (groups,)
        assert stats.kstest(np.exp(-x), "uniform").pvalue > 0.001, (n, has_plain)
    r = rng.random(10)
    lone = position_terms(r, np.arange(10), np.ones(10, dtype=bool))
    np.testing.assert_allclose(lone, -np.log1p(-r), rtol=1e-12)
    # Negative control: the plain maximum without its law (max r read as one uniform) is far
    # from uniform, so the KS check above can fail.
    r = rng.random((20_000, 5)).max(axis=1)
    assert stats.kstest(1 - r, "uniform").pvalue < 1e-10


@pytest.mark.parametrize("text_kind", ["human", "repetitive"])
def test_realigned_p_is_valid_under_h0(real_tokenizer, human_passages, text_kind: str) -> None:  # type: ignore[no-untyped-def]
    # Texts that never saw the key: each (text, key) p must be <= alpha at most alpha of the
    # time, alpha in {0.1, 0.01}. Human: 227 passages x 4 keys = 908. Repetitive: 300 seeded
    # adversarial sequences x 3 keys = 900 (the label de-duplication keeps them valid).
    rng = np.random.default_rng(23)
    if text_kind == "human":
        texts = [real_tokenizer(t, add_special_tokens=False)["input_ids"] for t in human_passages]
        keys = [fixed_secret(f"realign-h0-{i}") for i in range(4)]
    else:
        texts = [repetitive_ids(rng, i % 3) for i in range(300)]
        keys = [fixed_secret(f"realign-rep-{i}") for i in range(3)]
    log_p = np.array(
        [
            realigned_test(np.asarray(ids), 4, frozenset(), secret).log_p
            for ids in texts
            for secret in keys
        ]
    )
    n = log_p.size
    for alpha in (0.1, 0.01):
        _, high = binomial_bounds(n, alpha, 0.99)
        assert int(np.sum(log_p <= math.log(alpha))) <= high, alpha
    if text_kind == "human":  # exact: not vacuous either
        low, _ = binomial_bounds(n, 0.1, 0.99)
        assert int(np.sum(log_p <= math.log(0.1))) >= low


def test_repetitive_text_needs_the_deduplication() -> None:
    # Negative control for the test above: without de-duplication (every candidate of every
    # position scored, repeats included) a short cycle counts the same pivots again and again
    # and the Gamma tail rejects far above alpha = 0.1.
    rng = np.random.default_rng(5)
    from keyed import label_key_words, pivot_array

    secret = fixed_secret("realign-naive")
    rejected = 0
    for _ in range(100):
        ids = np.asarray(repetitive_ids(rng, 0), dtype=np.int64)
        labels = np.stack([ids[t - 4 : t] for t in range(4, ids.size)])  # repeats kept
        r = pivot_array(label_key_words(secret, labels), ids[4:])
        terms = -np.log1p(-r)
        rejected += stats.gamma.sf(terms.sum(), terms.size) <= 0.1
    _, high = binomial_bounds(100, 0.1, 0.99)
    assert rejected > high


def test_realignment_recovers_insertions(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # A synthetic high-entropy keyed-race text (support 256) with an inserted token after
    # every 4: the plain test loses every label (each holds an inserted token), the re-aligned
    # one gets them back (deterministic seeds; measured plain ln p -1.6, re-aligned -132).
    secret = fixed_secret("realign-ins")
    ids = keyed_race_ids(secret, num_new=200, seed=3, support=256)
    edited: list[int] = []
    for i, token in enumerate(ids):
        edited.append(token)
        if i % 4 == 3:
            edited.append(4000 + i)
    source = KeyedSource(secret)
    options = DetectOptions(realign=True)
    plain = detect(real_tokenizer, source, token_ids=edited, options=options)
    assert plain.realigned is not None
    assert plain.p_value.p_value > 0.01 and plain.realigned.log_p < -50.0
    # On the intact text the re-aligned test pays for the candidates it did not need, but
    # little: the plain label keeps PLAIN_WEIGHT of each position.
    intact = detect(real_tokenizer, source, token_ids=ids, options=options)
    assert intact.realigned is not None and PLAIN_WEIGHT == 0.8
    assert intact.realigned.log_p < 0.5 * intact.p_value.log_p_value
    assert intact.to_json(tokens=False)["edit_tolerant"]["method"] == "exact"


def test_realign_is_off_by_default(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    detection = detect(real_tokenizer, fixed_source("realign-off"), text="some text " * 10)
    assert detection.realigned is None and detection.to_json()["edit_tolerant"] is None
    with pytest.raises(ValueError, match="realign"):
        DetectOptions(realign=1)  # type: ignore[arg-type]


def test_realign_memory_is_linear_in_the_context_width() -> None:
    # The API lets a tenant detect 32,768 token ids with realign under a key of width m = 64:
    # holding the m-wide labels of all (m + 1)·T candidates at once took T·(m + 1)·m·8 bytes
    # and copies (646 MiB traced here for 4,096 ids; 5.5 GB RSS and 31 s for 32,768). One
    # column choice at a time, labels compared by their 128-bit label keys: 28-54 MiB.
    import tracemalloc

    ids = np.random.default_rng(8).integers(3, 49152, size=4096).astype(np.int64)
    secret = fixed_secret("realign-memory")
    realigned_test(ids[:100], 64, frozenset(), secret)  # kernels compiled before the count
    tracemalloc.start()
    try:
        result = realigned_test(ids, 64, frozenset(), secret)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # distinct random ids: the plain label at t = m, then 64 candidates at each of 4,031
    # positions (the 65th, w_{t-1} skipped, is t - 1's plain label: used once)
    assert result.num_candidates == 1 + (4096 - 64 - 1) * 64 and result.num_scored == 4032
    assert peak < 128 * 2**20, peak
