"""The canonical reading (detector.canonical): each class of rewrite undone, offsets kept."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from detector.canonical import CANONICAL, RAW, canonical_reading, is_invisible, readings

PLAIN = "The sky is blue because air scatters short waves of sunlight more than long ones."


def _check_spans(text: str, reading_text: str, starts: np.ndarray, ends: np.ndarray) -> None:
    assert starts.shape == ends.shape == (len(reading_text),)
    assert (np.diff(starts) >= 0).all() and (starts < ends).all()
    assert starts.min(initial=0) >= 0 and ends.max(initial=0) <= len(text)


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda t: t.replace(" ", " \u200b"),  # zero-width space after every space
        lambda t: t.replace(" ", "\u200c "),  # zero-width non-joiner
        lambda t: t.replace(" ", " \u2060\ufeff"),  # word joiner, byte-order mark
        lambda t: t.replace("e", "e\u00ad"),  # soft hyphens
        lambda t: "\u200e" + t.replace(" ", "\u200f "),  # direction marks
        lambda t: t.replace("a", "a\ufe0f").replace("o", "o\U000e0101"),  # variation selectors
        lambda t: t.replace(" ", "\U000e0041 "),  # tag characters
        lambda t: t.replace("s", "s\u034f"),  # combining grapheme joiner
        lambda t: t.replace(" ", "\u00a0"),  # no-break spaces
        lambda t: t.replace(" ", "\u2009"),  # thin spaces
        lambda t: t.replace(" ", "\u3000"),  # ideographic spaces
        lambda t: t.replace(" ", "  "),  # doubled spaces
        lambda t: t.replace(" ", " \u00a0\u2002 "),  # mixed runs of separators
        lambda t: t.replace(".", "\uff0e").replace("T", "\uff34"),  # fullwidth forms
        lambda t: t.replace("a", "\u0430").replace("e", "\u0435").replace("o", "\u043e"),  # Cyr.
        lambda t: t.replace("o", "\u03bf").replace("T", "\u03a4"),  # Greek omicron, tau
        lambda t: t.replace("i", "\u0456").replace("c", "\u0441").replace("p", "\u0440"),
    ],
)
def test_each_rewrite_reads_back_as_the_plain_text(rewrite) -> None:  # type: ignore[no-untyped-def]
    attacked = rewrite(PLAIN)
    assert attacked != PLAIN
    reading = canonical_reading(attacked)
    assert reading.text == PLAIN
    assert reading.changes.total > 0 and reading.changes.describe()
    _check_spans(attacked, reading.text, reading.source_starts, reading.source_ends)
    # every character read comes from the same character of the attacked text, or its cluster
    for k, ch in enumerate(reading.text):
        source = attacked[reading.source_starts[k] : reading.source_ends[k]]
        assert ch in unicodedata.normalize("NFKC", source) or ch == " " or len(source) == 1


def test_code_indentation_is_kept_and_sentence_gaps_read_alone() -> None:
    code = "def f(x):\n    if x:\n        return 1\n    return 2\n"
    assert canonical_reading(code).text == code and len(readings(code)) == 1
    # the typewriter's two spaces after a full stop: the canonical reading alone
    typed = "It is blue.  Air scatters light.  Short waves most."
    (only,) = readings(typed)
    assert only.name == CANONICAL and only.text == typed.replace(".  ", ". ")
    # every space doubled, or a run inside code: both readings
    assert [r.name for r in readings(PLAIN.replace(" ", "  "))] == [RAW, CANONICAL]
    assert [r.name for r in readings("x = 1  # one\n")] == [RAW, CANONICAL]


def test_adversarial_inputs_stay_linear() -> None:
    """Inputs that made quadratic paths (a long word beside one region; a cluster of 80,000
    combining marks) read in well under a second each; 10 s is a bound a quadratic path
    exceeds by minutes (measured) and a linear one never approaches."""
    import time

    for text in (
        "a" * 100_000 + "  b",
        "\uff41" * 100_000,
        "a" + "\u0301" * 40_000 + "\u0316" * 40_000,
    ):
        start = time.perf_counter()
        readings(text)
        assert time.perf_counter() - start < 10.0


def test_an_invisible_character_does_not_split_a_cluster() -> None:
    assert canonical_reading("cafe\u200b\u0301").text == "caf\u00e9"


def test_each_script_pair_is_said_on_its_own() -> None:
    said = canonical_reading("h\u0435llo w\u03bfrld").changes.describe()
    assert said == ["1 Cyrillic letter read as Latin", "1 Greek letter read as Latin"]


def test_plain_text_is_its_own_reading() -> None:
    assert readings(PLAIN)[0].name == RAW and len(readings(PLAIN)) == 1
    assert canonical_reading(PLAIN).changes.total == 0
    rewritten = readings(PLAIN.replace(" ", "\u00a0"))
    assert [r.name for r in rewritten] == [RAW, CANONICAL]


def test_what_changed_is_counted_and_said() -> None:
    attacked = PLAIN.replace(" ", " \u200b").replace("e", "\u0435")
    changes = canonical_reading(attacked).changes
    assert changes.invisible == PLAIN.count(" ")
    assert changes.confusables == {"CYRILLIC": PLAIN.count("e")}
    assert changes.read_as == {"LATIN": PLAIN.count("e")}
    said = changes.describe()
    assert f"{PLAIN.count(' ')} invisible characters removed" in said
    assert f"{PLAIN.count('e')} Cyrillic letters read as Latin" in said
    payload = changes.to_json()
    assert payload["summary"] == said and payload["invisible"] == PLAIN.count(" ")


def test_a_text_in_another_script_is_left_as_written() -> None:
    for text in ("Небо голубое, потому что воздух рассеивает свет.", "Ο ουρανός είναι μπλε."):
        assert canonical_reading(text).text == text
    # an English word inside a Russian answer keeps its letters: 'd' has no Cyrillic twin
    mixed = "Это код: def main"
    assert canonical_reading(mixed).text == mixed


def test_main_script_is_read_from_the_letters_without_a_twin() -> None:
    # most letters replaced by Cyrillic twins: the consonants left still say "Latin"
    table = str.maketrans("aceopxyijsABCEHKMOPTX", "асеорхуіјѕАВСЕНКМОРТХ")
    assert canonical_reading(PLAIN.translate(table)).text == PLAIN


def test_mixed_word_reads_in_its_script() -> None:
    # one Cyrillic letter in a Latin word, one Latin letter in a Russian word
    assert canonical_reading("h\u0435llo world").text == "hello world"
    assert canonical_reading("Небо гoлубое и тёмное").text == "Небо голубое и тёмное"


def test_only_invisible_characters_read_as_nothing() -> None:
    reading = canonical_reading("\u200b\u200c\u200d\ufeff\u2060" * 20)
    assert reading.text == "" and reading.changes.invisible == 100
    assert reading.source_starts.shape == (0,)


def test_composed_and_decomposed_letters_read_alike() -> None:
    assert canonical_reading("cafe\u0301 ﬁne").text == "café fine"


def test_the_reading_grows_at_most_threefold() -> None:
    assert canonical_reading("\u2026").text == "..."  # an ellipsis: 1 -> 3
    long_ligature = "\ufdfa" * 1000  # NFKC: 18 letters each
    assert len(canonical_reading(long_ligature).text) <= 3 * len(long_ligature)


def test_newlines_and_tabs_are_kept() -> None:
    text = "def f():\n\treturn 1\n\nx = 2\u2028y"
    assert canonical_reading(text).text == "def f():\n\treturn 1\n\nx = 2\ny"


def test_invisible_class_is_cf_and_default_ignorable_kin() -> None:
    for ch in "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e\u200f\u202a\u2066\U000e0041":
        assert unicodedata.category(ch) == "Cf" and is_invisible(ch)
    for ch in "\ufe0f\U000e0100\u034f\u180b\u3164":
        assert is_invisible(ch)
    for ch in "a \n\u00e9\u0301":
        assert not is_invisible(ch)


def test_source_boundaries_map_to_the_submitted_text() -> None:
    attacked = "\u200bab\u200b c"
    reading = canonical_reading(attacked)
    assert reading.text == "ab c"
    mapped = reading.source_boundaries(np.array([0, 2, 4]), len(attacked))
    assert mapped.tolist() == [1, 4, len(attacked)]


def test_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="expected text to be a string"):
        canonical_reading(b"bytes")  # type: ignore[arg-type]
