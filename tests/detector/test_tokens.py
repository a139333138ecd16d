"""Token ids <-> character spans (detector/tokens.py): the partition convention on both paths;
the tokenizer-fingerprint check (``check_tokenizer``, ``TokenizerMismatch``)."""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from detector.errors import DetectorError, TextTokenIdsMismatch, TokenizerMismatch
from detector.tokens import check_tokenizer, decoded_pieces, partition_offsets, tokenize


@pytest.mark.parametrize(
    ("offsets", "length", "expected"),
    [
        ([(0, 3), (3, 5)], 5, [(0, 3), (3, 5)]),
        # byte-level BPE: " 🎉" split over 3 tokens with overlapping offsets (real SmolLM2 case)
        ([(0, 1), (1, 3), (2, 3), (2, 3)], 3, [(0, 1), (1, 2), (2, 2), (2, 3)]),
        # trimmed whitespace (a gap) goes to the next token, the tail to the last
        ([(0, 3), (4, 7)], 9, [(0, 3), (3, 9)]),
        ([(1, 3)], 3, [(0, 3)]),
        ([], 0, []),
    ],
    ids=["plain", "split_character", "gap_and_tail", "leading_gap", "empty"],
)
def test_partition_offsets(offsets, length: int, expected) -> None:  # type: ignore[no-untyped-def]
    starts, ends = partition_offsets(offsets, length)
    assert (starts.dtype, ends.dtype) == (np.int64, np.int64)
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == expected


def test_text_and_id_paths_agree_on_human_text(real_tokenizer, human_passages) -> None:  # type: ignore[no-untyped-def]
    # When re-tokenizing reproduces the ids (all 227 passages do), the id path's spans into the
    # decoded text equal the text path's spans into the input.
    for text in human_passages[:40]:
        ids = real_tokenizer(text, add_special_tokens=False)["input_ids"]
        from_ids = tokenize(real_tokenizer, text, ids)
        from_text = tokenize(real_tokenizer, text, None)
        assert from_ids.retokenization_matches is True
        assert from_ids.text == text
        assert from_ids.spans == from_text.spans


@pytest.mark.parametrize(
    ("text", "offset"),
    [
        pytest.param("Hello, world!", 7, id="differs_inside"),
        pytest.param("Hello, the", 10, id="decoding_is_longer"),
        pytest.param("Hello, there and more", 12, id="text_is_longer"),
        pytest.param("", 0, id="empty_text"),
    ],
)
def test_text_that_the_ids_do_not_decode_to_is_refused(
    real_tokenizer: Any, text: str, offset: int
) -> None:
    ids = real_tokenizer("Hello, there", add_special_tokens=False)["input_ids"]
    with pytest.raises(TextTokenIdsMismatch) as raised:
        tokenize(real_tokenizer, text, ids)
    assert (raised.value.offset, raised.value.text_length) == (offset, len(text))
    assert raised.value.decoded_length == len("Hello, there")
    assert isinstance(raised.value, DetectorError)
    assert "text and token_ids disagree" in str(raised.value)
    assert pickle.loads(pickle.dumps(raised.value)).offset == offset  # crosses processes
    assert tokenize(real_tokenizer, "Hello, there", ids).retokenization_matches is True


def test_split_characters_go_to_the_completing_token(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = "a 🎉 b 中文"
    ids = real_tokenizer(text, add_special_tokens=False)["input_ids"]
    for tokenized in (tokenize(real_tokenizer, text, None), tokenize(real_tokenizer, None, ids)):
        pieces = [tokenized.piece(i) for i in range(len(tokenized.ids))]
        assert "".join(pieces) == text
        assert "🎉" in pieces  # whole, in one token
        assert all("\ufffd" not in piece for piece in pieces)


class WindowSensitiveTokenizer:
    """A toy sentencepiece-like decoder: "▁" is a space and leading spaces are dropped, so a
    window that starts at "▁" decodes short and the windowed pieces miss a space (the check
    catches it and the cumulative decode takes over)."""

    is_fast = False

    def __init__(self) -> None:
        self.vocab = {0: "▁a", 1: "▁bb", 2: "c", 3: "▁"}
        self.all_special_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.vocab)

    def __call__(self, text: str, **_: Any) -> Mapping[str, Any]:
        raise AssertionError("not used")

    def decode(self, token_ids: Sequence[int], **_: Any) -> str:
        return "".join(self.vocab[i] for i in token_ids).replace("▁", " ").lstrip(" ")


