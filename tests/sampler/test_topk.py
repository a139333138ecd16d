"""The decoder's top-k: ``sampler.topk.top_k`` is ``torch.topk``, with or without its kernel."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import torch

from sampler import compiled, topk


@pytest.fixture
def kernel() -> topk.Kernel:
    assert topk.warm_up(), "numba is a dependency: the kernel must load and pass its check"
    loaded = topk._loaded()
    assert loaded is not None
    return loaded


def rows(seed: int, shape: tuple[int, int]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k", [1, 2, 50, 256])
def test_distinct_rows_are_computed_by_the_kernel_as_torch_does(kernel, k):
    x = rows(k, (4, 49152))
    values, indices = np.empty((4, k), np.float32), np.empty((4, k), np.int64)
    assert kernel(x.numpy(), values, indices)  # distinct values: the kernel's own answer
    expected = torch.topk(x, k, dim=-1)
    assert np.array_equal(values, expected.values.numpy())
    assert np.array_equal(indices, expected.indices.numpy())


def _boundary_tie(x: torch.Tensor, top: Any) -> None:
    x[2, int(top.indices[2, -1]) ^ 1] = top.values[2, -1]  # another entry equals the k-th


def _tie_inside(x: torch.Tensor, top: Any) -> None:
    x[1, int(top.indices[1, 3])] = top.values[1, 2]


def _nan(x: torch.Tensor, top: Any) -> None:
    x[0, 5] = torch.nan


def _minus_inf_ties(x: torch.Tensor, top: Any) -> None:
    x[3, 100:] = -torch.inf  # fewer finite values than k: the rest are tied


@pytest.mark.parametrize("spoil", [_boundary_tie, _tie_inside, _nan, _minus_inf_ties])
def test_rows_whose_top_k_is_not_unique_are_left_to_torch(kernel, spoil):
    x = rows(7, (4, 4096))
    spoil(x, torch.topk(x, 200, dim=-1))
    values, indices = np.empty((4, 200), np.float32), np.empty((4, 200), np.int64)
    assert not kernel(x.numpy(), values, indices)
    got, expected = topk.top_k(x, 200), torch.topk(x, 200, dim=-1)  # torch's ties
    assert torch.equal(got[1], expected.indices)
    assert torch.equal(got[0].nan_to_num(), expected.values.nan_to_num())


def test_top_k_is_torch_topk_on_every_input(kernel):
    """Tied grids, other dtypes, a non-contiguous view and k above the kernel's limit: the
    same values and indices as ``torch.topk`` (the kernel runs or torch does)."""
    generator = torch.Generator().manual_seed(1)
    grid = (torch.randint(-40, 41, (16, 3000), generator=generator) / 8).float()
    cases = [
        (rows(2, (8, 49152)), 50),
        (grid, 50),
        (rows(3, (8, 1000)).double(), 50),
        (rows(4, (8, 1000)).bfloat16(), 50),
        (rows(5, (1000, 8)).T, 50),
        (rows(6, (2, 1000)), 300),
    ]
    for x, k in cases:
        got, expected = topk.top_k(x, k), torch.topk(x, k, dim=-1)
        assert torch.equal(got[0], expected.values) and torch.equal(got[1], expected.indices)


def test_a_kernel_that_disagrees_with_torch_is_not_used(monkeypatch, caplog):
    def off_by_one(x, values, indices):  # type: ignore[no-untyped-def]
        result = torch.topk(torch.from_numpy(x), values.shape[1], dim=-1)
        values[:] = result.values.numpy()
        indices[:] = result.indices.numpy()
        indices[0, 0] += 1
        return True

    fake = types.SimpleNamespace(top_k_distinct_into=off_by_one)
    monkeypatch.setattr(compiled, "module", lambda: fake)
    with caplog.at_level("WARNING", logger="sampler.compiled"):
        assert topk._kernel.__wrapped__() is None  # type: ignore[attr-defined]
    assert "compiled top-k disagrees with torch" in caplog.text


class _NotLoaded:
    """A kernel loader that was never warmed up (and must not be called)."""

    def cache_info(self) -> Any:
        return types.SimpleNamespace(currsize=0)

    def __call__(self) -> None:
        raise AssertionError("top_k loaded the kernel itself")


def test_the_kernel_is_used_only_once_loaded(monkeypatch):
    """Before ``warm_up`` ``top_k`` never loads the kernel (a first generation must not pay
    for a compile): it answers with torch."""
    monkeypatch.setattr(topk, "_kernel", _NotLoaded())
    x = rows(8, (2, 4096))
    got, expected = topk.top_k(x, 50), torch.topk(x, 50, dim=-1)
    assert torch.equal(got[1], expected.indices)


@pytest.mark.parametrize("k", [1, 5, 50])
def test_the_kernel_accepts_exactly_the_rows_whose_top_k_is_unique(kernel, k):
    """On coarse grids (multiples of 1/4, 65 to 1,601 levels for 300 entries: ties in most
    rows, not all) and on -inf tails, row by row: the kernel answers True exactly when the k
    values are distinct and above the rest (checked by sorting), and then answers what
    torch.topk does."""
    generator = torch.Generator().manual_seed(k)
    levels = torch.tensor([32, 200, 800])[torch.arange(400) % 3, None]
    x = (torch.rand((400, 300), generator=generator) * (2 * levels + 1)).floor() - levels
    x = x / 4
    x[::9, 60:] = -torch.inf
    accepted = 0
    for row in x:
        ordered = row.sort(descending=True).values
        unique = bool((ordered[: k - 1] > ordered[1:k]).all()) and (
            k == len(row) or bool(ordered[k - 1] > ordered[k])
        )
        values, indices = np.empty((1, k), np.float32), np.empty((1, k), np.int64)
        assert kernel(row[None].numpy(), values, indices) == unique
        if unique:
            accepted += 1
            expected = torch.topk(row[None], k, dim=-1)
            assert np.array_equal(values, expected.values.numpy())
            assert np.array_equal(indices, expected.indices.numpy())
    assert accepted > 0  # the grid leaves some rows unique, so both answers are exercised


def _unique_top(row: torch.Tensor, k: int) -> bool:
    ordered = row.sort(descending=True).values
    return bool((ordered[: k - 1] > ordered[1:k]).all()) and bool(ordered[k - 1] > ordered[k])


@pytest.mark.parametrize("k", [1, 50])
def test_long_rows_skip_blocks_without_missing_a_tie(kernel, k):
    """49,152-wide rows (768 blocks of 64, most passed over by the kernel): coarse grids whose
    k-th value ties an entry of another block in some rows, a +0.0 k-th value tied by a -0.0
    elsewhere, a copy of the k-th value planted in another block, an ascending row (every
    candidate in the last blocks) and a row whose width is not a multiple of the block: the
    kernel answers True exactly when the top k is unique, and then what torch.topk does."""
    generator = torch.Generator().manual_seed(10 + k)
    width = 49152
    cases = []
    for levels in (3000, 30000, 300000):
        grid = (torch.rand((6, width), generator=generator) * (2 * levels + 1)).floor() - levels
        cases.extend(grid / 4)
    zeros = -1 - torch.rand(width, generator=generator)
    zeros[torch.arange(k - 1) * 700] = torch.arange(k - 1, 0, -1).float()
    zeros[40000], zeros[9] = 0.0, -0.0
    cases.append(zeros)
    planted = torch.randn(width, generator=generator)
    top = torch.topk(planted, k)
    planted[(int(top.indices[-1]) + width // 2) % width] = top.values[-1]
    cases.append(planted)
    cases.append(torch.arange(width).float())
    cases.append(torch.randn(width - 37, generator=generator))
    answers = []
    for row in cases:
        values, indices = np.empty((1, k), np.float32), np.empty((1, k), np.int64)
        got = kernel(row[None].contiguous().numpy(), values, indices)
        assert got == _unique_top(row, k)
        answers.append(got)
        if got:
            expected = torch.topk(row[None], k, dim=-1)
            assert np.array_equal(values, expected.values.numpy())
            assert np.array_equal(indices, expected.indices.numpy())
    assert not answers[-4] and not answers[-3]  # the signed zeros and the planted copy tie
    assert answers[-2] and answers[-1]
    assert any(answers[:18]) and not all(answers[:18])
