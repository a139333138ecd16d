"""The canonical reading of a text: the characters a reader sees, as the model writes them.

A rewrite that a reader never notices — invisible characters between words, no-break or other
Unicode spaces, doubled spaces, fullwidth or other compatibility forms, letters of another
script that look like the word's own — changes the token ids, hence every label and pivot, and
erases the watermark while the text reads the same. The canonical reading undoes these classes
of rewrite before tokenizing (docs/design.md §4, "Readings"):

1. **invisible**: format characters (Unicode category Cf: zero-width space, joiners, soft
   hyphen, byte-order mark, direction marks and embeddings, tag characters, word joiner, …)
   and their kin outside Cf that render as nothing: variation selectors (U+FE00–FE0F,
   U+E0100–E01EF), the combining grapheme joiner (U+034F), Mongolian free variation selectors
   and vowel separator (U+180B–180F), Hangul fillers (U+115F, U+1160, U+3164, U+FFA0) and Khmer
   inherent vowels (U+17B4, U+17B5) — Unicode's Default_Ignorable_Code_Point outside Cf.
   Removed.
2. **compatibility**: NFKC of each cluster (a starter and its combining marks): fullwidth and
   halfwidth forms, ligatures, styled letters, compatibility spaces. Read in their plain form
   (unless that form is more than two characters longer: the reading stays within 3x).
3. **spaces**: every space separator (category Zs) reads as U+0020 and a run of them as one;
   line and paragraph separators (Zl, Zp) read as a newline.
4. **confusables**: in a word (a run of letters and marks) that mixes scripts, or that is
   written wholly in another script than the text's main one, each letter whose confusable
   in the target script is a single letter of that script is read as that letter; the target
   is the text's main script when every letter of the word is of it or has such a
   confusable, else the word's own majority script under the same condition, else the word
   is left as written. The confusable pairs and the script of each code point come from
   Unicode's confusables.txt and Scripts.txt as the ``confusable_homoglyphs`` package ships
   them (no table of ours).

Nothing legitimate is lost: detection tests the text as submitted (the raw reading) and, when
it differs, the canonical one, and corrects every p-value for the readings tried (Bonferroni:
the readings are functions of the text alone, so under H0 — pivots independent of the text —
each reading's p is valid and min(1, R·min p) is too). A Russian answer, code with runs of
spaces or an emoji with its variation selector is found on the raw reading.

Linear in the text's length: one pass per step over the characters, a dictionary lookup per
non-ASCII character (a cluster past Unicode's stream-safe limit of 30 marks is read as
written, so NFKC's reordering never turns quadratic); an ASCII text without a run of spaces
is its own canonical reading and costs one scan in C.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

import numpy as np

RAW: Final = "raw"
CANONICAL: Final = "canonical"

_INVISIBLE_KIN: Final = (
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x115F, 0x1160),  # Hangul choseong/jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian free variation selectors, vowel separator
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors 1-16
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xE0100, 0xE01EF),  # variation selectors 17-256
)
"""Default_Ignorable_Code_Point ranges outside category Cf (Unicode DerivedCoreProperties)."""

_WORD_NON_ASCII: Final = re.compile(r"[^\x00-\x7f]")


@dataclass(frozen=True)
class Changes:
    """What the canonical reading changed, by class.

    Attributes:
        invisible: invisible characters removed.
        spaces: space characters rewritten: non-ASCII separators read as a space and spaces
            dropped from runs.
        compatibility: clusters read in their NFKC form.
        pairs: (source script, target script) -> letters of the source script (Unicode's name,
            e.g. ``"CYRILLIC"``) read as their confusable twin in the target script.
    """

    invisible: int = 0
    spaces: int = 0
    compatibility: int = 0
    pairs: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def confusables(self) -> dict[str, int]:
        """Source script -> letters of it read as another script's."""
        return _by(self.pairs, 0)

    @property
    def read_as(self) -> dict[str, int]:
        """Target script -> letters read as one of its letters."""
        return _by(self.pairs, 1)

    @property
    def total(self) -> int:
        """Characters changed in all."""
        return self.invisible + self.spaces + self.compatibility + sum(self.pairs.values())

    def describe(self) -> list[str]:
        """Plain sentences, one per class that changed, e.g. ``"41 invisible characters
        removed"``, ``"23 Cyrillic letters read as Latin"``."""
        out: list[str] = []
        if self.invisible:
            out.append(f"{_count(self.invisible, 'invisible character')} removed")
        if self.spaces:
            out.append(f"{_count(self.spaces, 'space character')} read as plain single spaces")
        if self.compatibility:
            out.append(f"{_count(self.compatibility, 'compatibility form')} read in plain form")
        for (source, target), n in sorted(self.pairs.items()):
            out.append(f"{_count(n, source.title() + ' letter')} read as {target.title()}")
        return out

    def to_json(self) -> dict[str, Any]:
        """``{"invisible", "spaces", "compatibility", "confusables", "read_as", "summary"}``."""
        return {
            "invisible": self.invisible,
            "spaces": self.spaces,
            "compatibility": self.compatibility,
            "confusables": dict(sorted(self.confusables.items())),
            "read_as": dict(sorted(self.read_as.items())),
            "summary": self.describe(),
        }


