"""Text <-> token ids for detection, with the character span of every token.

The detector scores token ids; a person reads characters. This module owns the map between
them (docs/design.md §4): text is tokenized with the key's tokenizer, ``add_special_tokens=False``,
never trimmed or normalised; exact ``token_ids`` may be supplied instead, and then the spans
index into the text those ids decode to.

Span convention — the spans partition the text they index, in order:
- a character whose bytes are split over several tokens (byte-level BPE: an emoji is often 2-4
  tokens) belongs to the token that completes it; the tokens before it get an empty span;
- characters the tokenizer's offsets leave out (trimmed whitespace) belong to the next token,
  and a tail after the last token to the last token.
So ``"".join(text[s:e] for s, e in spans) == text`` whenever there is at least one token.

Shapes: T tokens; ``ids``, ``starts`` and ``ends`` are (T,) int64 columns.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np

from detector.errors import TextTokenIdsMismatch, TokenizerMismatch

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


@dataclass(frozen=True, eq=False)
class TokenizedText:
    """Token ids and the character span of each in ``text``, as NumPy columns.

    Attributes:
        ids: (T,) int64 token ids.
        text: the text the spans index: the input text, or the decoding of supplied ids.
        starts, ends: (T,) int64 character offsets into ``text`` of each token, a partition
            (see module): ``starts[0] == 0``, ``ends[i] == starts[i + 1]``, ``ends[-1]`` the
            text's length.
        retokenization_matches: with both ids and text supplied, whether tokenizing the text
            reproduces the ids exactly; None otherwise.
    Raises:
        ValueError: columns that are not (T,) integer arrays of one length.
    """

    ids: np.ndarray
    text: str
    starts: np.ndarray
    ends: np.ndarray
    retokenization_matches: bool | None

    def __post_init__(self) -> None:
        n = None
        for name in ("ids", "starts", "ends"):
            given = np.asarray(getattr(self, name))
            if given.size and not np.issubdtype(given.dtype, np.integer):
                raise ValueError(f"expected {name} to be integers, got {given.dtype}")
            if given.ndim != 1 or (n is not None and given.shape[0] != n):
                raise ValueError(f"expected {name} of shape ({n if n is not None else 'T'},), "
                                 f"got {given.shape}")  # fmt: skip
            n = given.shape[0]
            column = np.array(given, dtype=np.int64)  # our own read-only copy
            column.flags.writeable = False
            object.__setattr__(self, name, column)

    @classmethod
    def from_spans(
        cls,
        ids: Sequence[int],
        text: str,
        spans: Sequence[tuple[int, int]],
        retokenization_matches: bool | None = None,
    ) -> TokenizedText:
        """Build from (T,) ids and (T,) ``(start, end)`` pairs.

        Raises:
            ValueError: spans that are not (T, 2) integers, or columns as the constructor.
        """
        pairs = np.asarray(spans)
        if pairs.size == 0:
            pairs = np.zeros((0, 2), dtype=np.int64)
        if pairs.ndim != 2 or pairs.shape[1] != 2:
            raise ValueError(f"expected spans of shape (T, 2), got {pairs.shape}")
        return cls(np.asarray(ids, dtype=np.int64), text, pairs[:, 0], pairs[:, 1],
                   retokenization_matches)  # fmt: skip

    @property
    def spans(self) -> list[tuple[int, int]]:
        """(T,) ``(start, end)`` pairs as Python ints (built on each read)."""
        return list(zip(self.starts.tolist(), self.ends.tolist(), strict=True))

    def piece(self, index: int) -> str:
        """The text of token ``index``: ``text[start:end]``."""
        return self.text[int(self.starts[index]) : int(self.ends[index])]


def encode(tokenizer: Tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``text`` and the tokenizer's raw character offsets (may overlap).

    ``add_special_tokens=False``: the text is scored as given, no BOS/EOS added. A Hugging Face
    fast tokenizer is called through its Rust backend (``backend_tokenizer.encode``), which is
    what its ``__call__`` runs after setting truncation off, padding off and
    ``encode_special_tokens`` to ``split_special_tokens``; the wrapper adds 2-12 % to a
    512-token call (``bench/results/detector_throughput.json`` and earlier runs). The wrapper is
    called instead when the backend is set otherwise, or when the tokenizer's class overrides a
    step of the wrapper's path (e.g. CodeLlama, LayoutLM, NLLB: slower, never different).
    Tested equal to the wrapper on human text, special-token strings, emoji.

    Returns:
        (T,) int64 ids and (T, 2) int64 ``(start, end)`` offsets.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and _backend_is_plain(tokenizer, backend):
        encoding = backend.encode(text, add_special_tokens=False)
        ids, offsets = encoding.ids, encoding.offsets
    else:
        mapping = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = mapping["input_ids"], mapping["offset_mapping"]
    id_array = np.fromiter(ids, dtype=np.int64, count=len(ids))
    flat = itertools.chain.from_iterable(offsets)  # fromiter: ~2x np.array on the tuples
    return id_array, np.fromiter(flat, dtype=np.int64, count=2 * len(ids)).reshape(-1, 2)


# The methods a fast tokenizer's ``__call__`` runs on the way to ``backend.encode_batch`` and the
# transformers modules that define the stock versions: a subclass that overrides one of them
# (e.g. a tokenizer with infilling markers) is always called through its wrapper.
_ENCODE_PATH: Final = ("__call__", "_get_padding_truncation_strategies", "_encode_plus",
                       "set_truncation_and_padding", "_convert_encoding")  # fmt: skip
_OPTIONAL_HOOKS: Final = ("_switch_to_input_mode",)  # called when defined; stock when absent
_STOCK_MODULES: Final = frozenset(
    {"transformers.tokenization_utils_base", "transformers.tokenization_utils_tokenizers"}
)


@functools.lru_cache(maxsize=64)
def _stock_encode_path(cls: type) -> bool:
    """Whether every method on the wrapper's path to the backend is the stock one: defined in
    transformers' base modules (by a class there, and not a function patched onto it)."""
    for name in _ENCODE_PATH + _OPTIONAL_HOOKS:
        owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
        if owner is None:
            if name in _OPTIONAL_HOOKS:
                continue
            return False
        function = getattr(vars(owner)[name], "__module__", owner.__module__)
        if owner.__module__ not in _STOCK_MODULES or function not in _STOCK_MODULES:
            return False
    return True


