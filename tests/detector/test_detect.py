"""detect(): scored set, verdicts, exact-id input, evidence and wire shape (docs/design.md §4)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
import torch

from detector import (
    Detection,
    DetectOptions,
    PValue,
    TokenEvidence,
    Verdict,
    detect,
    min_scored_tokens,
    verdict,
)
from detector.scores import SCORE_NAMES, SCORES
from keyed import KeyedSource, label_key
from keyed.tensor import keys_tensor
from tests.detector.helpers import (
    fixed_secret,
    fixed_source,
    keyed_race_continue,
    keyed_race_ids,
)
from tests.keyed.reference import pivots

# Case C9 fixture: on the SmolLM2 tokenizer, decode([1000, 18434]) = "())+" ("()" then ")+"),
# which re-encodes as [5107, 27] ("())" "+"): decode -> encode does not give the ids back.
# Found by a deterministic scan (a in range(1000, 49152, 97), b in range(200, 49152, 1013);
# this is the first hit); test_c9_pair_does_not_round_trip re-checks it on the tokenizer.
NON_ROUND_TRIP_PAIR = (1000, 18434)

ORDINARY = "The quick brown fox jumps over the lazy dog while the cat watches from a warm window."


def assert_json_safe(detection: Detection) -> dict[str, object]:
    payload = detection.to_json()
    json.dumps(payload, allow_nan=False)  # raises on NaN/Infinity
    return payload


# --- C4: the scored set is the documented rule, whatever the prompt -------------------------


@pytest.mark.parametrize(("width", "scored"), [(4, 8), (1, 11), (8, 4), (12, 0), (16, 0)])
def test_c4_scored_positions_have_a_full_window(real_tokenizer, width: int, scored: int) -> None:  # type: ignore[no-untyped-def]
    # Case C4: a 12-token completion with m = 4 has 8 scored tokens (t >= m, 0-based); only the
    # completion is ever given to the detector, so no prompt can change the count.
    ids = list(range(5000, 5012))
    detection = detect(real_tokenizer, fixed_source("c4", context_width=width), token_ids=ids)
    assert detection.num_tokens == 12
    assert detection.num_scored == scored
    assert detection.skipped["no_context"] == 12 - scored
    statuses = [t.status for t in detection.tokens]
    assert statuses == ["skipped"] * (12 - scored) + ["scored"] * scored


def test_pivots_are_the_keyed_contract(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # The detector's pivot at t is U(k, ids[t-m:t], ids[t], 1) straight from keyed (the same
    # function the sampler races with) — computed here without the detector.
    secret = fixed_secret("contract")
    ids = [17, 4242, 9, 31000, 77, 77, 15, 49151, 3, 1234]
    detection = detect(real_tokenizer, KeyedSource(secret), token_ids=ids)
    for t, token in enumerate(detection.tokens):
        if t < 4:
            assert token.status == "skipped"
            continue
        key = keys_tensor([label_key(secret, ids[t - 4 : t])])
        expected = float(pivots(key, torch.tensor([ids[t]], dtype=torch.int64))[0])
        assert token.id == ids[t]
        assert token.pivot == expected
        assert token.score == pytest.approx(-math.log1p(-expected), rel=1e-15)
    total = sum(t.score for t in detection.tokens if t.score is not None)
    assert detection.p_value.score == pytest.approx(total, rel=1e-12)


# --- C5 / verdicts --------------------------------------------------------------------------


def test_c5_twenty_scored_human_tokens_are_insufficient(real_tokenizer, human_passages) -> None:  # type: ignore[no-untyped-def]
    ids = real_tokenizer(human_passages[0], add_special_tokens=False)["input_ids"][:24]
    detection = detect(real_tokenizer, fixed_source("c5"), token_ids=ids)
    assert detection.num_scored == 20
    # Human text under a key it never saw: p >= 0.01 holds with probability 0.99 per key; this
    # fixed key is one of those (deterministic).
    assert detection.p_value.p_value >= 0.01
    assert detection.verdict is Verdict.INSUFFICIENT_EVIDENCE
    # The whole text gets 0.9 of alpha in the verdict's test (the windows the rest), so the
    # tokens needed are min_scored_tokens(0.009): one more than the whole text alone.
    assert detection.min_scored_tokens == min_scored_tokens(0.009) == 29 > 20
    assert min_scored_tokens(0.01) == 28
    mu = detection.min_detectable_mean_score
    assert mu is not None and mu > detection.reference_mean_score == 1.5


def test_c5_weak_watermark_on_twenty_tokens_is_insufficient(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # Case C5 "of any kind": 20 scored keyed-race tokens from very peaky laws (little entropy,
    # so a weak watermark) do not reach alpha = 0.01 under this key and seed: the verdict is
    # insufficient_evidence — never not_detected — whichever scores are computed.
    secret = fixed_secret("c5-weak")
    ids = keyed_race_continue(
        secret, [9, 99, 999, 9999], 20, np.random.default_rng(5), support=4, concentration=0.02
    )
    detection = detect(
        real_tokenizer,
        KeyedSource(secret),
        token_ids=ids,
        options=DetectOptions(scores=SCORE_NAMES),
    )
    assert detection.num_scored == 20 and detection.p_value.p_value >= 0.01
    assert detection.verdict is Verdict.INSUFFICIENT_EVIDENCE


@pytest.mark.parametrize(
    ("log10_p", "num_scored", "expected"),
    [
        (-0.3, 20, Verdict.INSUFFICIENT_EVIDENCE),
        (-0.3, 27, Verdict.INSUFFICIENT_EVIDENCE),
        (-0.3, 28, Verdict.NOT_DETECTED),
        (-1.99, 500, Verdict.NOT_DETECTED),
        (-2.01, 5, Verdict.WATERMARKED),
        (-400.0, 3000, Verdict.WATERMARKED),
    ],
)
def test_verdict_rule(log10_p: float, num_scored: int, expected: Verdict) -> None:
    p = PValue(1.0, 10.0**log10_p, log10_p, "exact")
    assert verdict(p, num_scored, 0.01, min_scored_tokens(0.01)) is expected


# --- C8: empty and whitespace-only text ----------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\t "], ids=["empty", "whitespace"])
def test_c8_empty_text_is_a_valid_request(real_tokenizer, text: str) -> None:  # type: ignore[no-untyped-def]
    detection = detect(
        real_tokenizer,
        fixed_source("c8"),
        text=text,
        options=DetectOptions(scores=SCORE_NAMES, spans=True),
    )
    assert detection.num_scored == 0
    p = detection.p_value
    assert (p.p_value, p.log10_p_value, p.score) == (1.0, 0.0, 0.0)
    assert detection.verdict is Verdict.INSUFFICIENT_EVIDENCE
    payload = assert_json_safe(detection)
    # Every score: S = 0, p = 1, log10 p = 0 (no tokens, no evidence), never an error.
    assert list(payload["scores"]) == list(SCORE_NAMES)  # type: ignore[arg-type]
    for name, entry in payload["scores"].items():  # type: ignore[attr-defined]
        assert (entry["score"], entry["p_value"], entry["log10_p_value"], entry["anlppt"]) == (
            0.0,
            1.0,
            0.0,
            0.0,
        ), name
    assert payload["scores"]["aaronson"]["method"] == "exact"  # type: ignore[index]
    assert payload["spans"] == {"windows_scanned": 0, "lengths": [], "spans": []}
    assert "".join(t.text for t in detection.tokens) == text


# --- C9: exact ids ------------------------------------------------------------------------


def test_c9_pair_does_not_round_trip(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = real_tokenizer.decode(list(NON_ROUND_TRIP_PAIR))
    assert real_tokenizer(text, add_special_tokens=False)["input_ids"] != list(NON_ROUND_TRIP_PAIR)


def test_c9_token_ids_are_scored_exactly(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prefix = real_tokenizer(ORDINARY, add_special_tokens=False)["input_ids"]
    ids = [*prefix, *NON_ROUND_TRIP_PAIR, *prefix[:6]]
    text = real_tokenizer.decode(ids)
    source = fixed_source("c9")
    with_text = detect(real_tokenizer, source, text=text, token_ids=ids)
    ids_only = detect(real_tokenizer, source, token_ids=ids)
    from_text = detect(real_tokenizer, source, text=text)
    assert with_text.retokenization_matches is False
    assert ids_only.retokenization_matches is None
    assert [t.id for t in with_text.tokens] == ids
    assert with_text.scores == ids_only.scores
    assert [t.id for t in from_text.tokens] != ids  # re-tokenizing would score other ids
    assert "".join(t.text for t in with_text.tokens) == text


def test_c9_ordinary_sentence_round_trips(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = real_tokenizer(ORDINARY, add_special_tokens=False)["input_ids"]
    source = fixed_source("c9")
    with_ids = detect(real_tokenizer, source, text=ORDINARY, token_ids=ids)
    from_text = detect(real_tokenizer, source, text=ORDINARY)
    assert with_ids.retokenization_matches is True
    assert with_ids.tokens == from_text.tokens
    assert with_ids.scores == from_text.scores


def test_token_ids_accept_tensors_and_numpy(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = list(range(7000, 7010))
    source = fixed_source("types")
    reference = detect(real_tokenizer, source, token_ids=ids)
    for variant in (torch.tensor(ids), torch.tensor(ids).numpy(), tuple(ids)):
        assert detect(real_tokenizer, source, token_ids=variant).scores == reference.scores


# --- repetitive text: the repeated-context rule keeps it from counting twice ---------------


REPETITIVE = [
    pytest.param("ids", [1820] * 500, id="one_token_x500"),
    pytest.param("text", "the cat sat " * 200, id="short_cycle"),
    pytest.param(
        "text",
        "def f(x):\n    return x + 1\n\n" + "    total = total + f(i)\n" * 120,
        id="code_repeated_lines",
    ),
]


@pytest.mark.parametrize("masking", [True, False], ids=["masking_on", "masking_off"])
@pytest.mark.parametrize(("kind", "payload"), REPETITIVE)
def test_repetitive_text_is_not_flagged(real_tokenizer, kind: str, payload, masking: bool) -> None:  # type: ignore[no-untyped-def]
    source = fixed_source("repetitive", masking=masking)
    if kind == "ids":
        detection = detect(
            real_tokenizer, source, token_ids=payload, options=DetectOptions(scores=SCORE_NAMES)
        )
    else:
        detection = detect(
            real_tokenizer, source, text=payload, options=DetectOptions(scores=SCORE_NAMES)
        )
    assert detection.num_tokens >= 300
    # A few distinct labels (the head plus one cycle): each is scored once, repeats are skipped.
    assert detection.num_scored <= 30
    assert detection.skipped["repeated_context"] >= detection.num_tokens - 40
    assert detection.verdict is not Verdict.WATERMARKED
    # With <= 30 independent pivots the test is exact: p < 0.01 has probability 0.01 per key;
    # this fixed key is not such a case. Scoring repeats instead (detection_plan with
    # masking=False) flags these texts under 39% of keys (measured over 300 keys), which is why
    # the detector skips repeated labels whatever the key's masking flag.
    assert detection.p_value.p_value >= 0.01
    # Every score: the repeats are never scored, so each p-value is a valid (exact or bound)
    # test of <= 30 independent pivots; none reaches alpha = 0.01 under this fixed key.
    assert all(p.p_value >= 0.01 for p in detection.scores.values()), detection.scores


def test_nonce_does_not_change_detection(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    secret = fixed_secret("nonce")
    text = "the cat sat on the mat " * 5
    first = detect(real_tokenizer, KeyedSource(secret, nonce=1), text=text)
    second = detect(real_tokenizer, KeyedSource(secret, nonce=2**63), text=text)
    assert first == second


# --- special tokens -----------------------------------------------------------------------


def test_special_tokens_are_skipped(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = "Hello there, how are you<|im_end|> today<|endoftext|>"
    detection = detect(real_tokenizer, fixed_source("special"), text=text)
    special = set(real_tokenizer.all_special_ids)
    marked = [t for t in detection.tokens if t.id in special]
    assert len(marked) == 2
    assert all(t.status == "skipped" and t.skip_reason == "special_token" for t in marked)
    assert [t.text for t in marked] == ["<|im_end|>", "<|endoftext|>"]
    assert detection.skipped["special_token"] == 2


# --- H1 sanity without a model -------------------------------------------------------------


def test_keyed_race_text_is_flagged(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    # 200 keyed-race winners over random 32-token supports with P ~ Dirichlet(1): each pivot is
    # biased towards 1 (per-token Aaronson mean ~ 3.6 here, vs 1 under H0), so 200 tokens give
    # log10 p near -110; -40 leaves a wide margin and still needs a mean term >= ~2.
    secret = fixed_secret("h1")
    ids = keyed_race_ids(secret, num_new=200, seed=11)
    detection = detect(
        real_tokenizer, KeyedSource(secret), token_ids=ids, options=DetectOptions(key_id="key-h1")
    )
    assert detection.num_scored == 200
    assert detection.verdict is Verdict.WATERMARKED
    assert detection.p_value.log10_p_value < -40
    assert detection.p_value.score / detection.num_scored > 2.0
    assert assert_json_safe(detection)["scores"]["aaronson"]["anlppt"] > 1.0  # type: ignore[index]
    # The same ids under another key are plain H0 text: not flagged (probability 0.99 per key;
    # this fixed key is one of those).
    other = detect(real_tokenizer, fixed_source("h1-other"), token_ids=ids)
    assert other.p_value.p_value >= 0.01
    assert other.verdict is Verdict.NOT_DETECTED


# --- evidence and the wire shape -----------------------------------------------------------


OFFSET_TEXTS = [
    pytest.param(ORDINARY, id="ascii"),
    pytest.param("  leading and trailing  \n\n", id="whitespace"),
    pytest.param("Naïve café — “quotes” 🎉🎉 中文字符 ok\r\nline\tTab", id="unicode_emoji_cjk"),
    pytest.param("x = [i**2 for i in range(10)]  # squares\nprint(x)\n", id="code"),
]


@pytest.mark.parametrize("text", OFFSET_TEXTS)
def test_token_offsets_index_the_input(real_tokenizer, text: str) -> None:  # type: ignore[no-untyped-def]
    detection = detect(real_tokenizer, fixed_source("offsets"), text=text)
    position = 0
    for token in detection.tokens:
        assert token.text == text[token.start : token.end]
        assert token.start == position  # in order, no gap, no overlap
        position = token.end
    assert position == len(text)
    assert sum(detection.skipped.values()) + detection.num_scored == detection.num_tokens


def test_to_json_contract(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    detection = detect(
        real_tokenizer, fixed_source("json"), text=ORDINARY, options=DetectOptions(key_id="key-1")
    )
    payload = assert_json_safe(detection)
    assert list(payload) == [
        "key_id",
        "num_tokens",
        "num_scored",
        "verdict",
        "alpha",
        "p_value",
        "log10_p_value",
        "test",
        "power",
        "edit_tolerant",
        "scores",
        "tokens",
        "skipped",
        "retokenization_matches",
        "spans",
        "reading",
    ]
    assert payload["key_id"] == "key-1" and payload["verdict"] in {v.value for v in Verdict}
    test = payload["test"]
    # Fewer than 16 scored tokens: no window, the verdict's test is the whole text alone.
    assert detection.num_scored < 16 and test["windows_scanned"] == 0  # type: ignore[index]
    assert test["name"] == "whole_text" and test["whole_text_weight"] == 1.0  # type: ignore[index]
    assert test["log10_p_value"] == payload["log10_p_value"]  # type: ignore[index]
    assert test["whole_text_log10_p_value"] == detection.p_value.log10_p_value  # type: ignore[index]
    assert set(payload["power"]) == {  # type: ignore[arg-type]
        "min_detectable_mean_score",
        "reference_mean_score",
        "detectable",
    }
    assert payload["edit_tolerant"] is None
    assert list(payload["scores"]) == ["aaronson"]  # type: ignore[arg-type]
    assert payload["spans"] is None
    aaronson = payload["scores"]["aaronson"]  # type: ignore[index]
    assert set(aaronson) == {"score", "p_value", "log10_p_value", "method", "anlppt", "params"}
    assert aaronson["anlppt"] == pytest.approx(
        -detection.p_value.log_p_value / detection.num_scored, rel=1e-12
    )
    assert set(payload["skipped"]) == {"no_context", "repeated_context", "special_token"}  # type: ignore[arg-type]
    for token in payload["tokens"]:  # type: ignore[attr-defined]
        assert list(token) == [
            "id",
            "text",
            "start",
            "end",
            "status",
            "skip_reason",
            "pivot",
            "score",
            "terms",
        ]
        if token["status"] == "scored":
            assert token["terms"] == {"aaronson": token["score"]}
        else:
            assert token["terms"] is None
    assert type(payload["verdict"]) is str


def test_secret_never_in_output(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    secret = fixed_secret("leak")
    detection = detect(
        real_tokenizer, KeyedSource(secret), text=ORDINARY, options=DetectOptions(key_id="k")
    )
    material = secret.reveal()
    for rendered in (repr(detection), str(detection), json.dumps(detection.to_json())):
        assert material.hex() not in rendered
        assert material.hex().upper() not in rendered
        assert repr(material) not in rendered


# --- validation at the boundary ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"text": "x", "alpha": 0.0}, r"alpha in \(0, 0.5\]"),
        ({"text": "x", "alpha": 0.6}, r"alpha in \(0, 0.5\]"),
        ({"text": "x", "alpha": math.nan}, r"alpha in \(0, 0.5\]"),
        ({"text": "x", "alpha": True}, "alpha"),
        ({}, "at least one of text or token_ids"),
        ({"text": b"bytes"}, "text to be a string"),
        ({"token_ids": [1, -1]}, r"token_ids\[1\] in \[0, 49152\)"),
        ({"token_ids": [49152]}, r"token_ids\[0\] in \[0, 49152\)"),
        ({"token_ids": [1, 2.5]}, r"token_ids\[1\] to be an int"),
        ({"token_ids": ["7"]}, r"token_ids\[0\] to be an int"),
        ({"token_ids": [True]}, r"token_ids\[0\] to be an int"),
        ({"token_ids": "123"}, "token_ids to be a sequence of ints"),
        ({"token_ids": [[1, 2]]}, r"token_ids\[0\] to be an int"),
        ({"text": "x", "key_id": 3}, "key_id to be a string"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_rejects_bad_input_naming_field_and_limit(real_tokenizer, kwargs, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        options = {k: kwargs.pop(k) for k in ("alpha", "key_id") if k in kwargs}
        detect(real_tokenizer, fixed_source("bad"), **kwargs, options=DetectOptions(**options))


def test_detect_options_are_normalised_and_frozen() -> None:
    options = DetectOptions(alpha=1 / 20, scores=["li", "u"], max_spans=100)
    assert options.alpha == 0.05 and type(options.alpha) is float
    assert options.scores == ("li", "u")  # a tuple: the options cannot change after validation
    assert [f.name for f in options.families] == ["aaronson", "li", "u"]  # Aaronson first
    assert DetectOptions().families == (SCORES["aaronson"],)
    assert DetectOptions(alpha=0.05, scores=("li", "u"), max_spans=100) == options
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.alpha = 0.1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_spans": 0}, r"max_spans an int in \[1, 100\]"),
        ({"max_spans": 101}, r"max_spans an int in \[1, 100\]"),
        ({"max_spans": True}, "max_spans"),
        ({"spans": 1}, "spans to be a bool"),
        ({"scores": "u"}, "sequence of names"),
        ({"scores": ("u", "u")}, "requested twice"),
        ({"alpha": "0.01"}, "alpha to be a number"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_detect_options_reject_bad_fields(fields, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        DetectOptions(**fields)


def test_rejects_options_that_are_not_detect_options(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="options to be a DetectOptions"):
        detect(real_tokenizer, fixed_source("bad"), text="x", options={"alpha": 0.1})  # type: ignore[arg-type]


def test_rejects_a_source_that_is_not_keyed(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="source to be a KeyedSource"):
        detect(real_tokenizer, fixed_secret("raw"), text="x")  # type: ignore[arg-type]


# --- every token of the evidence is consistent (TokenEvidence.check) --------------------------


@pytest.mark.parametrize("scores", [("aaronson",), SCORE_NAMES])
def test_every_evidence_token_is_consistent(real_tokenizer, human_passages, scores) -> None:  # type: ignore[no-untyped-def]
    text = human_passages[0] + "\n\n" + "again " * 40 + "<|im_end|>" + human_passages[1]
    detection = detect(
        real_tokenizer, fixed_source("check"), text=text, options=DetectOptions(scores=scores)
    )
    reasons = {t.skip_reason for t in detection.tokens}
    assert {"no_context", "repeated_context", "special_token"} <= reasons
    for token in detection.tokens:
        token.check()
        assert token.text == text[token.start : token.end]
        if token.status == "scored":
            assert token.terms is not None and set(token.terms) == set(scores)
    spans = [(t.start, t.end) for t in detection.tokens]
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize(
    "fields",
    [
        (1, "a", 2, 1, "scored", None, 0.5, 0.7, None),  # start > end
        (1, "a", 0, 1, "scored", "no_context", 0.5, 0.7, None),  # scored with a reason
        (1, "a", 0, 1, "scored", None, 1.0, 0.7, None),  # pivot outside (0, 1)
        (1, "a", 0, 1, "skipped", "bogus", None, None, None),  # unknown reason
        (1, "a", 0, 1, "skipped", "no_context", 0.5, None, None),  # skipped with a pivot
        (1, "a", 0, 1, "maybe", None, None, None, None),  # unknown status
    ],
)
def test_evidence_check_rejects_inconsistent_tokens(fields) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"expected|a scored token|a skipped token"):
        TokenEvidence(*fields).check()


def test_evidence_columns_match_their_rows_and_survive_pickling(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The columnar evidence (what the detector keeps and pickles to corpus workers) and the
    per-token rows built from it say the same thing, with every score family's terms."""
    import pickle

    text = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n"
    detection = detect(
        real_tokenizer,
        fixed_source("columns"),
        text=text,
        options=DetectOptions(scores=SCORE_NAMES),
    )
    columns = detection.evidence
    rows = detection.tokens
    assert [t.id for t in rows] == columns.ids.tolist()
    assert [(t.start, t.end) for t in rows] == list(
        zip(columns.starts.tolist(), columns.ends.tolist(), strict=True)
    )
    scored = [t for t in rows if t.status == "scored"]
    assert [t.pivot for t in scored] == columns.pivots.tolist()
    for name, terms in columns.terms.items():
        assert [t.terms[name] for t in scored] == terms.tolist()
    reasons = {t.skip_reason for t in rows if t.status == "skipped"}
    assert reasons >= {"no_context", "repeated_context"}
    for token in rows:
        token.check()
    restored = pickle.loads(pickle.dumps(detection))
    assert restored == detection and restored.to_json() == detection.to_json()


def test_evidence_columns_refuse_inconsistent_lengths() -> None:
    from detector.evidence import TokenColumns

    ids = np.arange(3, dtype=np.int64)
    skip = np.array([1, 0, 0], dtype=np.int64)
    with pytest.raises(ValueError, match="scored tokens"):
        TokenColumns("abc", ids, ids, ids + 1, skip, np.array([0.5]), {"aaronson": np.ones(1)})
    with pytest.raises(ValueError, match="one length"):
        TokenColumns("abc", ids, ids[:2], ids + 1, skip, np.ones(2), {"aaronson": np.ones(2)})
