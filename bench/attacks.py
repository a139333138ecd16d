"""Text rewrites that try to erase a watermark: the attacks of the robustness card.

Each attack is a small pure function of the text (and, where it is random, a seeded
``numpy.random.Generator``): the same input and seed give the same output. Sources:

- token edits: random substitutions, insertions and deletions of tokens, the edit model of
  Kuditipudi et al. 2023 ("Robust Distortion-free Watermarks for Language Models", §4) as
  ``bench.detector_robustness`` applies it;
- typos, word deletions and insertions, lower-casing: the perturbations of MarkMyWords (Piet
  et al. 2023, arXiv:2312.00273, §4.2: "typo", "swap", "lowercase") and of WaterPark
  (arXiv:2411.13425);
- invisible characters, Unicode spaces, compatibility forms and homoglyphs: the character
  attacks of Boucher et al. 2022 ("Bad Characters: Imperceptible NLP Attacks", IEEE S&P:
  invisible characters, homoglyphs, reorderings) and of Kirchenbauer et al. 2023 (§7, "A
  Watermark for Large Language Models": Unicode homoglyphs, the emoji attack); the characters
  come from the Unicode Standard (General_Category Cf and Zs, the variation selectors, the tag
  block U+E0000–U+E007F, the fullwidth block U+FF01–U+FF5E) and, for homoglyphs, from the
  Cyrillic and Greek letters Unicode's confusables.txt lists for Latin ones;
- copy-paste dilution: the answer inside human text (``bench.detector_robustness``);
- emoji removal: the second half of the emoji attack (Kirchenbauer et al. 2023, §7).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence

import numpy as np

ZERO_WIDTH_SPACE = "\u200b"
ZERO_WIDTH_OTHERS = ("\u200c", "\u200d", "\u2060", "\ufeff")
"""Zero-width non-joiner, joiner, word joiner, byte-order mark (zero-width no-break space)."""
SOFT_HYPHEN = "\u00ad"
DIRECTION_MARKS = ("\u200e", "\u200f", "\u061c")
"""Left-to-right, right-to-left and Arabic letter marks: invisible, no reordering of Latin."""
VARIATION_SELECTORS = tuple(chr(c) for c in range(0xFE00, 0xFE10))
TAG_CHARACTERS = tuple(chr(c) for c in range(0xE0020, 0xE007F))
"""The tag block's printable range (tag space to tag tilde): "ASCII smuggling"."""
NO_BREAK_SPACE = "\u00a0"
OTHER_SPACES = (
    "\u1680", *(chr(c) for c in range(0x2000, 0x200B)), "\u202f", "\u205f", "\u3000",
)  # fmt: skip
"""Every Unicode space separator (Zs) other than U+0020 and U+00A0."""
CYRILLIC = str.maketrans("aceopxyijsABCEHKMOPTX", "асеорхуіјѕАВСЕНКМОРТХ")
"""Cyrillic letters confusable with Latin ones (а е о р с х у і ј ѕ and the capitals)."""
GREEK = str.maketrans("ovABEHIKMNOPTXYZ", "ονΑΒΕΗΙΚΜΝΟΡΤΧΥΖ")
"""Greek letters confusable with Latin ones (ο omicron, ν nu, and the capitals)."""
_WORD = re.compile(r"[^\W\d_]{2,}")
_SPACE = " "


def token_edits(
    ids: Sequence[int], rate: float, pool: np.ndarray, rng: np.random.Generator
) -> list[int]:
    """``ids`` after round(rate·n) edits at uniform positions, each a substitution, insertion
    or deletion with equal probability, new tokens drawn from ``pool`` (``(P,)`` int64)."""
    out = list(ids)
    for _ in range(round(rate * len(ids))):
        which = int(rng.integers(3))
        j = int(rng.integers(len(out)))
        token = int(pool[rng.integers(pool.size)])
        if which == 0:
            out[j] = token
        elif which == 1:
            out.insert(j, token)
        elif len(out) > 1:
            del out[j]
    return out


def typos(text: str, rate: float, rng: np.random.Generator) -> str:
    """Each word of two or more letters, with probability ``rate``, gets one typo: two
    adjacent letters swapped or one letter dropped (equally likely, at a uniform place)."""

    def one(match: re.Match[str]) -> str:
        word = match.group()
        if rng.random() >= rate:
            return word
        j = int(rng.integers(len(word) - 1))
        if rng.random() < 0.5:
            return word[:j] + word[j + 1] + word[j] + word[j + 2 :]
        return word[:j] + word[j + 1 :]

    return _WORD.sub(one, text)


def delete_words(text: str, rate: float, rng: np.random.Generator) -> str:
    """Each space-separated word deleted with probability ``rate`` (with the space before
    it); line breaks are kept."""
    lines = []
    for line in text.split("\n"):
        words = line.split(_SPACE)
        kept = [w for w in words if not w or rng.random() >= rate]
        lines.append(_SPACE.join(kept))
    return "\n".join(lines)


