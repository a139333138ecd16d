"""Tiny random Llama models (float64) for the decoder's exactness tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 64


def tiny_llama(seed: int, layers: int = 2, dtype: torch.dtype = torch.float64) -> LlamaForCausalLM:
    """A random Llama with vocab 64; initializer_range 0.3 gives peaked, non-uniform laws
    (with the default 0.02 every next-token law is nearly uniform and every drafter agrees)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Tiny models are dominated by per-op overhead; several threads only add contention.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def target() -> LlamaForCausalLM:
    return tiny_llama(0, layers=3)


@pytest.fixture(scope="session")
def other_drafter_model() -> LlamaForCausalLM:
    return tiny_llama(1, layers=1)
