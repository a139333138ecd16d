"""The row-invariant runner (``sampler.targets.cpu_bf16``; docs/design.md §3 Numerics).

- float64 weights: the runner's Llama forward equals transformers' (tree mask, GQA, RoPE,
  tied or untied head) to 1e-10, so the architecture is implemented right;
- bfloat16 weights: a context's logits are the same bits whether its token is evaluated alone,
  inside a draft tree or beside other sequences; hence MPFR equals BASIC-UWM (Thm. 5.1) and a
  batched request equals the request served alone, exactly, in reduced precision.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from keyed import KeyedSource, Secret
from sampler.models import load_model
from sampler.targets.cpu_bf16 import (
    InvariantCache,
    InvariantLlama,
    RowInvarianceError,
)
from sampler.targets.transformers import CachedLM, forward_many, open_cache
from tests.sampler.backend_contract import (
    SPECULATIVE_CONFIGS,
    assert_batched_equals_solo,
    assert_speculative_equals_basic_uwm,
)
from tests.sampler.conftest import VOCAB, tiny_llama
from tests.tiny_models import tied_llama


def _tied_llama() -> LlamaForCausalLM:
    return tied_llama(VOCAB)


def _tree_inputs(cached: int) -> tuple[list[int], list[int], torch.Tensor]:
    """A 5-node tree: root, two children, a grandchild under each child."""
    tokens, depths, parents = [7, 3, 9, 12, 4], [0, 1, 1, 2, 2], [-1, 0, 0, 1, 2]
    visible = torch.zeros((5, cached + 5), dtype=torch.bool)
    visible[:, :cached] = True
    for i in range(5):
        j = i
        while j >= 0:
            visible[i, cached + j] = True
            j = parents[j]
    return tokens, depths, visible


TOL = 1e-5
"""transformers runs RMSNorm, the eager softmax and RoPE angles in float32 even in a float64
model (the runner keeps float64 there): ~2e-6 apart on these logits, while a wrong mask, RoPE
or head layout moves them by O(1)."""


@pytest.mark.parametrize("model", ["untied", "tied"])
def test_float64_runner_equals_transformers(model):
    """Prefill then a tree forward: logits and final hidden states equal transformers'
    (float64 weights both; ``TOL``)."""
    target = tiny_llama(5, layers=2) if model == "untied" else _tied_llama()
    runner = InvariantLlama(target, torch.float64)
    ours, theirs = runner.new_cache(), CachedLM(target)
    ours.keep_hidden = theirs.keep_hidden = True
    prompt = [(5 * j + 2) % VOCAB for j in range(11)]
    torch.testing.assert_close(
        ours.extend(prompt).double(), theirs.extend(prompt), atol=TOL, rtol=0
    )
    tokens, depths, visible = _tree_inputs(len(prompt))
    a = ours.forward(tokens, depths, visible, len(prompt))
    b = theirs.forward(tokens, depths, visible, len(prompt))
    torch.testing.assert_close(a.double(), b, atol=TOL, rtol=0)
    assert ours.last_hidden is not None and theirs.last_hidden is not None
    torch.testing.assert_close(ours.last_hidden.double(), theirs.last_hidden, atol=TOL, rtol=0)
    # keep the path root -> child 2 -> its grandchild, then one more token: still equal
    ours.keep(len(prompt), [len(prompt), len(prompt) + 2, len(prompt) + 4])
    theirs.keep(len(prompt), [len(prompt), len(prompt) + 2, len(prompt) + 4])
    torch.testing.assert_close(ours.extend([1]).double(), theirs.extend([1]), atol=TOL, rtol=0)


@pytest.fixture(scope="module")
def bf16_target():
    target = tiny_llama(0, layers=3)
    model = LlamaForCausalLM(target.config).eval()
    model.load_state_dict({k: v.float() for k, v in target.state_dict().items()})
    try:
        return InvariantLlama(model, torch.bfloat16)
    except RowInvarianceError as refused:
        pytest.skip(f"this CPU's bfloat16 kernels are not row-invariant: {refused}")


def test_bfloat16_rows_do_not_depend_on_the_forward(bf16_target):
    """The logits at a context: one token at a time == a tree row == a row of a forward over
    three sequences' trees (torch.equal, not a tolerance)."""
    runner = bf16_target
    prompt = [(3 * j + 1) % VOCAB for j in range(9)]
    tokens, depths, visible = _tree_inputs(len(prompt))
    tree = runner.new_cache()
    tree.extend(prompt)
    in_tree = tree.forward(tokens, depths, visible, len(prompt))
    for node, path in ((1, [7, 3]), (4, [7, 9, 4])):
        alone = runner.new_cache()
        alone.extend(prompt)
        rows = [alone.extend([t]) for t in path]
        assert torch.equal(rows[-1][0], in_tree[node])
    others = []
    for i in range(2):
        cache = runner.new_cache()
        cache.extend([(7 * j + i) % VOCAB for j in range(4 + 6 * i)])
        others.append(cache)
    mine = runner.new_cache()
    mine.extend(prompt)
    batched = forward_many(
        [others[0], mine, others[1]],
        [[5], tokens, [8, 2]],
        [[0], depths, [0, 1]],
        [torch.ones((1, others[0].cached + 1), dtype=torch.bool), visible,
         torch.ones((2, others[1].cached + 2), dtype=torch.bool).tril(others[1].cached)],
        [others[0].cached, len(prompt), others[1].cached],
    )  # fmt: skip
    assert torch.equal(batched[1], in_tree)


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret((900 + i).to_bytes(32, "little")), 4, True, i)


