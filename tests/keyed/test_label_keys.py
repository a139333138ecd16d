"""Batched context keys equal ``label_key`` bit for bit, and ``pivot_array`` the tensor path's
pivots (docs/design.md §2: one PRF). ``label_keys`` and ``pivots`` are the test references
(``tests/keyed/reference.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from keyed import SENTINEL, Secret, label_key, label_key_words, pivot_array
from tests.keyed.reference import label_keys, pivots


def test_label_keys_equals_label_key() -> None:
    rng = np.random.default_rng(9)
    secret = Secret(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
    labels = [tuple(int(t) for t in rng.integers(0, 2**32, m)) for m in (1, 4, 8, 64) * 50]
    labels += [(0, 0, 0, 0), (SENTINEL,) * 4, (SENTINEL, SENTINEL, 7), (), (49_151,)]
    assert label_keys(secret, labels) == [label_key(secret, label) for label in labels]
    assert label_keys(secret, []) == []


@pytest.mark.parametrize("bad", [(1, 2**32), (-1, 2)])
def test_label_keys_rejects_out_of_range_ids(bad: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"label ids in \[0, 2\^32\)"):
        label_keys(Secret(bytes(32)), [(1, 2, 3), bad])


@pytest.mark.parametrize("m", [1, 2, 4, 8, 64])
def test_label_key_words_equals_label_key(m: int) -> None:
    rng = np.random.default_rng(m)
    secret = Secret(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
    labels = rng.integers(0, 2**32, size=(300, m), dtype=np.int64)
    labels[0] = 0
    labels[1] = SENTINEL
    words = label_key_words(secret, labels)
    assert words.shape == (300, 2) and words.dtype == np.int64
    assert [tuple(w) for w in words.tolist()] == [label_key(secret, tuple(row)) for row in labels]
    assert label_key_words(secret, np.zeros((0, m), np.int64)).shape == (0, 2)


@pytest.mark.parametrize("bad", [[[1, 2**32]], [[-1, 2]], [1, 2]])
def test_label_key_words_rejects_bad_labels(bad: list[object]) -> None:
    with pytest.raises(ValueError, match=r"label ids in \[0, 2\^32\)|\(N, m\) array"):
        label_key_words(Secret(bytes(32)), np.array(bad, dtype=np.int64))


def test_pivot_array_equals_pivots_bit_for_bit() -> None:
    rng = np.random.default_rng(77)
    keys = rng.integers(0, 2**32, size=(5000, 2), dtype=np.int64)
    keys[0] = (0, 0)
    keys[1] = (2**32 - 1, 2**32 - 1)
    tokens = rng.integers(0, 2**31, size=5000, dtype=np.int64)
    fast = pivot_array(keys, tokens)
    reference = pivots(torch.from_numpy(keys), torch.from_numpy(tokens)).numpy()
    assert fast.dtype == np.float64 and np.array_equal(
        fast.view(np.int64), reference.view(np.int64)
    )
    assert ((fast > 0) & (fast < 1)).all()
    with pytest.raises(ValueError, match=r"keys \(T, 2\)"):
        pivot_array(keys[:, :1], tokens)