def _backend_is_plain(tokenizer: Tokenizer, backend: Any) -> bool:
    """Whether ``backend.encode`` is exactly what the wrapper would run for this call: the
    stock wrapper methods, and the backend set as they would set it."""
    if not _stock_encode_path(type(tokenizer)):
        return False
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    try:
        return (
            backend.truncation is None
            and backend.padding is None
            and backend.encode_special_tokens == split
        )
    except AttributeError:  # a backend without these settings: let the wrapper decide
        return False


def partition_offsets(offsets: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Turn a tokenizer's (possibly overlapping or gapped) offsets into a partition of [0, length).

    Args:
        offsets: (T, 2) raw ``(start, end)`` character offsets from the tokenizer (an array or
            a sequence of pairs).
        length: the text's length in characters.
    Returns:
        (T,) int64 starts and (T,) int64 ends, contiguous: the first span starts at 0, the last
        ends at length.
    """
    raw = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    if raw.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # A character shared with the next token goes to the later token; the tail to the last:
    # end_i = min(end_i, start_{i+1}), end_last = length; then ends never go back or past length
    # (a running maximum of the clipped ends), and each span starts where the previous ended.
    ends = np.empty(raw.shape[0], dtype=np.int64)
    np.minimum(raw[:-1, 1], raw[1:, 0], out=ends[:-1])
    ends[-1] = length
    np.minimum(ends, length, out=ends)
    np.maximum(ends, 0, out=ends)
    np.maximum.accumulate(ends, out=ends)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1]
    return starts, ends


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
        token_ids: exact ids to score (case C9); when given they are what is scored, their
            spans index into their own decoding, and with ``text`` too, the ids must decode to
            exactly ``text`` and ``retokenization_matches`` says whether tokenizing ``text``
            reproduces them.
    Returns:
        a ``TokenizedText``.
    Raises:
        TextTokenIdsMismatch: both given, and the ids decode to another text (a verdict about
            the ids would read as one about the text).
        ValueError: neither text nor token_ids; only ``text`` with a slow tokenizer.
    """
    if token_ids is not None:
        ids = [int(i) for i in token_ids]
        decoded, pieces = decoded_pieces(tokenizer, ids)
        if text is not None and decoded != text:
            offset = next(
                (i for i, (a, b) in enumerate(zip(decoded, text, strict=False)) if a != b),
                min(len(decoded), len(text)),
            )
            raise TextTokenIdsMismatch(offset, len(text), len(decoded))
        ends = np.cumsum([len(piece) for piece in pieces], dtype=np.int64)
        starts = np.zeros_like(ends)
        starts[1:] = ends[:-1]
        matches = None if text is None else _encode_ids(tokenizer, text) == ids
        return TokenizedText(np.asarray(ids, dtype=np.int64), decoded, starts, ends, matches)
    if text is None:
        raise ValueError("expected text or token_ids, got neither")
    _require_fast(tokenizer)
    id_array, offsets = encode(tokenizer, text)
    starts, ends = partition_offsets(offsets, len(text))
    return TokenizedText(id_array, text, starts, ends, None)


def _encode_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=False)
    return [int(i) for i in encoding["input_ids"]]


def _require_fast(tokenizer: Tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            "expected a fast tokenizer (character offsets need one), got a slow tokenizer"
        )


def check_tokenizer(
    key_fingerprint: str,
    tokenizer_fingerprint: str,
    key_id: str | None = None,
    *,
    key_model: str | None = None,
    model: str | None = None,
) -> None:
    """Refuse to detect with a tokenizer other than the key's (docs/design.md §2: the key record
    holds the fingerprint of the tokenizer it was made for, and the model's name).

    Only the fingerprints decide: two models that share a tokenizer share its keys.

    Args:
        key_fingerprint: the fingerprint stored in the key record.
        tokenizer_fingerprint: the fingerprint of the tokenizer detection would use (the
            service and CLI compute it with ``sampler.models.tokenizer_fingerprint``).
        key_id: the key's public id, for the message.
        key_model: the name of the model the key was made for, for the message.
        model: the name of the model in use, for the message.
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
        raise TokenizerMismatch(key_fingerprint, tokenizer_fingerprint, key_id, key_model, model)