def test_decoded_pieces_fall_back_to_cumulative_decoding(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import detector.tokens as tokens_module

    calls: list[int] = []
    cumulative = tokens_module._cumulative_pieces

    def spy(*args: Any) -> list[str]:
        calls.append(1)
        return cumulative(*args)

    monkeypatch.setattr(tokens_module, "_cumulative_pieces", spy)
    tokenizer = WindowSensitiveTokenizer()
    text, pieces = decoded_pieces(tokenizer, [2, 3, 0, 1])  # type: ignore[arg-type]
    assert calls, "the windowed decode should have disagreed and fallen back"
    assert text == "c  a bb"
    assert pieces == ["c", " ", " a", " bb"]


def test_slow_tokenizer_needs_ids(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="fast tokenizer"):
        tokenize(WindowSensitiveTokenizer(), "abc", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="text or token_ids"):
        tokenize(real_tokenizer, None, None)


# --- diagnostics: the key's tokenizer --------------------------------------------------------


def test_check_tokenizer_accepts_the_same_fingerprint() -> None:
    check_tokenizer("sha256:0123456789abcdef", "sha256:0123456789abcdef", "pmk_0123456789abcdef")


def test_check_tokenizer_raises_tokenizer_mismatch() -> None:
    with pytest.raises(TokenizerMismatch) as caught:
        check_tokenizer("sha256:aaaa", "sha256:bbbb", "pmk_0123456789abcdef")
    error = caught.value
    assert isinstance(error, DetectorError) and not isinstance(error, ValueError)
    assert (error.key_fingerprint, error.tokenizer_fingerprint) == ("sha256:aaaa", "sha256:bbbb")
    message = str(error)
    assert "pmk_0123456789abcdef" in message and "sha256:aaaa" in message
    assert "sha256:bbbb" in message
    # Domain errors cross process boundaries (corpus workers): they must pickle.
    restored = pickle.loads(pickle.dumps(error))
    assert type(restored) is TokenizerMismatch and str(restored) == message


def test_tokenizer_mismatch_names_both_models_and_the_fingerprints_prefixes() -> None:
    key_fp, served_fp = "sha256:ab12cd34ef567890", "sha256:cd34ef5678901234"
    with pytest.raises(TokenizerMismatch) as caught:
        check_tokenizer(key_fp, served_fp, "pmk_0123456789abcdef", key_model="A", model="B")
    message = str(caught.value)
    assert message == (
        "key pmk_0123456789abcdef was made for model 'A' (tokenizer sha256:ab12cd34…) and "
        "cannot be used with model 'B' (tokenizer sha256:cd34ef56…): use it with 'A', or a key "
        "made for 'B'"
    )
    restored = pickle.loads(pickle.dumps(caught.value))
    assert (restored.key_model, restored.model, str(restored)) == ("A", "B", message)
    unnamed = str(TokenizerMismatch(key_fp, served_fp, None, None, "B"))
    assert unnamed.startswith("the key was made for an unnamed model (tokenizer sha256:ab12cd34…)")
    assert unnamed.endswith("use it with its model, or a key made for 'B'")


@pytest.mark.parametrize("bad", ["", None, 3])
def test_check_tokenizer_rejects_non_fingerprints(bad: object) -> None:
    with pytest.raises(ValueError, match="fingerprint a non-empty string"):
        check_tokenizer(bad, "sha256:bbbb")  # type: ignore[arg-type]


def test_backend_encode_equals_the_wrapper_call(real_tokenizer, human_passages) -> None:  # type: ignore[no-untyped-def]
    """``encode`` calls the Rust backend directly; it must give what the transformers wrapper
    gives: human text, special-token strings written in the text, emoji, CR LF, empty."""
    from detector.tokens import _backend_is_plain, encode

    assert _backend_is_plain(real_tokenizer, real_tokenizer.backend_tokenizer)  # the shortcut
    texts = [*human_passages[:40], "<|im_start|>user\nhi<|im_end|>", "a 🎉 b 中文\r\n", "", " "]
    for text in texts:
        ids, offsets = encode(real_tokenizer, text)
        wrapped = real_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        assert ids.tolist() == wrapped["input_ids"]
        assert [tuple(pair) for pair in offsets.tolist()] == list(wrapped["offset_mapping"])


def test_encode_leaves_a_configured_backend_to_the_wrapper(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A backend left with truncation on (the wrapper turns it off on each call) is not called
    directly: the text is not cut."""
    import copy

    from detector.tokens import encode

    tokenizer = copy.deepcopy(real_tokenizer)
    tokenizer.backend_tokenizer.enable_truncation(max_length=3)
    text = "one two three four five six"
    ids, _ = encode(tokenizer, text)
    assert len(ids) > 3
    assert ids.tolist() == real_tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_subclass_with_its_own_encode_step_goes_through_its_wrapper() -> None:
    """A tokenizer class that overrides a step of the wrapper's path to the backend (as
    CodeLlama's infilling tokenizer does) never takes the shortcut."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from detector.tokens import _stock_encode_path

    class Infilling(TokenizersBackend):  # type: ignore[misc]
        def _encode_plus(self, *args: Any, **kwargs: Any) -> Any:
            return super()._encode_plus(*args, **kwargs)

    class Translating(TokenizersBackend):  # type: ignore[misc]  # NLLB-style input mode hook
        def _switch_to_input_mode(self) -> None:
            pass

    assert _stock_encode_path(TokenizersBackend)
    assert not _stock_encode_path(Infilling)
    assert not _stock_encode_path(Translating)


def test_tokenized_text_owns_integer_columns() -> None:
    """The columns are the object's own read-only int64 copies; floats and ragged spans are
    refused with the field named."""
    from detector.tokens import TokenizedText

    ids = np.array([5, 6, 7])
    text = TokenizedText(ids, "abc", np.arange(3), np.arange(1, 4), None)
    assert ids.flags.writeable  # the caller's array is left alone
    assert not text.ids.flags.writeable and text.ids.dtype == np.int64
    assert text.spans == [(0, 1), (1, 2), (2, 3)] and text.piece(1) == "b"
    with pytest.raises(ValueError, match="ids to be integers"):
        TokenizedText(np.array([1.9, 2.7]), "ab", np.arange(2), np.arange(1, 3), None)
    with pytest.raises(ValueError, match="spans of shape"):
        TokenizedText.from_spans([1, 2], "ab", [(0, 1, 1, 2)])
    with pytest.raises(ValueError, match="ends of shape"):
        TokenizedText(ids, "abc", np.arange(3), np.arange(2), None)
    assert TokenizedText.from_spans([], "", []).ids.shape == (0,)
