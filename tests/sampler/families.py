"""Tiny random checkpoints of the common model families, and their GGUF files.

``tiny_family`` builds a random causal LM of one family (Llama, Qwen2, Qwen3, Mistral, Gemma)
with the tests' vocabulary (``VOCAB``), two layers and head size 32 (llama.cpp's Q8_0 KV cache
and flash attention need a multiple of 32); ``write_gguf`` writes its weights as a GGUF file
that llama.cpp loads, the way ``convert_hf_to_gguf.py`` does for each architecture: tensor
names from ``gguf.tensor_mapping``, Llama's q/k rows permuted to llama.cpp's rotary pairs,
Gemma's norms stored as 1 + w, and a 64-token byte-level BPE vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from tests.sampler.conftest import VOCAB

CONTEXT = 512
"""Training context of every tiny checkpoint (llama.cpp sizes its contexts by it)."""


@dataclass(frozen=True)
class Family:
    """One architecture: its transformers classes and its llama.cpp architecture.

    Attributes:
        name: the test id. arch: llama.cpp's architecture (``gguf.MODEL_ARCH``).
        permute_qk: llama.cpp rotates adjacent pairs for this architecture (``rope type
            norm``), transformers rotates halves: q/k rows are permuted on writing.
        norm_offset: the RMSNorm scales by 1 + w (Gemma): llama.cpp reads the sum.
    """

    name: str
    config: type[Any]  # a transformers config class
    model: type[Any]  # its causal LM class
    arch: gguf.MODEL_ARCH
    permute_qk: bool = False
    norm_offset: bool = False


FAMILIES = {
    f.name: f
    for f in (
        Family("llama", LlamaConfig, LlamaForCausalLM, gguf.MODEL_ARCH.LLAMA, permute_qk=True),
        Family("qwen2", Qwen2Config, Qwen2ForCausalLM, gguf.MODEL_ARCH.QWEN2),
        Family("qwen3", Qwen3Config, Qwen3ForCausalLM, gguf.MODEL_ARCH.QWEN3),
        # convert_hf_to_gguf.py writes Mistral as a Llama (the same layers)
        Family("mistral", MistralConfig, MistralForCausalLM, gguf.MODEL_ARCH.LLAMA, True),
        Family("gemma", GemmaConfig, GemmaForCausalLM, gguf.MODEL_ARCH.GEMMA, norm_offset=True),
    )
}


def tiny_family(name: str, seed: int, layers: int = 2) -> PreTrainedModel:
    """A random float64 model of family ``name``: vocabulary ``VOCAB``, d = 64, 2 query heads
    and 1 key/value head of size 32, I = 128, ``initializer_range`` 0.3 (peaked laws, as
    ``tiny_llama``). Biases (Qwen2's q/k/v) and norm scales are random too, so that a writer
    that drops or misplaces them is seen."""
    family = FAMILIES[name]
    extra: dict[str, object] = {}
    if name == "mistral":
        extra["sliding_window"] = None  # the window outgrows every context here
    if name == "gemma":
        extra["hidden_activation"] = "gelu_pytorch_tanh"
    config = family.config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=CONTEXT,
        initializer_range=0.3,
        rms_norm_eps=1e-6,
        tie_word_embeddings=name == "gemma",
        attn_implementation="sdpa",  # float64 throughout: eager softmaxes in float32
        **extra,
    )
    torch.manual_seed(seed)
    model: PreTrainedModel = family.model(config).to(torch.float64)
    model.train(False)
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith(".bias") or "norm" in key:
                # around 1 for a plain scale, around 0 for Gemma's 1 + w and for biases
                centre = 0.0 if key.endswith(".bias") or family.norm_offset else 1.0
                param.copy_(centre + 0.2 * torch.randn_like(param))
    return model


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute``: each head's rows from (half, pair) to
    (pair, half) order, so llama.cpp's adjacent-pair rotation equals transformers' halves."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _tokens() -> list[str]:
    """``VOCAB`` byte-level BPE tokens: ``<s>`` and ``</s>`` (BOS and EOS, control tokens),
    newline and space (GPT-2's ``Ċ``, ``Ġ``), printable ASCII, and one merge's result."""
    singles = ["\u010a", "\u0120"] + [chr(c) for c in range(33, 33 + VOCAB - 5)]
    return ["<s>", "</s>", *singles, singles[2] + singles[3]]


def write_gguf(
    model: PreTrainedModel,
    path: Path,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
) -> Path:
    """Write ``model`` (a ``tiny_family`` model) to ``path`` as a GGUF file: matrices in
    ``qtype`` (F32, F16 or Q8_0), norms and biases in F32.

    Returns:
        ``path``.
    Raises:
        KeyError: a tensor name ``gguf.tensor_mapping`` does not know for the architecture.
    """
    name = str(model.config.model_type)
    family = FAMILIES[name]
    config = model.config
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    head_dim = int(config.head_dim)
    layers = int(config.num_hidden_layers)
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[family.arch])
    writer.add_name(f"tiny-{name}")
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(layers)
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(VOCAB)
    file_types = {
        gguf.GGMLQuantizationType.F32: gguf.LlamaFileType.ALL_F32,
        gguf.GGMLQuantizationType.F16: gguf.LlamaFileType.MOSTLY_F16,
        gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    }
    writer.add_file_type(file_types[qtype])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    tokens = _tokens()
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.NORMAL] * (VOCAB - 2))
    writer.add_token_merges([f"{tokens[4]} {tokens[5]}"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    names = gguf.get_tensor_name_map(family.arch, layers)
    for key, value in model.state_dict().items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = value.detach().to(torch.float32).numpy()
        if family.permute_qk and key.endswith("q_proj.weight"):
            data = _permute(data, heads)
        elif family.permute_qk and key.endswith("k_proj.weight"):
            data = _permute(data, kv_heads)
        if family.norm_offset and key.endswith("norm.weight"):
            data = data + 1.0
        out = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if out is None:
            raise KeyError(f"{family.arch.name}: no GGUF name for {key}")
        if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(out, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(out, data.astype(np.float16))
        else:
            writer.add_tensor(out, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
