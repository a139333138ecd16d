"""Text <-> token ids for detection, with the character span of every token.

The detector scores token ids; a person reads characters. This module owns the map between
them (DESIGN §4): text is tokenized with the key's tokenizer, ``add_special_tokens=False``,
never trimmed or normalised; exact ``token_ids`` may be supplied instead, and then the spans
index into the text those ids decode to.

Span convention — the spans partition the text they index, in order:
- a character whose bytes are split over several tokens (byte-level BPE: an emoji is often 2-4
  tokens) belongs to the token that completes it; the tokens before it get an empty span;
- characters the tokenizer's offsets leave out (trimmed whitespace) belong to the next token,
  and a tail after the last token to the last token.
So ``"".join(text[s:e] for s, e in spans) == text`` whenever there is at least one token.

Shapes: T tokens; ``ids`` and ``spans`` have length T.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from detector.errors import TokenizerMismatch

_REPLACEMENT = "\ufffd"  # what a decoder emits for an incomplete UTF-8 sequence


class Tokenizer(Protocol):
    """The part of a Hugging Face fast tokenizer the detector uses."""

    @property
    def all_special_ids(self) -> list[int]: ...

    @property
    def is_fast(self) -> bool: ...

    def __len__(self) -> int: ...

    def __call__(
        self, text: str, *, add_special_tokens: bool, return_offsets_mapping: bool
    ) -> Mapping[str, Any]: ...

    def decode(
        self,
        token_ids: Sequence[int],
        *,
        skip_special_tokens: bool,
        clean_up_tokenization_spaces: bool,
    ) -> str: ...


@dataclass(frozen=True)
class TokenizedText:
    """Token ids and the character span of each in ``text``.

    Attributes:
        ids: (T,) token ids.
        text: the text the spans index: the input text, or the decoding of supplied ids.
        spans: (T,) ``(start, end)`` character offsets into ``text``, a partition (see module).
        retokenization_matches: with both ids and text supplied, whether tokenizing the text
            reproduces the ids exactly; None otherwise.
    """

    ids: tuple[int, ...]
    text: str
    spans: tuple[tuple[int, int], ...]
    retokenization_matches: bool | None

    def __post_init__(self) -> None:
        if len(self.spans) != len(self.ids):
            raise ValueError(f"expected {len(self.ids)} spans, got {len(self.spans)}")

    def piece(self, index: int) -> str:
        """The text of token ``index``: ``text[start:end]``."""
        start, end = self.spans[index]
        return self.text[start:end]


def encode(tokenizer: Tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` and the tokenizer's raw character offsets (may overlap).

    ``add_special_tokens=False``: the text is scored as given, no BOS/EOS added.
    """
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    # A fast tokenizer returns plain lists of ints and of (int, int) tuples already.
    ids: list[int] = encoding["input_ids"]
    offsets: list[tuple[int, int]] = encoding["offset_mapping"]
    return ids, offsets