def _by(pairs: dict[tuple[str, str], int], side: int) -> dict[str, int]:
    out: Counter[str] = Counter()
    for pair, n in pairs.items():
        out[pair[side]] += n
    return dict(out)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True, eq=False)
class Reading:
    """One reading of a submitted text.

    Attributes:
        name: ``"raw"`` (the text as submitted) or ``"canonical"``.
        text: the characters read (N of them).
        source_starts, source_ends: (N,) int64, the half-open span of the submitted text each
            character of ``text`` was read from (non-decreasing; spans of characters produced
            by one cluster coincide).
        changes: what this reading changed (all zero for the raw reading).
    """

    name: str
    text: str
    source_starts: np.ndarray
    source_ends: np.ndarray
    changes: Changes

    def source_boundaries(self, boundaries: np.ndarray, source_length: int) -> np.ndarray:
        """Map (T,) int64 character boundaries of ``text`` (each in [0, N]) to boundaries of
        the submitted text (each in [0, ``source_length``]), non-decreasing when the input
        is: boundary k < N goes to where character k was read from, N to the end."""
        b = np.asarray(boundaries, dtype=np.int64)
        table = np.append(self.source_starts, np.int64(source_length))  # (N + 1,)
        return table[b]


@dataclass(frozen=True)
class ReadingReport:
    """Which reading of the submitted text carried the evidence, and what canonicalising
    changed (a sign of tampering when anything did).

    Attributes:
        name: ``"raw"`` or ``"canonical"``: the reading the reported evidence is from.
        readings_tried: R, 1 or 2; every p-value of the result is corrected by it.
        changes: what the canonical reading changed in the submitted text (zeros when it is
            the text itself).
    """

    name: str
    readings_tried: int
    changes: Changes

    def to_json(self) -> dict[str, Any]:
        """``{"name", "readings_tried", "changes": Changes.to_json()}``."""
        return {
            "name": self.name,
            "readings_tried": self.readings_tried,
            "changes": self.changes.to_json(),
        }


def raw_reading(text: str) -> Reading:
    """The text as submitted, character for character."""
    index = np.arange(len(text), dtype=np.int64)
    return Reading(RAW, text, index, index + 1, Changes())


def readings(text: str) -> tuple[Reading, ...]:
    """The readings detection tests (module docstring, "Nothing legitimate is lost").

    Args:
        text: the submitted text (any length; linear time).
    Returns:
        ``(raw,)`` when the text is its own canonical reading; ``(canonical,)`` when the two
        differ only by runs of ASCII spaces after a sentence's or clause's punctuation (the
        typewriter's two spaces after a full stop, common in human text and rare in a model's;
        a rewrite that doubles every space also doubles those between words,
        so it is read both ways); else ``(raw, canonical)``.
    """
    canonical = canonical_reading(text)
    if canonical.text == text:  # its spans are the identity: the raw reading itself
        return (Reading(RAW, text, canonical.source_starts, canonical.source_ends, Changes()),)
    if _SENTENCE_GAP.sub(" ", text) == canonical.text:
        return (canonical,)
    return (raw_reading(text), canonical)


