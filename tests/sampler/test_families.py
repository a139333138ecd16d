"""The backend contract (``tests/sampler/backend_contract.py``: MPFR/PFR emit BASIC-UWM's tokens
whatever the drafter, MPFR Thm. 5.1; a batched request its solo tokens) on tiny random
checkpoints of each common family, saved to disk and loaded back: on transformers (float64)
and on llama.cpp (the same weights written as GGUF, ``tests/sampler/families.py``). Equality is
exact, so no statistical allowance is needed.

llama.cpp runs the Q8_0 files (their matrix kernels keep a row's bits whatever the batch on
``scripts/setup.sh``'s build; the probe refuses F32 and F16 files where they do not). The GGUF
writer is checked on the F32 files: llama.cpp's logits within ``WRITER_TOL`` of transformers'
on the same weights, the same argmax at every position. The bfloat16 runner and the static
target run the families with Llama layers (Mistral, Qwen2) and refuse the others by name."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig
from sampler.targets.cpu_bf16 import InvariantLlama, RowInvarianceError
from sampler.targets.cpu_features import cpu_flags
from sampler.targets.llamacpp import ROW_KERNELS_BUILD, GgufTarget, available
from sampler.targets.llamacpp import RowInvarianceError as GgufRowInvarianceError
from sampler.targets.static import ATTENTION_BLOCK, StaticLlama
from sampler.targets.transformers import CachedLM, as_target
from tests.sampler.backend_contract import (
    assert_batched_equals_solo,
    assert_speculative_equals_basic_uwm,
)
from tests.sampler.conftest import VOCAB
from tests.sampler.families import FAMILIES, tiny_family, write_gguf

NAMES = list(FAMILIES)
CONTRACT = SamplerConfig("mpfr", 4, 3, 16)
"""The speculative configuration each family is checked under (the tiny Llama runs all of
``SPECULATIVE_CONFIGS`` on the other backends): a fixed tree, as tree ``auto`` sizes its
trees by measured forward costs, which may leave a tiny model's trees too small for a draft
to be accepted."""


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret((500 + i).to_bytes(32, "little")), 4, True, i)


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's tiny checkpoint as an HF directory (config.json + safetensors)."""
    root = tmp_path_factory.mktemp("families")
    dirs = {}
    for seed, name in enumerate(NAMES):
        dirs[name] = root / name
        tiny_family(name, seed).save_pretrained(dirs[name])
    return dirs


@pytest.fixture(scope="session")
def models(family_dirs: dict[str, Path]) -> dict[str, PreTrainedModel]:
    """Each family's checkpoint loaded back from disk, float64, by its own class."""
    loaded: dict[str, PreTrainedModel] = {}
    for name, path in family_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch.float64, attn_implementation="sdpa"
        )
        assert type(model) is FAMILIES[name].model
        model.train(False)
        loaded[name] = model
    return loaded


@pytest.fixture(params=NAMES)
def family(request: pytest.FixtureRequest, models: dict[str, PreTrainedModel]) -> PreTrainedModel:
    return models[request.param]


def test_transformers_mpfr_equals_basic_uwm(family: PreTrainedModel) -> None:
    assert_speculative_equals_basic_uwm(as_target(family), CONTRACT, _source)


def test_transformers_batched_equals_solo(family: PreTrainedModel) -> None:
    assert_batched_equals_solo(as_target(family), _source, max_batch=3, node_budget=16)


Q8_0 = gguf.GGMLQuantizationType.Q8_0


class GgufFiles:
    """The families' GGUF files, written beside their checkpoints and loaded by llama.cpp on
    first use (unprobed), with the transformers model as each target's ``model`` (the
    ``self:1`` drafter's layers)."""

    def __init__(self, dirs: dict[str, Path], models: dict[str, PreTrainedModel]) -> None:
        self.dirs, self.models = dirs, models
        self.targets: dict[tuple[str, str], GgufTarget] = {}

    def path(self, name: str, qtype: gguf.GGMLQuantizationType) -> Path:
        path = self.dirs[name] / f"model-{qtype.name}.gguf"
        if not path.exists():
            write_gguf(self.models[name], path, qtype)
        return path

    def target(self, name: str, qtype: gguf.GGMLQuantizationType = Q8_0) -> GgufTarget:
        key = (name, qtype.name)
        if key not in self.targets:
            target = GgufTarget(self.path(name, qtype), threads=1)
            target.model = self.models[name]
            self.targets[key] = target
        return self.targets[key]


