"""Tiny random Llamas the suites share: fast stand-ins for the target where a test checks the
math or the plumbing, never the real model's behaviour."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def real_vocab_llama(tokenizer: Any, max_positions: int, **config: Any) -> LlamaForCausalLM:
    """A 2-layer random Llama (hidden 32, seed 0, tied embeddings) over ``tokenizer``'s
    vocabulary (the real SmolLM2 tokenizer: 49,152 ids), ending texts at its EOS; ``config``:
    more ``LlamaConfig`` fields."""
    torch.manual_seed(0)
    settings: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": True,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return LlamaForCausalLM(LlamaConfig(**(settings | config))).eval()


def tied_llama(vocab: int, **config: Any) -> LlamaForCausalLM:
    """A 2-layer random float64 Llama with tied embeddings (hidden 48, 6 query and 2 KV heads,
    seed 3, initializer_range 0.3 for peaked laws); ``config``: more ``LlamaConfig`` fields."""
    torch.manual_seed(3)
    settings: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "initializer_range": 0.3,
        "tie_word_embeddings": True,
        "rope_theta": 500.0,
    }
    return LlamaForCausalLM(LlamaConfig(**(settings | config))).to(torch.float64).eval()