@pytest.mark.parametrize("config", SPECULATIVE_CONFIGS)
def test_bfloat16_mpfr_equals_basic_uwm(bf16_target, config):
    """Thm. 5.1 in bfloat16: MPFR/PFR emit BASIC-UWM's tokens, drafter by drafter."""
    assert_speculative_equals_basic_uwm(bf16_target, config, _source)


def test_bfloat16_batched_equals_solo(bf16_target):
    """Continuous batching on the runner: every request's ids equal its solo run."""
    assert_batched_equals_solo(bf16_target, _source, max_batch=3, node_budget=8)


def test_open_cache_picks_the_backend(bf16_target, target):
    assert isinstance(open_cache(bf16_target), InvariantCache)
    assert isinstance(open_cache(target), CachedLM)
    with pytest.raises(ValueError, match="same backend"):
        forward_many(
            [open_cache(bf16_target), open_cache(target)],
            [[1], [1]], [[0], [0]],
            [torch.ones((1, 1), dtype=torch.bool)] * 2, [0, 0],
        )  # fmt: skip


def test_runner_refuses_what_it_cannot_run(target):
    with pytest.raises(ValueError, match="bfloat16 or float64"):
        InvariantLlama(target, torch.float16)
    runner = InvariantLlama(target, torch.float64)
    cache = runner.new_cache()
    with pytest.raises(ValueError, match=r"expected visible of shape \(1, 1\)"):
        cache.forward([1], [0], torch.ones((1, 2), dtype=torch.bool), 0)


def test_load_model_rejects_an_unknown_precision(tmp_path):
    with pytest.raises(ValueError, match="precision must be one of auto, float32, bfloat16, gguf"):
        load_model("smollm2-135m-instruct", tmp_path, device="cpu", precision="fp8")


def test_auto_falls_back_to_float32_where_a_shape_fails_the_probe(monkeypatch):
    """``auto`` checks every linear shape (the LM head alone let a tiny 32x32 o_proj through
    once): one failing shape means float32, a non-Llama too; all passing means bfloat16."""
    from sampler.models import auto_runner
    from sampler.targets import cpu_bf16 as invariant

    try:
        invariant._pack(torch.zeros((16, 16), dtype=torch.bfloat16))
    except RowInvarianceError as refused:  # e.g. AVX2 only: auto is float32 before any probe
        pytest.skip(str(refused))
    real_probe = invariant.probe_row_invariance
    shapes: list[tuple[int, ...]] = []

    def failing_on_second(weight: torch.Tensor, rows: int = invariant.ROWS_PER_CALL) -> None:
        shapes.append(tuple(weight.shape))  # the LM head's (construction), then qkv's
        if len(shapes) == 2:
            raise invariant.RowInvarianceError("qkv")
        real_probe(weight, rows)

    model = _tied_llama()
    monkeypatch.setattr(invariant, "probe_row_invariance", failing_on_second)
    assert auto_runner(model) is None
    assert len(shapes) == 2  # construction probed the LM head, probe_every_shape then qkv
    monkeypatch.setattr(invariant, "probe_row_invariance", real_probe)
    runner = auto_runner(model)
    if runner is not None:  # this CPU's kernels passed every shape of the tiny model
        assert runner.weights == torch.bfloat16
    non_llama = copy.copy(model)
    non_llama.config = copy.copy(model.config)
    non_llama.config.model_type = "gemma"
    assert auto_runner(non_llama) is None


