"""Corpus detection (detector/corpus.py): order, per-item errors, worker processes, and the
secret crossing into workers without showing itself."""

from __future__ import annotations

import json
import pickle

import pytest

from detector import DetectOptions, detect
from detector.corpus import CorpusItem, CorpusResult, detect_many
from keyed import KeyedSource
from tests.detector.helpers import fixed_secret, keyed_race_ids


@pytest.fixture(scope="module")
def corpus(human_passages: list[str]) -> list[CorpusItem]:
    secret = fixed_secret("corpus")
    marked = keyed_race_ids(secret, num_new=80, seed=31)
    return [
        CorpusItem("h0", text=human_passages[0]),
        CorpusItem("wm", token_ids=tuple(marked)),
        CorpusItem("bad", token_ids=(1, 10**9)),  # outside the vocabulary: an error result
        CorpusItem("empty", text=""),
        *(CorpusItem(f"h{i}", text=text) for i, text in enumerate(human_passages[1:7], 1)),
    ]


def expected(real_tokenizer, source: KeyedSource, item: CorpusItem):  # type: ignore[no-untyped-def]
    return detect(
        real_tokenizer,
        source,
        text=item.text,
        token_ids=item.token_ids,
        options=DetectOptions(key_id="pmk_c", scores=("li",), spans=True),
    )


def test_detect_many_serial_matches_detect(real_tokenizer, corpus) -> None:  # type: ignore[no-untyped-def]
    source = KeyedSource(fixed_secret("corpus"))
    results = list(
        detect_many(
            real_tokenizer,
            source,
            corpus,
            options=DetectOptions(key_id="pmk_c", scores=("li",), spans=True),
        )
    )
    assert [r.id for r in results] == [item.id for item in corpus]  # input order
    for item, result in zip(corpus, results, strict=True):
        if item.id == "bad":
            assert result.detection is None and "token_ids[1]" in (result.error or "")
            assert result.to_json() == {"id": "bad", "error": result.error}
            continue
        assert result.error is None
        assert result.detection == expected(real_tokenizer, source, item)
        payload = result.to_json()
        assert payload["id"] == item.id and payload["key_id"] == "pmk_c"
        json.dumps(payload, allow_nan=False)
    assert results[1].detection is not None and results[1].detection.verdict == "watermarked"


def test_detect_many_plain_texts_get_index_ids(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    source = KeyedSource(fixed_secret("corpus"))
    results = list(detect_many(real_tokenizer, source, iter(["a b c", "", "d e f g h i"])))
    assert [r.id for r in results] == ["0", "1", "2"]


def test_detect_many_workers_match_serial(real_tokenizer, corpus) -> None:  # type: ignore[no-untyped-def]
    # Two spawned worker processes, chunks of 3 (so chunks interleave across workers): results
    # are identical to the serial run and in input order.
    source = KeyedSource(fixed_secret("corpus"))
    options = DetectOptions(key_id="pmk_c", scores=("li",), spans=True)
    serial = list(detect_many(real_tokenizer, source, corpus, options=options))
    parallel = list(
        detect_many(real_tokenizer, source, iter(corpus), options=options, workers=2, chunk_size=3)
    )
    assert parallel == serial


def test_secret_pickles_by_value_and_stays_hidden() -> None:
    # The worker pool pickles the keyed source into each worker: the secret must round-trip
    # exactly, and no repr of what is sent shows it.
    source = KeyedSource(fixed_secret("pickle"), context_width=3)
    restored = pickle.loads(pickle.dumps(source))
    assert restored == source and restored.secret.reveal() == source.secret.reveal()
    material = source.secret.reveal().hex()
    assert material not in repr(source) and material not in repr(restored)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, r"workers an int in \[1, 256\]"),
        ({"workers": True}, "workers"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"alpha": 2.0}, "alpha"),
        ({"scores": ("nope",)}, "expected scores from"),
    ],
)
def test_detect_many_rejects_bad_options_before_reading(real_tokenizer, kwargs, message) -> None:  # type: ignore[no-untyped-def]
    def never_read():  # type: ignore[no-untyped-def]
        raise AssertionError("items were read before the options were checked")
        yield  # pragma: no cover

    with pytest.raises(ValueError, match=message):
        options = {k: kwargs.pop(k) for k in ("alpha", "scores") if k in kwargs}
        detect_many(
            real_tokenizer,
            KeyedSource(fixed_secret("x")),
            never_read(),
            options=DetectOptions(**options),
            **kwargs,
        )


def test_detect_many_rejects_other_item_types(real_tokenizer) -> None:  # type: ignore[no-untyped-def]
    results = detect_many(real_tokenizer, KeyedSource(fixed_secret("x")), [b"bytes"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="strings or CorpusItem"):
        list(results)


def test_corpus_result_needs_exactly_one_outcome() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        CorpusResult("x", None, None)