def insert_words(
    text: str, rate: float, vocabulary: Sequence[str], rng: np.random.Generator
) -> str:
    """After each space-separated word, with probability ``rate``, a word drawn uniformly from
    ``vocabulary`` (e.g. the words of human text)."""
    lines = []
    for line in text.split("\n"):
        out: list[str] = []
        for word in line.split(_SPACE):
            out.append(word)
            if word and rng.random() < rate:
                out.append(vocabulary[int(rng.integers(len(vocabulary)))])
        lines.append(_SPACE.join(out))
    return "\n".join(lines)


def after_spaces(text: str, characters: Sequence[str], rng: np.random.Generator) -> str:
    """One of ``characters`` (uniform) after every space."""
    parts = text.split(_SPACE)
    picks = rng.integers(len(characters), size=max(len(parts) - 1, 0))
    out = [parts[0]]
    for part, pick in zip(parts[1:], picks.tolist(), strict=True):
        out.append(_SPACE + characters[pick] + part)
    return "".join(out)


def inside_words(text: str, characters: Sequence[str], rng: np.random.Generator) -> str:
    """One of ``characters`` (uniform) inside every word of two or more letters, after a
    uniform one of its letters but the last."""

    def one(match: re.Match[str]) -> str:
        word = match.group()
        j = 1 + int(rng.integers(len(word) - 1))
        return word[:j] + characters[int(rng.integers(len(characters)))] + word[j:]

    return _WORD.sub(one, text)


def soft_hyphens(text: str, rng: np.random.Generator) -> str:
    """A soft hyphen (U+00AD) inside every word: a line-break hint, invisible mid-line."""
    return inside_words(text, (SOFT_HYPHEN,), rng)


def variation_selectors(text: str, rng: np.random.Generator) -> str:
    """A variation selector (U+FE00–U+FE0F) after a letter of every word: ignored by fonts
    that define no variant for the letter."""
    return inside_words(text, VARIATION_SELECTORS, rng)


def replace_spaces(text: str, spaces: Sequence[str], rng: np.random.Generator) -> str:
    """Every U+0020 space replaced by one of ``spaces`` (uniform)."""
    parts = text.split(_SPACE)
    picks = rng.integers(len(spaces), size=max(len(parts) - 1, 0))
    out = [parts[0]]
    for part, pick in zip(parts[1:], picks.tolist(), strict=True):
        out.append(spaces[pick] + part)
    return "".join(out)


def double_spaces(text: str) -> str:
    """Every space doubled."""
    return text.replace(_SPACE, _SPACE * 2)


def fullwidth_punctuation(text: str) -> str:
    """ASCII punctuation as its fullwidth form (U+FF01–U+FF5E; NFKC folds it back)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" and not c.isalnum() else c for c in text)


def fullwidth_letters(text: str) -> str:
    """ASCII letters and digits as their fullwidth forms (NFKC folds them back)."""
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in text)


def homoglyphs(text: str, table: Mapping[int, int]) -> str:
    """Every letter ``table`` maps (``str.maketrans``: ``CYRILLIC``, ``GREEK``) replaced."""
    return text.translate(table)


def lowercase(text: str) -> str:
    """The text lower-cased (a reference: a rewrite no canonical reading should undo)."""
    return text.lower()


def is_emoji(character: str) -> bool:
    """An emoji or a part of one: a symbol of category So, a skin-tone modifier, the emoji
    variation selector U+FE0F, the zero-width joiner, the keycap U+20E3, a tag character."""
    cp = ord(character)
    return (
        unicodedata.category(character) == "So"
        or 0x1F3FB <= cp <= 0x1F3FF
        or cp in (0xFE0F, 0x200D, 0x20E3)
        or 0xE0020 <= cp <= 0xE007F
    )


def strip_emoji(text: str) -> str:
    """Every emoji (``is_emoji``) deleted, then each run of spaces left behind read as one
    space and a space before punctuation dropped: what the attacker of the emoji attack
    does to the emoji-laden answer."""
    kept = "".join(c for c in text if not is_emoji(c))
    kept = re.sub(r"[ \t]{2,}", " ", kept)
    kept = re.sub(r" +([.,;:!?])", r"\1", kept)
    return re.sub(r"(?m)^ +| +$", "", kept)


def emoji_per_word(text: str) -> float:
    """Runs of emoji (whitespace inside a run allowed) per gap between two words: how well
    the model followed the instruction (1.0: an emoji between every two words)."""
    runs, inside = 0, False
    for c in text:
        if is_emoji(c):
            runs += not inside
            inside = True
        elif not c.isspace():
            inside = False
    words = len(strip_emoji(text).split())
    return runs / max(words - 1, 1)


def dilute(
    answer: Sequence[int],
    filler: Sequence[int],
    ratio: int,
    decode: Callable[[Sequence[int]], str],
    rng: np.random.Generator,
) -> tuple[str, int, int]:
    """The answer's ids at a uniform token offset inside the first ``ratio`` × len(answer) ids
    of ``filler`` (human text), decoded.

    Returns:
        the text and the answer's character span [start, end) in it (each part decoded
        alone, so the span is exact).
    """
    need = ratio * len(answer)
    if len(filler) < need:
        raise ValueError(f"expected at least {need} filler tokens, got {len(filler)}")
    cut = int(rng.integers(need + 1))
    before, inside, after = decode(filler[:cut]), decode(answer), decode(filler[cut:need])
    return before + inside + after, len(before), len(before) + len(inside)