def test_a_cpu_without_packed_bfloat16_means_float32(monkeypatch):
    """Where oneDNN has no bfloat16 linear (AVX2 only: it raised RuntimeError at packing on an
    AMD EPYC), the runner refuses with RowInvarianceError and ``auto`` falls back to float32."""
    from sampler.models import auto_runner
    from sampler.targets import cpu_bf16 as invariant

    class NoBfloat16Linear:
        def _reorder_linear_weight(self, weight: torch.Tensor, rows: int) -> torch.Tensor:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support")

    model = _tied_llama()
    monkeypatch.setattr(invariant.torch.ops, "mkldnn", NoBfloat16Linear())
    with pytest.raises(RowInvarianceError, match="no packed bfloat16 linear on this CPU"):
        InvariantLlama(model, torch.bfloat16)
    assert auto_runner(model) is None
    assert InvariantLlama(model, torch.float64).weights == torch.float64  # needs no oneDNN


def test_real_model_auto_precision_follows_the_cpu(real_model):
    """The shared real model is loaded with ``auto``: gguf (llama.cpp) where llama-cpp-python
    is installed (scripts/setup.sh builds it), else the bfloat16 runner exactly where the CPU
    has AMX bfloat16 (and its shapes pass the probe), float32 elsewhere."""
    from sampler.targets.cpu_features import native_bfloat16
    from sampler.targets.llamacpp import GgufTarget, available

    if available():
        assert real_model.precision == "gguf"
        assert isinstance(real_model.target, GgufTarget)
        return
    expected = torch.bfloat16 if native_bfloat16() else torch.float32
    assert real_model.dtype == expected
    assert isinstance(real_model.target, InvariantLlama) == (expected == torch.bfloat16)


def test_heads_decode_through_the_runners_head_and_train_through_transformers(bf16_target):
    """Parallel heads on a runner target: while decoding (no gradients) their logits go
    through the runner's packed bfloat16 head, so a request's row is the same bits in a
    batched heads pass as alone; with gradients (distillation) they go through transformers'
    float32 head and the heads learn. Both agree to bfloat16 rounding."""
    from sampler.drafters.heads import new_heads

    heads = new_heads(bf16_target.model, 3)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    d = bf16_target.config.hidden_size
    hidden = torch.randn((5, d), generator=g)
    tokens = torch.tensor([3, 9, 1, 4, 7])
    with torch.inference_mode():
        batched = heads.logits(bf16_target, hidden, tokens)  # (5, 3, V)
        alone = torch.stack(
            [heads.logits(bf16_target, hidden[i : i + 1], tokens[i : i + 1])[0] for i in range(5)]
        )
    assert batched.shape == (5, 3, VOCAB) and torch.equal(batched, alone)
    trained = heads.logits(bf16_target, hidden, tokens)
    assert trained.requires_grad
    trained.square().mean().backward()
    assert heads.up[0].weight.grad is not None and heads.up[0].weight.grad.abs().sum() > 0
    scale = trained.detach().abs().max()
    assert (trained.detach() - batched).abs().max() <= 0.02 * scale  # bf16: ~3 digits
    assert not torch.equal(trained.detach(), batched)  # the two heads are not the same path


def test_bfloat16_is_refused_on_a_cpu_without_amx(monkeypatch, data_dir):
    """The runner's row invariance was measured on AMX only; on AMD EPYC (avx512_bf16, no AMX)
    the real model's mpfr differed from basic-uwm, so explicit bfloat16 is refused there."""
    import sampler.models
    from sampler.models import DEFAULT_MODEL
    from sampler.targets.cpu_bf16 import RowInvarianceError

    monkeypatch.setattr(sampler.models, "native_bfloat16", lambda: False)
    with pytest.raises(RowInvarianceError, match="AMX bfloat16"):
        load_model(DEFAULT_MODEL, data_dir, device="cpu", precision="bfloat16")
