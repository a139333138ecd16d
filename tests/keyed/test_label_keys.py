"""``label_keys`` (batched context keys) equals ``label_key`` bit for bit (DESIGN §2: one PRF)."""

from __future__ import annotations

import numpy as np
import pytest

from keyed import SENTINEL, Secret, label_key, label_keys


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
