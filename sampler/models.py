"""Loading the target (and model drafters) offline, from the converted cache.

The files, the alias ``smollm2-135m-instruct`` and the tokenizer are
``sampler.targets.model_files``'s (no torch there: the detector and the CLI's key and detect
commands need only the tokenizer); this module loads the weights. Nothing here downloads: there is
no hub access at run time.

Shapes: the loaded target's logits are (q, V) per sequence forward (``sampler.targets.base``) in
``LoadedModel.dtype`` (float32, bfloat16 through the runner or the static target, or the
``dtype`` a caller forces, e.g. float64 for a reference); token ids are Python ints.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

import keyed
from sampler import processing, race, topk
from sampler.targets.base import Target
from sampler.targets.cpu_bf16 import InvariantLlama, RowInvarianceError
from sampler.targets.cpu_features import native_bfloat16
from sampler.targets.llamacpp import GgufTarget, GgufUnavailable
from sampler.targets.llamacpp import RowInvarianceError as GgufRowInvarianceError
from sampler.targets.llamacpp import available as gguf_available
from sampler.targets.model_files import (
    ALIASES,
    DEFAULT_MODEL,
    ModelNotFound,
    gguf_path,
    load_tokenizer,
    materialise,
    model_name,
    tokenizer_fingerprint,
)
from sampler.targets.profile import set_profile_dir
from sampler.targets.static import StaticLlama
from sampler.targets.transformers import TransformersTarget, as_target

log = logging.getLogger("poissonmark.models")

__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "PRECISIONS",
    "LoadedModel",
    "ModelNotFound",
    "load_model",
    "load_tokenizer",
    "materialise",
    "model_name",
    "resolve_device",
    "tokenizer_fingerprint",
]


PRECISIONS = ("auto", "float32", "bfloat16", "gguf")
"""Target precisions: ``float32`` (transformers, strict), ``bfloat16`` (on the CPU the
row-invariant runner of ``sampler.targets.cpu_bf16``; on CUDA the static-layout target of
``sampler.targets.static``, CUDA graphs over bfloat16 weights),
``gguf`` (CPU: the model's GGUF file with its own quantised weights through llama.cpp,
``sampler.targets.llamacpp``; an alias, a GGUF path or the converted copy of either),
``auto``: bfloat16 (the static target) on CUDA;
on the CPU ``gguf`` where llama-cpp-python is installed, the model has a GGUF file and the
invariance probe passes (measured: ~5x float32's tokens/s on AMD EPYC,
``bench/results/speed_cpu_gguf.json``), else the bfloat16 runner where the CPU has AMX bfloat16
(``sampler.targets.cpu_features.native_bfloat16``), the model is a Llama and every one of its linear
shapes passes the row-invariance probe (eight batched requests 4.1-5.3x one,
``bench/results/service_load_batching_bf16*.json``), else float32."""


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM with its tokenizer, on one device, in eval mode.

    ``target`` is what decodes (``sampler.targets.base.Target``: transformers, the row-invariant
    bfloat16 runner, llama.cpp or the static CUDA target; ``precision`` says which); pass it,
    not ``model``, to the decoder, batching, drafters and the detector's model tests.
    ``data_dir``: the data dir it was loaded from, where drafters trained for it are found
    (``sampler.drafters.make_drafter``); None for a model built in memory.
    ``model`` is the transformers copy of the weights (float32 on the CPU beside bfloat16 or
    gguf, which also sets ``torch.set_num_threads(1)``, process-wide): drafters share its
    layers, the tree chooser its config. ``dtype`` is the target's compute precision (the
    logits' dtype). Built without a ``target``, it decodes on ``model``'s own forward.
    ``name`` is for people (``model_files.model_name``: the alias, or a directory's or GGUF
    file's own name), not a path to load.
    """

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    precision: str = "float32"
    target: Target = None  # type: ignore[assignment]  # set in __post_init__
    data_dir: Path | None = None

    def __post_init__(self) -> None:
        # a transformers target follows ``model`` (``dataclasses.replace(loaded, model=...)``)
        stale = isinstance(self.target, TransformersTarget) and self.target.model is not self.model
        if self.target is None or stale:
            object.__setattr__(self, "target", as_target(self.model))


