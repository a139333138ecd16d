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
    uniforms = torch.rand((2000, 50), generator=generator, dtype=torch.float64).clamp_(min=1e-300)
    got = race.race_winner_of_uniforms(logp, tokens, uniforms)
    assert torch.equal(got, race.race_winner(logp, tokens, -torch.log(uniforms)))
    assert int(got[7]) == -1


def test_a_row_is_the_same_bits_alone_and_in_a_batch(kernels):
    """What drafter invariance needs of the compiled path: a context's processed law and race
    do not depend on the rows beside it."""
    logits = 3 * torch.randn((9, 4096), generator=torch.Generator().manual_seed(3))
    setting = Processing(0.8, 50, 0.9)
    together = process(logits, setting)
    uniforms = torch.rand((9, 50), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    won = race.race_winner_of_uniforms(together.logp, together.tokens, uniforms)
    for i in range(9):
        alone = process(logits[i : i + 1], setting)
        assert torch.equal(alone.logp, together.logp[i : i + 1])
        assert torch.equal(alone.tokens, together.tokens[i : i + 1])
        one = race.race_winner_of_uniforms(alone.logp, alone.tokens, uniforms[i : i + 1])
        assert int(one[0]) == won[i]


def test_process_takes_the_compiled_path_on_the_cpu(kernels, monkeypatch):
    """The fast path is the one that runs (not a silent torch fallback): with the kernel
    replaced by a marker, ``process`` returns what the kernel wrote."""

    def marker(values, temperature, top_p, out):  # type: ignore[no-untyped-def]
        out[:] = -1.5

    monkeypatch.setattr(processing, "_logp_kernel", lambda: marker)
    support = process(torch.randn((2, 100)), Processing(1.0, 10, 1.0))
    assert (support.logp == -1.5).all()


def test_the_race_takes_the_compiled_path_on_the_cpu(kernels, monkeypatch):
    """As for ``process``: with the kernel replaced by a marker, ``race_winner_of_uniforms``
    returns what the kernel wrote (the fast path is not a silent torch fallback)."""

    def marker(logp, tokens, uniforms, winners):  # type: ignore[no-untyped-def]
        winners[:] = 777

    monkeypatch.setattr(race, "_race_kernel", lambda: marker)
    logp = torch.log_softmax(torch.randn((3, 5), dtype=torch.float64), -1)
    uniforms = torch.full((3, 5), 0.5, dtype=torch.float64)
    won = race.race_winner_of_uniforms(logp, torch.arange(15).reshape(3, 5), uniforms)
    assert won.tolist() == [777, 777, 777]


def test_a_tied_race_goes_to_the_first_slot_as_in_torch(kernels):
    logp = torch.log(torch.tensor([[0.25, 0.25, 0.5], [0.5, 0.25, 0.25]], dtype=torch.float64))
    clocks = torch.tensor([[1.0, 1.0, 2.0], [2.0, 1.0, 1.0]], dtype=torch.float64)  # all tied
    tokens = torch.tensor([[10, 11, 12], [20, 21, 22]])
    uniforms = torch.exp(-clocks)  # exp(-1), exp(-2): ln(-ln U) gives back 0 and ln 2 exactly
    assert torch.equal(-torch.log(uniforms), clocks)
    assert race.race_winner_of_uniforms(logp, tokens, uniforms).tolist() == [10, 20]
    assert race.race_winner(logp, tokens, clocks).tolist() == [10, 20]


def test_top_p_keeps_the_slots_whose_better_mass_is_below_p(kernels):
    """Probabilities 0.5, 0.25, 0.125, 0.125 (exact in binary): top-p 0.75 keeps two slots
    (mass before the third is exactly 0.75, not below), 0.7501 three; -inf slots stay out."""
    values = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125, 0.0]], dtype=torch.float64))
    for top_p, kept in ((0.75, 2), (0.7501, 3), (0.5, 1), (1.0, 4)):
        got = np.empty((1, 5), dtype=np.float64)
        kernels[0](values.numpy(), 1.0, top_p, got)
        assert int(np.isfinite(got).sum()) == kept, top_p
        assert abs(np.exp(got[np.isfinite(got)]).sum() - 1) < 1e-15


