"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, real_tokenizer) -> Path:
    """A tiny random Llama with the real tokenizer (49,152 ids, hidden 32): the CLI's distill
    path end to end in seconds (the real model's run is the benchmark's)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tinyllm")
    config = LlamaConfig(
        vocab_size=len(real_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=real_tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    real_tokenizer.save_pretrained(path)
    return path