def canonical_reading(text: str) -> Reading:
    """The canonical reading of ``text`` (module docstring, steps 1-4).

    Runs of characters that need no work (ASCII other than runs of spaces inside a line) are
    copied as they are; only the regions around non-ASCII characters and space runs are read
    character by character.

    Args:
        text: any string.
    Returns:
        a ``Reading`` named ``"canonical"`` (equal in ``text`` to the input when nothing
        applies) with the source span of every character and the counts of what changed.
    Raises:
        ValueError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected text to be a string, got {type(text).__name__}")
    pieces: list[str] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    counts = Counter[str]()
    done = 0
    for match in _REGION.finditer(text):
        a, b = match.span()
        first = text[a]
        if a > 0 and text[a - 1] not in " \n" and (_is_mark(first) or is_invisible(first)):
            a -= 1  # an ASCII base letter and the marks after it (invisible ones too): a cluster
        if a > done:
            pieces.append(text[done:a])
            starts.append(np.arange(done, a, dtype=np.int64))
            ends.append(np.arange(done + 1, a + 1, dtype=np.int64))
        read, read_starts, read_ends = _read_region(text, a, b, counts)
        pieces.append(read)
        starts.append(np.asarray(read_starts, dtype=np.int64))
        ends.append(np.asarray(read_ends, dtype=np.int64))
        done = b
    if done == 0:
        index = np.arange(len(text), dtype=np.int64)
        return Reading(CANONICAL, text, index, index + 1, Changes())
    pieces.append(text[done:])
    starts.append(np.arange(done, len(text), dtype=np.int64))
    ends.append(np.arange(done + 1, len(text) + 1, dtype=np.int64))
    source_starts, source_ends = np.concatenate(starts), np.concatenate(ends)
    read = "".join(pieces)
    read, pairs = _confusables(read)
    changes = Changes(counts["invisible"], counts["spaces"], counts["compatibility"], pairs)
    return Reading(CANONICAL, read, source_starts, source_ends, changes)


_REGION: Final = re.compile(r"(?: *[^\x00-\x7f]| {2,})[^\x00-\x1f\x21-\x7f]*")
"""A region to read character by character: spaces and non-ASCII characters around a
non-ASCII character or a run of spaces."""
_MAX_MARKS: Final = 30
"""Combining marks a cluster may carry and still be normalised: Unicode's stream-safe limit
(UAX #15); NFKC's canonical reordering is quadratic in a cluster's length, so a longer one is
read as written."""
_MAX_GROWTH: Final = 2
"""A cluster's NFKC form is read only if it is at most this many characters longer (an
ellipsis, 1 -> 3, is; an 18-letter ligature is not): the canonical reading of n characters
has at most 3n, so its tokenization stays within the caps' order of cost."""
_SENTENCE_GAP: Final = re.compile(r"(?<=[.!?:;]) {2,}")


def _read_region(
    text: str, a: int, b: int, counts: Counter[str]
) -> tuple[str, list[int], list[int]]:
    """Steps 1-3 on ``text[a:b]``: drop invisible characters, read space separators as
    U+0020 and a run of them as one (leading indentation of a line is kept), NFKC each
    cluster. Returns the characters read and the (start, end) source span of each."""
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    indent = a == 0 or text[a - 1] == "\n"
    i = a
    while i < b:
        ch = text[i]
        if ch == " " or (ch >= "\x80" and unicodedata.category(ch) in ("Zs", "Zl", "Zp")):
            if ch in "\u2028\u2029":
                counts["spaces"] += 1
                chars.append("\n")
                starts.append(i)
                ends.append(i + 1)
                indent = True
            elif chars and chars[-1] == " " and not indent:
                counts["spaces"] += 1
                ends[-1] = i + 1
            else:
                counts["spaces"] += ch != " "
                chars.append(" ")
                starts.append(i)
                ends.append(i + 1)
            i += 1
            continue
        indent = False
        if is_invisible(ch):
            counts["invisible"] += 1
            i += 1
            continue
        j = i + 1
        marks = [ch]
        while j < b and (unicodedata.combining(text[j]) or is_invisible(text[j])):
            if is_invisible(text[j]):
                counts["invisible"] += 1  # an invisible character never splits a cluster
            else:
                marks.append(text[j])
            j += 1
        cluster = "".join(marks)
        # past Unicode's stream-safe limit a cluster is read as written (linear time)
        read = cluster if len(marks) > _MAX_MARKS + 1 else _nfkc(cluster)
        if len(read) > len(cluster) + _MAX_GROWTH:
            read = cluster  # e.g. U+FDFA, 18 letters: the reading stays within 3x the text
        elif read != cluster:
            counts["compatibility"] += 1
        for c in read:
            if c == " " and chars and chars[-1] == " ":
                ends[-1] = j
                continue
            chars.append(c)
            starts.append(i)
            ends.append(j)
        i = j
    return "".join(chars), starts, ends


