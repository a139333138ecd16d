"""The compiled log-softmax and race (``sampler.compiled``): the torch paths' law, one fixed
path per process, rows independent of the batch around them."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from sampler import compiled, processing, race
from sampler.processing import Processing, process


@pytest.fixture
def kernels() -> tuple[processing.LogpKernel, race.RaceKernel]:
    logp, winners = processing._logp_kernel(), race._race_kernel()
    assert logp is not None and winners is not None, "numba is a dependency: both must load"
    return logp, winners


def sorted_rows(seed: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    x = 4 * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return x.sort(dim=-1, descending=True).values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.95), (1.3, 0.5)])
def test_the_compiled_log_softmax_is_the_torch_law(kernels, dtype, temperature, top_p):
    """Same support slot for slot, log-probabilities within 1e-12 (only the last bits may
    differ: another exp and summation order), on 200 rows of 50 slots with -inf tails."""
    x = sorted_rows(1, (200, 50), dtype)
    x[::7, 30:] = -torch.inf
    x[13] = -torch.inf
    got = np.empty(x.shape, dtype=np.float64)
    kernels[0](x.numpy(), temperature, top_p, got)
    expected = processing._torch_logp(x.double(), temperature, top_p).numpy()
    assert np.array_equal(np.isneginf(got), np.isneginf(expected))
    finite = np.isfinite(expected)
    assert np.abs(got[finite] - expected[finite]).max() < 1e-12
    assert np.isneginf(got[13]).all()  # an empty row stays empty


def test_the_compiled_race_is_the_torch_race(kernels):
    """Winners equal on 2,000 random rows (a near-tie within 1e-12 has probability ~1e-9)."""
    generator = torch.Generator().manual_seed(2)
    logp = torch.log_softmax(2 * torch.randn((2000, 50), generator=generator), -1).double()
    logp[::11, 25:] = -torch.inf
    logp[7] = -torch.inf
    tokens = torch.randint(0, 49152, (2000, 50), generator=generator)
    clocks = torch.empty((2000, 50), dtype=torch.float64).exponential_(generator=generator)
    got = race.race_winner(logp, tokens, clocks)
    assert torch.equal(got, race._torch_race_winner(logp, tokens, clocks))
    assert int(got[7]) == -1


def test_a_row_is_the_same_bits_alone_and_in_a_batch(kernels):
    """What drafter invariance needs of the compiled path: a context's processed law and race
    do not depend on the rows beside it."""
    logits = 3 * torch.randn((9, 4096), generator=torch.Generator().manual_seed(3))
    setting = Processing(0.8, 50, 0.9)
    together = process(logits, setting)
    clocks = torch.empty((9, 50), dtype=torch.float64).exponential_(
        generator=torch.Generator().manual_seed(4)
    )
    won = race.race_winner(together.logp, together.tokens, clocks)
    for i in range(9):
        alone = process(logits[i : i + 1], setting)
        assert torch.equal(alone.logp, together.logp[i : i + 1])
        assert torch.equal(alone.tokens, together.tokens[i : i + 1])
        assert int(race.race_winner(alone.logp, alone.tokens, clocks[i : i + 1])[0]) == won[i]


def test_process_takes_the_compiled_path_on_the_cpu(kernels, monkeypatch):
    """The fast path is the one that runs (not a silent torch fallback): with the kernel
    replaced by a marker, ``process`` returns what the kernel wrote."""

    def marker(values, temperature, top_p, out):  # type: ignore[no-untyped-def]
        out[:] = -1.5

    monkeypatch.setattr(processing, "_logp_kernel", lambda: marker)
    support = process(torch.randn((2, 100)), Processing(1.0, 10, 1.0))
    assert (support.logp == -1.5).all()


def test_a_kernel_that_disagrees_with_torch_is_not_used(monkeypatch, caplog):
    def wrong_norm(values, temperature, top_p, out):  # type: ignore[no-untyped-def]
        out[:] = values / temperature  # no log-softmax

    def last_slot(logp, tokens, clocks, winners):  # type: ignore[no-untyped-def]
        winners[:] = tokens[:, -1]

    fake = types.SimpleNamespace(support_logp_into=wrong_norm, race_winners_into=last_slot)
    monkeypatch.setattr(compiled, "module", lambda: fake)
    with caplog.at_level("WARNING", logger="sampler.compiled"):
        assert processing._logp_kernel.__wrapped__() is None  # type: ignore[attr-defined]
        assert race._race_kernel.__wrapped__() is None  # type: ignore[attr-defined]
    assert "compiled log-softmax disagrees" in caplog.text
    assert "compiled race disagrees" in caplog.text


def test_without_numba_the_torch_paths_run(monkeypatch):
    monkeypatch.setattr(compiled, "module", lambda: None)
    assert processing._logp_kernel.__wrapped__() is None  # type: ignore[attr-defined]
    assert race._race_kernel.__wrapped__() is None  # type: ignore[attr-defined]