def partition_offsets(offsets: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """Turn a tokenizer's (possibly overlapping or gapped) offsets into a partition of [0, length).

    Args:
        offsets: (T,) raw ``(start, end)`` character offsets from the tokenizer.
        length: the text's length in characters.
    Returns:
        (T,) contiguous ``(start, end)`` spans: the first starts at 0, the last ends at length.
    """
    if len(offsets) == 0:
        return []
    raw = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    # A character shared with the next token goes to the later token; the tail to the last:
    # end_i = min(end_i, start_{i+1}), end_last = length; then ends never go back or past length
    # (a running maximum of the clipped ends), and each span starts where the previous ended.
    ends = np.minimum(raw[:, 1], np.append(raw[1:, 0], length))
    ends[-1] = length
    ends = np.maximum.accumulate(np.clip(ends, 0, length))
    starts = np.concatenate(([0], ends[:-1]))
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _decode(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def decoded_pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> tuple[str, list[str]]:
    """The decoding of ``ids`` and the piece of it each token contributes.

    Incremental detokenisation (after vLLM's ``detokenize_incrementally``): decode a short window
    ending at each token and emit what it adds, except a trailing incomplete character (U+FFFD
    from a partial UTF-8 sequence), which waits for the token that completes it; the window
    restarts at the last token that ended cleanly. The pieces are checked to concatenate to the
    full decoding; if a tokenizer breaks that, the cumulative decode (quadratic, exact) is used.

    Returns:
        (full decoded text, (T,) pieces with ``"".join(pieces) == text``).
    """
    text = _decode(tokenizer, ids)
    pieces: list[str] = []
    anchor = clean = 0  # window start; the token after the last clean end
    emitted = 0  # characters of decode(ids[anchor:]) already given to tokens
    for i in range(len(ids)):
        window = _decode(tokenizer, ids[anchor : i + 1])
        stable = window if i + 1 == len(ids) else window.rstrip(_REPLACEMENT)
        pieces.append(stable[emitted:])
        emitted = max(emitted, len(stable))
        if stable == window:  # clean end: restart the window at the previous clean end
            anchor, clean = clean, i + 1
            emitted = len(_decode(tokenizer, ids[anchor : i + 1]))
    if "".join(pieces) != text:
        pieces = _cumulative_pieces(tokenizer, ids, text)
    return text, pieces


def _cumulative_pieces(tokenizer: Tokenizer, ids: Sequence[int], text: str) -> list[str]:
    """Pieces from decoding every prefix: token i ends where prefix i+1 stops agreeing with text."""
    ends: list[int] = []
    previous = 0
    for i in range(len(ids)):
        prefix = _decode(tokenizer, ids[: i + 1]).rstrip(_REPLACEMENT)
        if not text.startswith(prefix):
            common = 0
            while common < min(len(prefix), len(text)) and prefix[common] == text[common]:
                common += 1
            prefix = prefix[:common]
        previous = max(previous, len(prefix))
        ends.append(previous)
    if ends:
        ends[-1] = len(text)
    starts = [0, *ends[:-1]]
    return [text[s:e] for s, e in zip(starts, ends, strict=True)]


def tokenize(
    tokenizer: Tokenizer, text: str | None, token_ids: Sequence[int] | None
) -> TokenizedText:
    """Ids and character spans for detection, from text, from exact ids, or both.

    Args:
        tokenizer: the key's tokenizer (a fast tokenizer when ``text`` is tokenized).
        text: the text as submitted; never trimmed or normalised.
        token_ids: exact ids to score (case C9); when given they win over ``text``, their spans
            index into their own decoding, and ``retokenization_matches`` says whether
            tokenizing ``text`` (if given) reproduces them.
    Returns:
        a ``TokenizedText``.
    Raises:
        ValueError: neither text nor token_ids; only ``text`` with a slow tokenizer.
    """
    if token_ids is not None:
        ids = [int(i) for i in token_ids]
        decoded, pieces = decoded_pieces(tokenizer, ids)
        spans: list[tuple[int, int]] = []
        position = 0
        for piece in pieces:
            spans.append((position, position + len(piece)))
            position += len(piece)
        matches = None if text is None else _encode_ids(tokenizer, text) == ids
        return TokenizedText(tuple(ids), decoded, tuple(spans), matches)
    if text is None:
        raise ValueError("expected text or token_ids, got neither")
    _require_fast(tokenizer)
    ids, offsets = encode(tokenizer, text)
    return TokenizedText(tuple(ids), text, tuple(partition_offsets(offsets, len(text))), None)


def _encode_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=False)
    return [int(i) for i in encoding["input_ids"]]


def _require_fast(tokenizer: Tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            "expected a fast tokenizer (character offsets need one), got a slow tokenizer"
        )


def check_tokenizer(
    key_fingerprint: str, tokenizer_fingerprint: str, key_id: str | None = None
) -> None:
    """Refuse to detect with a tokenizer other than the key's (DESIGN §2: the key record holds
    the fingerprint of the tokenizer it was made for).

    Args:
        key_fingerprint: the fingerprint stored in the key record.
        tokenizer_fingerprint: the fingerprint of the tokenizer detection would use (the
            service and CLI compute it with ``sampler.models.tokenizer_fingerprint``).
        key_id: the key's public id, for the message.
    Raises:
        TokenizerMismatch: the fingerprints differ.
        ValueError: a fingerprint that is not a non-empty string.
    """
    for name, value in (
        ("key_fingerprint", key_fingerprint),
        ("tokenizer_fingerprint", tokenizer_fingerprint),
    ):
        if not isinstance(value, str) or not value:
            raise ValueError(f"expected {name} a non-empty string, got {value!r}")
    if key_fingerprint != tokenizer_fingerprint:
        raise TokenizerMismatch(key_fingerprint, tokenizer_fingerprint, key_id)