@pytest.fixture(scope="session")
def ggufs(family_dirs: dict[str, Path], models: dict[str, PreTrainedModel]) -> GgufFiles:
    if not available():
        pytest.skip("llama-cpp-python is not installed (scripts/setup.sh builds it)")
    return GgufFiles(family_dirs, models)


@pytest.fixture(params=NAMES)
def gguf_family(request: pytest.FixtureRequest, ggufs: GgufFiles) -> GgufTarget:
    """The family in Q8_0 (weights) on llama.cpp, probed: a row's logits do not depend on
    the batch (``GgufTarget.probe``, which precision gguf runs at load)."""
    target = ggufs.target(request.param)
    target.probe()
    return target


PROMPT = [(13 * j + 7) % VOCAB for j in range(40)]

WRITER_TOL = 1e-2
"""Largest |logit difference| allowed between llama.cpp on the F32 file (an F32 KV cache, no
flash attention) and transformers float64, on logits up to ~10: measured <= 6e-5, and 5e-3 for
Gemma, whose GELU ggml reads from a float16 table. A misplaced tensor, bias, norm offset or
rotary layout moves them by O(1)."""


@pytest.mark.parametrize("name", NAMES)
def test_the_gguf_writer_gives_llama_cpp_the_weights_transformers_runs(
    ggufs: GgufFiles, name: str
) -> None:
    """Every position of a 40-token prompt: llama.cpp's logits on the F32 file within
    ``WRITER_TOL`` of transformers' and the same argmax."""
    import llama_cpp
    import numpy as np

    path = ggufs.path(name, gguf.GGMLQuantizationType.F32)
    exact = llama_cpp.Llama(
        str(path), n_ctx=64, n_threads=1, logits_all=True, flash_attn=False, verbose=False,
        type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
    )  # fmt: skip
    exact.eval(PROMPT)
    ours = torch.from_numpy(np.array(exact.scores[: len(PROMPT)], dtype=np.float64))
    theirs = CachedLM(ggufs.models[name]).extend(PROMPT)
    assert ours.shape == theirs.shape == (len(PROMPT), VOCAB)
    assert theirs.abs().max() > 1.0  # peaked laws: the comparison means something
    assert (ours - theirs).abs().max() <= WRITER_TOL
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_gguf_mpfr_equals_basic_uwm(gguf_family: GgufTarget) -> None:
    assert gguf_family.vocab_size == VOCAB and gguf_family.weights.startswith("gguf:Q8_0")
    assert_speculative_equals_basic_uwm(gguf_family, CONTRACT, _source)


def test_gguf_batched_equals_solo(gguf_family: GgufTarget) -> None:
    assert_batched_equals_solo(gguf_family, _source, max_batch=3, node_budget=16)


@pytest.mark.parametrize(
    "qtype", [gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16], ids=lambda q: q.name
)
def test_float_files_hold_the_contract_where_the_probe_passes(
    ggufs: GgufFiles, qtype: gguf.GGMLQuantizationType
) -> None:
    """The Llama checkpoint in F32 and F16: scripts/setup.sh's build takes tinyBLAS's float
    kernels for one row too (scripts/llama-cpp-row-kernels.patch), so on an AVX2 + FMA + F16C
    CPU the probe passes and batched requests get their solo tokens; another build may refuse
    the file (its one-row float products are ggml's vec_dot, other sums), as precision gguf
    does at load."""
    import llama_cpp

    target = ggufs.target("llama", qtype)
    ours = ROW_KERNELS_BUILD in llama_cpp.__version__ and {"avx2", "fma", "f16c"} <= cpu_flags()
    try:
        target.probe()
    except GgufRowInvarianceError as refused:
        if ours:
            raise
        pytest.skip(f"{qtype.name}: llama.cpp's rows depend on the batch here ({refused})")
    assert_batched_equals_solo(target, _source, max_batch=3, node_budget=16)


# The bfloat16 runner and the static target compute Llama layers themselves: Mistral (no
# sliding window) and Qwen2 (q/k/v biases) run there; Gemma and Qwen3 are refused, naming
# the model and the backend to use instead.

