"""Detection over readings (detector.readings): character rewrites on real generations, H0 on
human text under the same rewrites, and the exact correction for the readings tried.

The generations are the held-out answers of ``bench/results/detector_heldout.jsonl`` that reach
128 tokens (16 of 20; SmolLM2-135M-Instruct, mpfr, T = 1, top-k 50, the public bench key),
decoded to text: what a user would paste.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from scipy import stats

from detector import DetectOptions, detect
from detector.canonical import CANONICAL, RAW, canonical_reading, readings
from detector.detect import detect_tokenized, tokenize_input
from detector.evidence import Verdict
from detector.multikey import detect_multi
from detector.readings import tokenize_readings
from keyed import KeyedSource, Secret

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "bench" / "results" / "detector_heldout.jsonl"
ALPHA = 0.01
LN10 = math.log(10.0)

REWRITES: dict[str, Callable[[str], str]] = {
    "zero_width_after_spaces": lambda t: t.replace(" ", " \u200b"),
    "joiners_and_bom": lambda t: t.replace(" ", "\u200d \u2060\ufeff"),
    "soft_hyphens": lambda t: t.replace("e", "e\u00ad").replace("o", "\u00ado"),
    "direction_marks": lambda t: t.replace(" ", "\u200e \u200f"),
    "variation_selectors": lambda t: t.replace("a", "a\ufe0f").replace("n", "n\U000e0100"),
    "tag_characters": lambda t: t.replace(" ", " \U000e0020\U000e0041"),
    "no_break_spaces": lambda t: t.replace(" ", "\u00a0"),
    "other_space_separators": lambda t: t.replace(" ", "\u2009").replace("\u2009a", "\u3000a"),
    "doubled_spaces": lambda t: t.replace(" ", "  "),
    "fullwidth_forms": lambda t: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in t),
    "cyrillic_homoglyphs": lambda t: t.translate(str.maketrans("aeopcxyi", "аеорсхуі")),
    "greek_homoglyphs": lambda t: t.translate(str.maketrans("aiopuvAET", "αιορυνΑΕΤ")),
}
"""Each class of character rewrite of the canonical reading, applied to every occurrence."""


def _source(name: str) -> KeyedSource:
    return KeyedSource(Secret(hashlib.blake2b(name.encode(), digest_size=32).digest()), 4, True)


BENCH = _source("poissonmark-bench:detector")


@pytest.fixture(scope="module")
def answers(real_tokenizer) -> list[str]:  # type: ignore[no-untyped-def]
    rows = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines()]
    texts = [real_tokenizer.decode(r["token_ids"]) for r in rows if len(r["token_ids"]) >= 128]
    assert len(texts) >= 16
    return texts


def _raw_only(tokenizer, text: str) -> Verdict:  # type: ignore[no-untyped-def]
    """The text tested as submitted alone: the detector without the canonical reading."""
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    return detect_tokenized(tokenize_input(tokenizer, text, None), special, BENCH, DetectOptions())


@pytest.mark.parametrize("name", sorted(REWRITES))
def test_rewrite_keeps_the_detections(name: str, real_tokenizer, answers) -> None:  # type: ignore[no-untyped-def]
    """>= 90 % of the clean detections survive the rewrite; tested as submitted alone, the
    rewritten answers are found at most half as often (the rewrite does erase the watermark
    there, so this test fails without the canonical reading)."""
    rewrite = REWRITES[name]
    clean = [detect(real_tokenizer, BENCH, text=t).verdict == Verdict.WATERMARKED for t in answers]
    assert sum(clean) >= len(answers) - 2
    attacked = [rewrite(t) for t in answers]
    found = [detect(real_tokenizer, BENCH, text=t) for t in attacked]
    kept = sum(c and f.verdict == Verdict.WATERMARKED for c, f in zip(clean, found, strict=True))
    assert kept >= math.ceil(0.9 * sum(clean)), (name, kept, sum(clean))
    raw = sum(_raw_only(real_tokenizer, t).verdict == Verdict.WATERMARKED for t in attacked)
    assert raw <= sum(clean) // 2, (name, raw)
    for text, detection in zip(attacked, found, strict=True):
        assert detection.reading is not None
        assert detection.reading.readings_tried == len(readings(text))
        assert detection.reading.changes.total > 0


def test_tampering_is_reported(real_tokenizer, answers) -> None:  # type: ignore[no-untyped-def]
    text = answers[0].replace(" ", " \u200b").replace("a", "\u0430")
    found = detect(real_tokenizer, BENCH, text=text)
    assert found.verdict == Verdict.WATERMARKED and found.reading is not None
    assert found.reading.name == CANONICAL
    said = found.reading.changes.describe()
    assert f"{answers[0].count(' ')} invisible characters removed" in said
    assert any("Cyrillic letters read as Latin" in s for s in said)
    payload = found.to_json()["reading"]
    assert payload["name"] == CANONICAL and payload["readings_tried"] == 2
    # the evidence indexes the submitted text: the tokens' pieces put it back together
    assert "".join(t.text for t in found.tokens) == text


def test_correction_is_exactly_the_number_of_readings(real_tokenizer, answers) -> None:  # type: ignore[no-untyped-def]
    text = answers[1].replace(" ", "\u00a0")
    special = frozenset(int(i) for i in real_tokenizer.all_special_ids)
    read = tokenize_readings(real_tokenizer, text, None)
    assert [r.reading.name for r in read if r.reading] == [RAW, CANONICAL]
    alone = [detect_tokenized(r.tokenized, special, BENCH, DetectOptions()) for r in read]
    found = detect(real_tokenizer, BENCH, text=text, options=DetectOptions(spans=True))
    best = min(a.verdict_log10_p_value for a in alone)
    assert found.verdict_log10_p_value == pytest.approx(min(0.0, best + math.log10(2)), abs=1e-12)
    plain = min(a.p_value.log10_p_value for a in alone)
    aaronson = found.p_value.log10_p_value
    assert aaronson == pytest.approx(min(0.0, plain + math.log10(2)), abs=1e-9)


def test_clean_text_is_tested_once(real_tokenizer, answers) -> None:  # type: ignore[no-untyped-def]
    found = detect(real_tokenizer, BENCH, text=answers[2])
    assert found.reading is not None
    assert (found.reading.name, found.reading.readings_tried) == (RAW, 1)
    alone = _raw_only(real_tokenizer, answers[2])
    assert found.verdict_log10_p_value == alone.verdict_log10_p_value
    # exact token ids are scored as given: no reading at all
    ids = real_tokenizer(answers[2], add_special_tokens=False)["input_ids"]
    assert detect(real_tokenizer, BENCH, token_ids=ids).reading is None


def test_only_invisible_characters_is_insufficient_evidence(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    found = detect(real_tokenizer, BENCH, text="\u200b\u2060\ufeff" * 50)
    assert found.verdict == Verdict.INSUFFICIENT_EVIDENCE
    assert found.reading is not None and found.reading.changes.invisible == 150


def test_multikey_corrects_for_keys_and_readings(real_tokenizer, answers) -> None:  # type: ignore[no-untyped-def]
    sources = {"bench": BENCH, **{f"other-{i}": _source(f"other-{i}") for i in range(3)}}
    text = answers[3].replace("e", "\u0435")
    multi = detect_multi(real_tokenizer, sources, text=text)
    assert multi.num_readings == 2 and multi.best_key_id == "bench"
    assert multi.reading is not None and multi.reading.name == CANONICAL
    own = multi.verdict_log_p_values
    assert own is not None
    assert multi.log10_p_value == pytest.approx(min(0.0, float(own.min()) / LN10 + math.log10(8)))
    assert multi.verdict == Verdict.WATERMARKED


def test_every_detailed_key_reads_as_it_does_alone(real_tokenizer, answers) -> None:  # type: ignore[no-untyped-def]
    """Two readings, twenty keys: each key's result in ``detect_multi`` is ``detect``'s for that
    key alone, whichever reading its own smallest p came from (the keys pick both readings
    here: a key that has to take another key's reading would differ)."""
    sources = {"bench": BENCH, **{f"other-{i}": _source(f"other-{i}") for i in range(19)}}
    text = answers[6][:300].replace(" ", "\u00a0") + answers[7][:300]
    multi = detect_multi(real_tokenizer, sources, text=text)
    assert multi.num_readings == 2 and multi.best_key_id == "bench"
    picked = set()
    for key_id, result in multi.results.items():
        alone = detect(
            real_tokenizer, sources[key_id], text=text, options=DetectOptions(key_id=key_id)
        )
        assert alone.to_json() == result.to_json(), key_id
        assert result.reading is not None
        picked.add(result.reading.name)
        k = multi.key_ids.index(key_id)
        assert multi.verdict_log_p_values is not None
        own = min(0.0, float(multi.verdict_log_p_values[k]) / LN10 + math.log10(2))
        assert own == pytest.approx(alone.verdict_log10_p_value, abs=1e-12)
    assert picked == {RAW, CANONICAL}


def test_human_text_under_every_rewrite_stays_within_alpha(real_tokenizer, human_passages) -> None:  # type: ignore[no-untyped-def]
    """H0: 227 human passages under every rewrite (and clean), each under its own key.

    The count flagged at α = 0.01 must not exceed the 0.999 quantile of Binomial(N, α) per
    class, and of the pooled N. The readings' correction makes each p valid, so a failure here
    has probability <= 0.001 per check (13 classes and the pool: <= 1.4 % in all) unless the
    correction is wrong; the keys are fixed, so the outcome is deterministic.
    """
    passages = [p[:1200] for p in human_passages]
    total = flagged_total = 0
    for c, (name, rewrite) in enumerate(sorted({"clean": lambda t: t, **REWRITES}.items())):
        flagged = 0
        for i, passage in enumerate(passages):
            found = detect(real_tokenizer, _source(f"h0-{c}-{i}"), text=rewrite(passage))
            flagged += found.verdict == Verdict.WATERMARKED
        n = len(passages)
        assert flagged <= stats.binom.ppf(0.999, n, ALPHA), (name, flagged, n)
        total += n
        flagged_total += flagged
    assert flagged_total <= stats.binom.ppf(0.999, total, ALPHA), (flagged_total, total)


def test_canonical_offsets_cover_the_submitted_text(real_tokenizer, answers) -> None:  # type: ignore[no-untyped-def]
    text = "\u200b" + answers[4].replace(" ", "\u00a0\u200b") + "\u200b"
    (raw, canonical) = tokenize_readings(real_tokenizer, text, None)
    assert canonical.reading is not None and canonical.reading.text == canonical_reading(text).text
    starts, ends = canonical.tokenized.starts, canonical.tokenized.ends
    assert starts[0] == 0 and ends[-1] == len(text)
    assert (starts[1:] == ends[:-1]).all() and (ends >= starts).all()
    assert canonical.tokenized.text == raw.tokenized.text == text


def test_one_key_reads_alike_through_detect_and_detect_multi(real_tokenizer, answers) -> None:  # type: ignore[no-untyped-def]
    """Two readings: what a text needs and can show is taken at α/R on both paths, so the
    library, corpus mode and the service (one key) give the same verdict and power."""
    for n in (40, 120, 400):
        text = answers[5][:n].replace(" ", "\u00a0")
        one = detect(real_tokenizer, BENCH, text=text)
        multi = detect_multi(real_tokenizer, {"bench": BENCH}, text=text)
        assert one.reading is not None and one.reading.readings_tried == 2
        assert one.min_scored_tokens == multi.min_scored_tokens
        assert one.verdict == multi.verdict
        assert one.verdict_log10_p_value == pytest.approx(multi.log10_p_value, abs=1e-9)
        assert one.min_detectable_mean_score == pytest.approx(multi.min_detectable_mean_score)
