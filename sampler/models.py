"""Loading the target (and model drafters) offline, from the converted cache.

The files, the alias ``smollm2-135m-instruct`` and the tokenizer are ``sampler.model_files``'s
(no torch there: the detector and the CLI's key and detect commands need only the tokenizer);
this module loads the weights. Nothing here downloads: there is no hub access at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from sampler.model_files import (
    ALIASES,
    DEFAULT_MODEL,
    ModelNotFound,
    load_tokenizer,
    materialise,
    tokenizer_fingerprint,
)

__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "LoadedModel",
    "ModelNotFound",
    "load_model",
    "load_tokenizer",
    "materialise",
    "resolve_device",
    "tokenizer_fingerprint",
]


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM with its tokenizer, on one device, in eval mode."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` -> CUDA when present, else CPU; anything else is passed to ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model(
    name: str,
    data_dir: Path,
    device: str = "auto",
    dtype: torch.dtype | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer for decoding.

    Args:
        name: an alias (``smollm2-135m-instruct``) or a local HF model directory.
        data_dir: where converted copies are cached.
        device: ``"auto"`` (CUDA when present, else CPU), ``"cpu"``, ``"cuda:0"``...
        dtype: weights dtype; default float32 on CPU, bfloat16 on CUDA (race math stays float32+).
    """
    path = materialise(name, data_dir, on_progress)
    dev = resolve_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tokenizer = load_tokenizer(name, data_dir)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model = model.to(dev)  # type: ignore[arg-type]  # transformers' wrapped .to hides self
    model.eval()
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, device=dev, dtype=dtype)