LLAMA_LAYERED = ["qwen2", "mistral"]
REFUSED = {"gemma": "GemmaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _tree(cached: int) -> tuple[list[int], list[int], torch.Tensor]:
    """A 5-node tree after ``cached`` positions: root, two children, a grandchild under each."""
    tokens, depths, parents = [7, 3, 9, 12, 4], [0, 1, 1, 2, 2], [-1, 0, 0, 1, 2]
    visible = torch.zeros((5, cached + 5), dtype=torch.bool)
    visible[:, :cached] = True
    for i in range(5):
        j = i
        while j >= 0:
            visible[i, cached + j] = True
            j = parents[j]
    return tokens, depths, visible


@pytest.mark.parametrize("name", LLAMA_LAYERED)
def test_float64_runner_and_static_target_equal_transformers(
    models: dict[str, PreTrainedModel], name: str
) -> None:
    """A prefill then a tree: the float64 runner within 1e-5 of transformers (it keeps RMSNorm
    and RoPE in float64, transformers in float32) and the float64 static target within 1e-10
    (transformers' order), Qwen2's q/k/v biases included."""
    model = models[name]
    runner = InvariantLlama(model, torch.float64)
    static = StaticLlama(model, group_slots=2, rows=4, capacity=ATTENTION_BLOCK, slots=2)
    for ours, tol in ((runner.new_cache(), 1e-5), (static.new_cache(), 1e-10)):
        theirs = CachedLM(model)
        a, b = ours.extend(PROMPT[:20]), theirs.extend(PROMPT[:20])
        torch.testing.assert_close(a.double(), b, atol=tol, rtol=0)
        tokens, depths, visible = _tree(20)
        a, b = (
            ours.forward(tokens, depths, visible, 20),
            theirs.forward(tokens, depths, visible, 20),
        )
        torch.testing.assert_close(a.double(), b, atol=tol, rtol=0)


def test_float32_static_target_holds_the_contract_on_qwen2(
    models: dict[str, PreTrainedModel],
) -> None:
    """Qwen2's biased q/k/v through the static target in float32: MPFR emits BASIC-UWM's
    tokens, batched requests their solo tokens."""
    static = StaticLlama(
        models["qwen2"], weights=torch.float32, group_slots=2, rows=4,
        capacity=2 * ATTENTION_BLOCK, slots=8,
    )  # fmt: skip
    assert_speculative_equals_basic_uwm(static, CONTRACT, _source)
    assert_batched_equals_solo(static, _source, max_batch=5, node_budget=32)


def test_bfloat16_runner_holds_the_contract_on_qwen2(models: dict[str, PreTrainedModel]) -> None:
    """The same on the bfloat16 runner, where this CPU's packed bfloat16 linear is
    row-invariant (AMX)."""
    model = models["qwen2"]
    plain = type(model)(model.config)
    plain.train(False)
    plain.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    try:
        runner = InvariantLlama(plain, torch.bfloat16)
        runner.probe_every_shape()
    except RowInvarianceError as refused:
        pytest.skip(f"this CPU's bfloat16 kernels are not row-invariant: {refused}")
    assert_speculative_equals_basic_uwm(runner, CONTRACT, _source)
    assert_batched_equals_solo(runner, _source, max_batch=3, node_budget=8)


@pytest.mark.parametrize("name", list(REFUSED))
def test_other_families_are_refused_with_the_backend_to_use(
    models: dict[str, PreTrainedModel], name: str
) -> None:
    model = models[name]
    with pytest.raises(
        ValueError,
        match=rf"^the bfloat16 runner supports Llama layers \(llama, mistral, qwen2\), not "
        rf"{REFUSED[name]} \({name}\): use precision gguf or float32$",
    ):
        InvariantLlama(model, torch.float64)
    with pytest.raises(
        ValueError,
        match=rf"^the static target supports Llama layers .*, not {REFUSED[name]} \({name}\): "
        r"transformers' own forward serves it \(precision float32\)$",
    ):
        StaticLlama(model)


def test_a_sliding_window_is_refused(models: dict[str, PreTrainedModel]) -> None:
    """A Mistral whose window (64) is shorter than its context (512) is not a Llama here."""
    model = models["mistral"]
    windowed = type(model)(type(model.config)(**{**model.config.to_dict(), "sliding_window": 64}))
    for make in (lambda: InvariantLlama(windowed, torch.float64), lambda: StaticLlama(windowed)):
        with pytest.raises(ValueError, match="MistralForCausalLM attends to the last 64 of 512"):
            make()
