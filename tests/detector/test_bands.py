"""Coarse evidence bands (``detector.bands``): one band per block of scored tokens."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from detector.bands import BAND_BLOCK, BAND_EDGES, NO_BAND, NUM_BANDS, evidence_bands


def test_every_scored_token_carries_its_blocks_band() -> None:
    # 18 scored tokens, 3 skipped among them: blocks [0, 8) and [8, 18) (the remainder joins)
    skip = np.zeros(21, dtype=np.int8)
    skip[[0, 5, 20]] = [1, 2, 1]
    terms = np.concatenate([np.full(8, 0.5), np.full(10, 3.0)])
    bands = evidence_bands(skip, terms)
    assert bands.dtype == np.int8 and bands.shape == (21,)
    assert bands[[0, 5, 20]].tolist() == [NO_BAND] * 3
    assert bands[skip == 0].tolist() == [0] * 8 + [3] * 10


@pytest.mark.parametrize(
    ("mean", "band"),
    [
        pytest.param(BAND_EDGES[0], 0, id="edge0_is_band0"),
        pytest.param(1.5, 1, id="band1"),
        pytest.param(BAND_EDGES[1] + 1e-9, 2, id="above_edge1"),
        pytest.param(2.5 + 1e-9, 3, id="above_edge2"),
    ],
)
def test_a_blocks_mean_term_picks_its_band(mean: float, band: int) -> None:
    # one token's term can move; the band reads only the block's mean
    terms = np.full(BAND_BLOCK, mean)
    terms[0], terms[1] = mean + 0.4, mean - 0.4
    assert evidence_bands(np.zeros(BAND_BLOCK, np.int8), terms).tolist() == [band] * BAND_BLOCK


def test_few_scored_tokens_are_one_block_and_none_is_empty() -> None:
    assert evidence_bands(np.array([0, 0, 1], np.int8), np.array([9.0, 0.1])).tolist() == [
        3,
        3,
        NO_BAND,
    ]
    assert evidence_bands(np.ones(4, np.int8), np.zeros(0)).tolist() == [NO_BAND] * 4


def test_under_h0_band_rates_match_the_gamma_law() -> None:
    """Under H0 a block's mean of b = 8 Exp(1) terms is Gamma(8, 1/8): the share of blocks in
    each band matches its probability. 20,000 blocks, seed 0; the tolerance is 5 binomial
    standard deviations (a false failure about once in 3 million runs)."""
    rng = np.random.default_rng(0)
    blocks = 20_000
    terms = rng.exponential(size=blocks * BAND_BLOCK)
    bands = evidence_bands(np.zeros(terms.shape, np.int8), terms)[::BAND_BLOCK]
    cdf = stats.gamma.cdf(np.array(BAND_EDGES) * BAND_BLOCK, BAND_BLOCK)
    expected = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    seen = np.bincount(bands, minlength=NUM_BANDS) / blocks
    sd = np.sqrt(expected * (1 - expected) / blocks)
    assert np.all(np.abs(seen - expected) <= 5 * sd + 1e-12), (seen, expected)


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match=r"expected \(2,\) Aaronson terms"):
        evidence_bands(np.zeros(2, np.int8), np.zeros(3))
    with pytest.raises(ValueError, match="block >= 1"):
        evidence_bands(np.zeros(2, np.int8), np.zeros(2), block=0)