def gguf_source(name: str, path: Path) -> Path | None:
    """The GGUF file behind model ``name`` loaded from ``path``: an alias's file, or the
    ``source`` a converted copy's ``.complete`` marker names (``model_files.materialise``: a
    GGUF path's copy, or the alias's copy passed as a directory)."""
    if name in ALIASES:
        return gguf_path(name)
    try:
        source = json.loads((path / ".complete").read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(source) if isinstance(source, str) and Path(source).is_file() else None


def gguf_target(name: str, path: Path, model: PreTrainedModel) -> GgufTarget:
    """The llama.cpp target for model ``name`` (its GGUF file, ``gguf_source``), probed on
    this machine.

    Raises:
        GgufUnavailable: llama-cpp-python missing, or no GGUF file behind the model.
        GgufRowInvarianceError: llama.cpp's logits depend on the batch here.
        ValueError: its vocabulary differs from the transformers model's.
    """
    source = gguf_source(name, path)
    if source is None:
        raise GgufUnavailable(f"precision gguf needs a model with a GGUF file, not {name!r}")
    target = GgufTarget(source)
    target.model = model
    if target.vocab_size != int(model.config.vocab_size):
        raise ValueError(
            f"llama.cpp's vocabulary ({target.vocab_size}) differs from the model's "
            f"({model.config.vocab_size})"
        )
    if target.repack:
        try:
            target.probe()
            return target
        except GgufRowInvarianceError as exc:
            log.warning("precision gguf: weight repacking off, ~2x slower on AMX (%s)", exc)
            target = GgufTarget(source, repack=False)
            target.model = model
    target.probe()
    return target


def auto_runner(model: PreTrainedModel) -> InvariantLlama | None:
    """``auto``'s bfloat16 runner for ``model``, or None (float32) when the model is not a
    Llama the runner supports or some linear shape of it fails the row-invariance probe."""
    try:
        runner = InvariantLlama(model, torch.bfloat16)
        runner.probe_every_shape()
    except (ValueError, RowInvarianceError) as exc:
        log.info("precision auto: float32 (%s)", exc)
        return None
    return runner


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` -> CUDA when present, else CPU; anything else is passed to ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _warm_up_kernels() -> None:
    keyed.warm_up()
    topk.warm_up()
    # decided once per process (sampler.compiled.once): a generation that starts first waits
    # for this decision at its first step, and every later call gets the same path
    processing._logp_kernel()
    race._race_kernel()


def load_model(
    name: str,
    data_dir: Path,
    device: str = "auto",
    dtype: torch.dtype | None = None,
    on_progress: Callable[[str], None] | None = None,
    precision: str = "auto",
) -> LoadedModel:
    """Load a causal LM and its tokenizer for decoding.

    Args:
        name: an alias (``smollm2-135m-instruct``), a GGUF file (converted once for the
            transformers copy; ``auto`` and ``gguf`` run llama.cpp on the file) or a local HF
            model directory (``sampler.targets.model_files.locate``).
        data_dir: where converted copies are cached.
        device: ``"auto"`` (CUDA when present, else CPU), ``"cpu"``, ``"cuda:0"``...
        dtype: transformers weights dtype (overrides ``precision``; race math stays float32+).
        precision: one of ``PRECISIONS``; ``LoadedModel.dtype`` says which one ``auto`` chose.
    Raises:
        ModelNotFound: an unknown name. GgufFileError (a ValueError): a file that is not a
            readable GGUF, or a tokenizer beside it that names other tokens.
        ValueError: an unknown precision, bfloat16 on the CPU for a non-Llama model, gguf
            off the CPU.
        RowInvarianceError: bfloat16 on a CPU without AMX bfloat16, or whose bfloat16 kernels
            are not row-invariant.
        GgufUnavailable, GgufRowInvarianceError: precision gguf that cannot run here.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    path = materialise(name, data_dir, on_progress)
    dev = resolve_device(device)
    # Per token on the host, the race's clocks and the top-k run compiled once loaded (~0.4 s,
    # here beside the model load; NumPy and torch until then, the same results), and the
    # log-softmax and race are decided (sampler.compiled): together 2.3 % of basic-uwm's
    # tokens/s on llama.cpp (bench/results/gguf_step_costs.json: 0.977x with NumPy clocks and
    # torch.topk). On CUDA too: the static target's logits come back to the host, where the
    # same step runs.
    threading.Thread(target=_warm_up_kernels, name="kernel-warm-up", daemon=True).start()
    if precision == "gguf" and (dtype is not None or dev.type != "cpu"):
        raise ValueError("precision gguf runs on the CPU only, with the file's own weights")
    invariant = dtype is None and dev.type == "cpu" and precision == "bfloat16"
    if invariant and not native_bfloat16():
        raise RowInvarianceError(
            "the bfloat16 runner is row-invariant only where it was measured so, on CPUs with "
            "AMX bfloat16; this CPU has none (on AMD EPYC it was not: mpfr differed from "
            "basic-uwm); use precision gguf or float32"
        )
    maybe_invariant = dtype is None and dev.type == "cpu" and precision == "auto"
    # on CUDA, auto and bfloat16 serve through the static-layout target (CUDA graphs,
    # row-invariant by its one layout: sampler.targets.static); float32 stays transformers
    static = dtype is None and dev.type == "cuda" and precision in ("auto", "bfloat16")
    if dtype is None:
        cuda_bf16 = dev.type == "cuda" and precision != "float32"
        dtype = torch.bfloat16 if cuda_bf16 else torch.float32
    tokenizer = load_tokenizer(name, data_dir)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model = model.to(dev)  # type: ignore[arg-type]  # transformers' wrapped .to hides self
    model.eval()
    chosen = "bfloat16" if dtype == torch.bfloat16 else "float32"
    target: Target = as_target(model)
    if precision == "gguf":
        target = gguf_target(name, path, model)
        chosen = "gguf"
    elif maybe_invariant and gguf_available() and gguf_source(name, path) is not None:
        try:
            target = gguf_target(name, path, model)
            chosen = "gguf"
        except (GgufUnavailable, GgufRowInvarianceError, ValueError) as exc:
            log.info("precision auto: not gguf (%s)", exc)
    if chosen == "gguf":
        # The decoder's per-token torch work is small (top-k, the race); torch's OpenMP team
        # between two llama.cpp forwards slowed the next one: 10.6 against 8.4 ms measured
        # (AMD EPYC, 2 cores), 80 against 100 tokens/s for basic-uwm.
        torch.set_num_threads(1)
        log.info("precision gguf: torch set to one intra-op thread")
    elif invariant:
        target = InvariantLlama(model, torch.bfloat16)
        dtype, chosen = torch.bfloat16, "bfloat16"
    elif maybe_invariant and native_bfloat16():
        runner = auto_runner(model)
        if runner is not None:
            target = runner
            dtype, chosen = torch.bfloat16, "bfloat16"
    elif static:
        try:
            target = StaticLlama(model, device=dev, weights=torch.bfloat16)
        except ValueError as exc:  # not a Llama: transformers' own bfloat16 forward
            log.info("precision %s on CUDA: transformers bfloat16 (%s)", precision, exc)
        chosen = "bfloat16"
    set_profile_dir(target, data_dir / "profiles")  # tree "auto"'s forward costs
    return LoadedModel(
        name=model_name(name, data_dir), model=model, tokenizer=tokenizer, device=dev,
        dtype=dtype, precision=chosen, target=target, data_dir=data_dir,
    )  # fmt: skip
