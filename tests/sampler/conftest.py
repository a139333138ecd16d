"""Tiny random Llama models (float64) for the decoder's exactness tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sampler.processing import Processing, dense_logp, process
from sampler.targets.transformers import CachedLM

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
        attn_implementation="sdpa",  # float64 throughout: eager softmaxes in float32
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


C10_CASES = [
    pytest.param([0.6, 0.4], [0.8, 0.2], None, [0.6, 0.4], id="probs_q08_p06"),
    pytest.param(
        [2.0, 1.0, 0.5],
        [1.5, 1.2, 0.3],
        Processing(0.7, 2, 1.0),
        [0.80668, 0.19332, 0.0],
        id="logits_T07_top2",
    ),
]
"""Case C10's (P, Q, processing, expected law) pairs: ``p_values``/``q_values`` are
probabilities when ``processing`` is None, else logits."""


def first_two_token_law(
    target: LlamaForCausalLM, prompt: list[int], processing: Processing
) -> dict[tuple[int, int], float]:
    """The enumerated law P(y1) P(y2 | y1) of the first two tokens after ``prompt``."""
    first = dense_logp(process(CachedLM(target).extend(prompt)[-1:], processing), VOCAB).exp()[0]
    law = {}
    for y1 in torch.nonzero(first).flatten().tolist():
        second = dense_logp(
            process(CachedLM(target).extend([*prompt, y1])[-1:], processing), VOCAB
        ).exp()[0]
        for y2 in torch.nonzero(second).flatten().tolist():
            law[(y1, y2)] = float(first[y1] * second[y2])
    return law