def _is_mark(ch: str) -> bool:
    return unicodedata.combining(ch) != 0


def is_invisible(ch: str) -> bool:
    """True for a format character (Cf) or Default_Ignorable kin (module docstring, step 1)."""
    if unicodedata.category(ch) == "Cf":
        return True
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _INVISIBLE_KIN)


def _nfkc(cluster: str) -> str:
    """NFKC of a cluster of at most ``_MAX_MARKS`` + 1 characters; short ones cached (the cache
    holds at most 8,192 clusters of at most 8 characters)."""
    if len(cluster) <= 8:
        return _nfkc_short(cluster)
    return unicodedata.normalize("NFKC", cluster)


@lru_cache(maxsize=8192)
def _nfkc_short(cluster: str) -> str:
    return unicodedata.normalize("NFKC", cluster)


_LETTER_RUN: Final = re.compile(r"[^\W\d_]+")
_ASCII_LETTERS: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _confusables(text: str) -> tuple[str, dict[tuple[str, str], int]]:
    """Step 4: letters of another script read in their word's target script (one letter
    for one letter, so source spans stay). Returns (text read, (source script, target
    script) -> letters read)."""
    changed: Counter[tuple[str, str]] = Counter()
    words = [m for m in _LETTER_RUN.finditer(text) if not m.group().isascii()]
    if not words:
        return text, {}
    main = _main_script(text)
    out = list(text)
    for match in words:
        word = match.group()
        scripts = Counter(s for s in map(_script, word) if s not in ("COMMON", "INHERITED"))
        if len(scripts) <= 1 and main in scripts:
            continue
        target = None
        for candidate in (main, *(s for s, _ in scripts.most_common())):
            if all(_in_script(c, candidate) for c in word):
                target = candidate
                break
        if target is None:
            continue
        for offset, c in enumerate(word):
            script = _script(c)
            if script in (target, "COMMON", "INHERITED"):
                continue
            out[match.start() + offset] = _confusable(c, target) or c  # a twin exists: _in_script
            changed[script, target] += 1
    if not changed:
        return text, {}
    return "".join(out), dict(changed)


def _main_script(text: str) -> str:
    """The script most of the text's letters are written in, counting only the letters that
    have no confusable twin in another script present (a rewrite that puts Cyrillic а, е, о
    for most Latin vowels leaves the consonants to say the text is Latin; a Russian answer
    has б, д, ж, л, и… to say it is Cyrillic); all letters when none is unambiguous."""
    counts = Counter({c: n for c in _ASCII_LETTERS if (n := text.count(c))})
    counts.update(c for c in _WORD_NON_ASCII.findall(text) if c.isalpha())
    by_script: dict[str, Counter[str]] = {}
    for c, n in counts.items():
        script = _script(c)
        if script not in ("COMMON", "INHERITED"):
            by_script.setdefault(script, Counter())[c] = n
    if not by_script:
        return "LATIN"
    plain: Counter[str] = Counter()
    every: Counter[str] = Counter()
    for script, letters in by_script.items():
        for c, n in letters.items():
            every[script] += n
            if not any(_confusable(c, other) for other in by_script if other != script):
                plain[script] += n
    return (plain or every).most_common(1)[0][0]


def _in_script(c: str, script: str) -> bool:
    """``c`` is of ``script`` (or script-neutral), or reads as one letter of it."""
    own = _script(c)
    return own in (script, "COMMON", "INHERITED") or _confusable(c, script) is not None


@lru_cache(maxsize=65536)
def _script(c: str) -> str:
    from confusable_homoglyphs import categories  # Unicode Scripts.txt ranges

    return str(categories.alias(c))


@lru_cache(maxsize=65536)
def _confusable(c: str, script: str) -> str | None:
    """The single letter of ``script`` that ``c`` is confusable with (Unicode
    confusables.txt), keeping its case where the data lists both; None if there is none."""
    from confusable_homoglyphs import confusables

    found: list[str] = [
        str(entry["c"])
        for entry in confusables.confusables_data.get(c, ())
        if len(entry["c"]) == 1 and entry["c"].isalpha() and _script(entry["c"]) == script
    ]
    if not found:
        return None
    same_case = [f for f in found if f.islower() == c.islower()]
    return (same_case or found)[0]
