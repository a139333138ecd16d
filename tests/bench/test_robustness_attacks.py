"""The robustness card's attacks (bench/attacks.py): pure, seeded, and each changes what it
says it changes and nothing else. No model, no detector."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from bench import attacks

TEXT = "The quick brown fox, jumps over the lazy dog. Hello world!\nA second line: 42 cats."


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def without(text: str, characters: set[str]) -> str:
    return "".join(c for c in text if c not in characters)


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(lambda t, g: attacks.typos(t, 0.5, g), id="typos"),
        pytest.param(lambda t, g: attacks.delete_words(t, 0.3, g), id="delete_words"),
        pytest.param(lambda t, g: attacks.insert_words(t, 0.3, ["xyz"], g), id="insert_words"),
        pytest.param(lambda t, g: attacks.after_spaces(t, attacks.ZERO_WIDTH_OTHERS, g),
                     id="zero_width"),
        pytest.param(attacks.soft_hyphens, id="soft_hyphens"),
        pytest.param(attacks.variation_selectors, id="variation_selectors"),
        pytest.param(lambda t, g: attacks.replace_spaces(t, attacks.OTHER_SPACES, g),
                     id="other_spaces"),
    ],
)  # fmt: skip
def test_seeded_attacks_are_deterministic(attack: object) -> None:
    assert callable(attack)
    first = attack(TEXT, rng())
    assert first == attack(TEXT, rng())
    assert first != TEXT


def test_token_edits_count_and_pool() -> None:
    ids = list(range(100))
    pool = np.array([1000, 1001], dtype=np.int64)
    out = attacks.token_edits(ids, 0.2, pool, rng())
    assert out == attacks.token_edits(ids, 0.2, pool, rng())
    # 20 edits, each changing the length by at most one token
    assert 80 <= len(out) <= 120
    assert set(out) - set(ids) <= {1000, 1001}
    assert attacks.token_edits(ids, 0.0, pool, rng()) == ids


def test_typos_only_touch_letters_of_words() -> None:
    out = attacks.typos(TEXT, 1.0, rng())
    # every word of 2+ letters got one swap or drop: same non-letter skeleton
    skeleton = "".join(c for c in TEXT if not c.isalpha())
    assert "".join(c for c in out if not c.isalpha()) == skeleton
    words = TEXT.split()
    assert all(
        a != b for a, b in zip(out.split(), words, strict=True) if sum(map(str.isalpha, b)) >= 2
    )
    assert attacks.typos(TEXT, 0.0, rng()) == TEXT


def test_word_deletions_and_insertions() -> None:
    deleted = attacks.delete_words(TEXT, 1.0, rng())
    assert deleted.count("\n") == TEXT.count("\n")
    assert deleted.replace("\n", "") == ""
    inserted = attacks.insert_words(TEXT, 1.0, ["xyz"], rng())
    assert inserted.split().count("xyz") == len(TEXT.split())
    assert inserted.replace(" xyz", "") == TEXT


@pytest.mark.parametrize(
    ("characters", "name"),
    [
        pytest.param((attacks.ZERO_WIDTH_SPACE,), "zero-width space", id="u200b"),
        pytest.param(attacks.ZERO_WIDTH_OTHERS, "other zero-width", id="zw_others"),
        pytest.param(attacks.DIRECTION_MARKS, "direction marks", id="direction"),
        pytest.param(attacks.TAG_CHARACTERS, "tags", id="tags"),
    ],
)
def test_after_spaces_inserts_one_invisible_format_character_per_space(
    characters: tuple[str, ...], name: str
) -> None:
    out = attacks.after_spaces(TEXT, characters, rng())
    inserted = [c for c in out if c in characters]
    assert len(inserted) == TEXT.count(" "), name
    assert all(unicodedata.category(c) == "Cf" for c in inserted), name
    assert without(out, set(characters)) == TEXT


def test_soft_hyphens_and_variation_selectors_go_inside_words() -> None:
    words = len(attacks._WORD.findall(TEXT))
    hyphenated = attacks.soft_hyphens(TEXT, rng())
    assert hyphenated.count(attacks.SOFT_HYPHEN) == words
    assert without(hyphenated, {attacks.SOFT_HYPHEN}) == TEXT
    assert f" {attacks.SOFT_HYPHEN}" not in hyphenated  # never before a word's first letter
    selected = attacks.variation_selectors(TEXT, rng())
    vs = set(attacks.VARIATION_SELECTORS)
    assert sum(c in vs for c in selected) == words
    assert all(unicodedata.category(c) == "Mn" for c in vs)
    assert without(selected, vs) == TEXT


@pytest.mark.parametrize(
    "spaces",
    [
        pytest.param((attacks.NO_BREAK_SPACE,), id="no_break"),
        pytest.param(attacks.OTHER_SPACES, id="other_zs"),
    ],
)
def test_replace_spaces_uses_space_separators(spaces: tuple[str, ...]) -> None:
    out = attacks.replace_spaces(TEXT, spaces, rng())
    assert " " not in out
    assert all(unicodedata.category(c) == "Zs" for c in spaces)
    assert "".join(" " if c in spaces else c for c in out) == TEXT


def test_other_spaces_are_every_space_separator_but_two() -> None:
    every = {chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Zs"}
    assert set(attacks.OTHER_SPACES) == every - {" ", attacks.NO_BREAK_SPACE}


def test_doubled_spaces() -> None:
    out = attacks.double_spaces(TEXT)
    assert out.count(" ") == 2 * TEXT.count(" ")
    assert out.replace("  ", " ") == TEXT


def test_fullwidth_forms_fold_back_under_nfkc() -> None:
    punct = attacks.fullwidth_punctuation(TEXT)
    assert "," not in punct and "." not in punct and "Hello" in punct
    assert unicodedata.normalize("NFKC", punct) == TEXT
    letters = attacks.fullwidth_letters(TEXT)
    assert not any(c.isascii() and c.isalnum() for c in letters)
    assert "," in letters
    assert unicodedata.normalize("NFKC", letters) == TEXT


@pytest.mark.parametrize(
    ("table", "script"),
    [
        pytest.param(attacks.CYRILLIC, "CYRILLIC", id="cyrillic"),
        pytest.param(attacks.GREEK, "GREEK", id="greek"),
    ],
)
def test_homoglyphs_swap_latin_letters_for_one_script(table: dict[int, int], script: str) -> None:
    out = attacks.homoglyphs(TEXT, table)
    assert len(out) == len(TEXT)
    changed = [(a, b) for a, b in zip(TEXT, out, strict=True) if a != b]
    assert changed
    for latin, other in changed:
        assert unicodedata.name(latin).startswith("LATIN")
        assert unicodedata.name(other).startswith(script)
    # the table maps Latin letters only, one to one
    assert all(chr(k).isascii() and chr(k).isalpha() for k in table)


def test_lowercase() -> None:
    assert attacks.lowercase(TEXT) == TEXT.lower()


def test_strip_emoji_leaves_the_words() -> None:
    laden = "The 🌞 sun 🔥 is 🌍 hot 😊. Yes! 👍🏽 ok ❤️ fine"
    assert attacks.strip_emoji(laden) == "The sun is hot. Yes! ok fine"
    assert attacks.strip_emoji(TEXT) == TEXT
    assert attacks.emoji_per_word("The 🌞 sun 🔥 is 🌍 hot") == pytest.approx(1.0)
    assert attacks.emoji_per_word(TEXT) == 0.0


def test_dilute_places_the_answer_inside_the_filler() -> None:
    def decode(ids: object) -> str:
        return "".join(chr(0x61 + (int(i) % 26)) for i in ids)  # type: ignore[attr-defined]

    answer = [100, 101, 102]
    filler = list(range(50))
    text, lo, hi = attacks.dilute(answer, filler, 4, decode, rng())
    assert len(text) == 3 + 12
    assert text[lo:hi] == decode(answer)
    assert text[:lo] + text[hi:] == decode(filler[:12])
    with pytest.raises(ValueError, match="filler tokens"):
        attacks.dilute(answer, filler[:5], 4, decode, rng())