def test_an_integer_temperature_gives_the_float_temperature_law(kernels):
    """A temperature or top-p given as an int (JSON ``1``) reaches the kernel as a float: the
    same support and bits as 1.0 (no separately compiled int variant to disagree)."""
    logits = torch.randn((2, 300), generator=torch.Generator().manual_seed(5))
    a = process(logits, Processing(1, 50, 1))  # type: ignore[arg-type]
    b = process(logits, Processing(1.0, 50, 1.0))
    assert torch.equal(a.logp, b.logp) and torch.equal(a.tokens, b.tokens)


def test_a_kernel_that_disagrees_with_torch_is_not_used(monkeypatch, caplog):
    def wrong_norm(values, temperature, top_p, out):  # type: ignore[no-untyped-def]
        out[:] = values / temperature  # no log-softmax

    def last_slot(logp, tokens, uniforms, winners):  # type: ignore[no-untyped-def]
        winners[:] = tokens[:, -1]

    fake = types.SimpleNamespace(
        support_logp_into=wrong_norm, race_winners_of_uniforms_into=last_slot
    )
    monkeypatch.setattr(compiled, "module", lambda: fake)
    with caplog.at_level("WARNING", logger="sampler.compiled"):
        assert (
            compiled.checked("log-softmax", processing._get_logp, processing._logp_agrees) is None
        )
        assert compiled.checked("race", race._get_race, race._race_agrees) is None
    assert "compiled log-softmax disagrees" in caplog.text
    assert "compiled race disagrees" in caplog.text


def test_without_numba_the_torch_paths_run(monkeypatch):
    monkeypatch.setattr(compiled, "module", lambda: None)
    assert compiled.checked("log-softmax", processing._get_logp, processing._logp_agrees) is None
    assert compiled.checked("race", race._get_race, race._race_agrees) is None


def test_the_decision_is_made_once_for_every_thread(monkeypatch):
    """``once`` is single-flight: 8 threads asking at once run the check once and all get its
    answer, and a later call does not run it again."""
    import threading

    monkeypatch.setattr(compiled, "_decided", {})
    calls = []
    gate = threading.Barrier(8)

    def agrees(kernel):  # type: ignore[no-untyped-def]
        calls.append(kernel)
        return True

    answers = []

    def ask() -> None:
        gate.wait()
        answers.append(
            compiled.once("probe", lambda module: module.race_winners_of_uniforms_into, agrees)
        )

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(answers) == 8 and len(set(map(id, answers))) == 1
    compiled.once("probe", lambda module: module.race_winners_of_uniforms_into, agrees)
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("width", "drafts"),
    [(1, []), (3, []), (1, [[11], [12], [13]]), (3, [[11], [12]]), (2, [[11, 14], [12]])],
    ids=["root_alone", "root_alone_longer", "chain", "chain_longer", "branching"],
)
def test_a_chain_tree_is_verified_as_the_causal_extend(target, width, drafts):
    """``loop.verify_tree``'s shortcut: a chain (the root alone, or one draft per level) gives
    the bits of the masked forward (``tree_inputs``) and leaves the cache where that forward
    leaves it, after keeping a path too; a branching tree takes the masked forward. On the
    transformers backend (the gguf backend: the decoder tests of ``test_gguf_target``)."""
    from sampler.loop import tree_inputs, verify_tree
    from sampler.targets.transformers import open_cache
    from sampler.tree import DraftTree

    prompt = [(13 * i + 5) % target.config.vocab_size for i in range(6 + width)]
    short, masked = open_cache(target), open_cache(target)
    short.extend(prompt[:-1])
    masked.extend(prompt[:-1])
    tree = DraftTree(prompt[-1], 2)
    parents = [0]
    for level in drafts:
        tree.add_drafts(parents[0], level)
        parents = tree.level(len(tree.levels) - 1)
    assert tree.is_chain() == all(len(level) == 1 for level in drafts)
    base = len(prompt) - 1
    extended: list[list[int]] = []
    extend = short.extend
    short.extend = lambda tokens: extended.append(tokens) or extend(tokens)  # type: ignore[method-assign]
    got = verify_tree(short, tree, base)
    short.extend = extend  # type: ignore[method-assign]
    assert extended == ([[n.token for n in tree.nodes]] if tree.is_chain() else [])
    want = masked.forward(*tree_inputs(tree, base), base)
    assert torch.equal(got, want) and short.cached == masked.cached == base + len(tree)
    path = [base + i for i in range(min(len(tree), 2))]  # the root and its first child
    short.keep(base, path)
    masked.keep(base, path)
    assert torch.equal(short.extend([7]), masked.extend([7]))
