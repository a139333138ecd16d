"""CPU == CUDA for the decoder (docs/design.md §3, Devices). Runs only where CUDA exists (gpu)."""

from __future__ import annotations

import pytest
import torch

from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import self_drafter
from tests.sampler.conftest import tiny_llama

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_decoder_output_identical_on_cpu_and_cuda():
    """float64 tiny model: the keyed race picks the same winners on both devices, so mpfr and
    basic-uwm outputs are equal across devices and across each other."""
    cpu = tiny_llama(0, layers=3)
    cuda = tiny_llama(0, layers=3).to("cuda")
    for i in range(10):
        src = KeyedSource(Secret(i.to_bytes(32, "little")), 4, True, i)
        prompt = [(5 * i + j) % 64 for j in range(3 + i % 4)]
        ref = generate(cpu, prompt, SamplerConfig("basic-uwm", max_new_tokens=24), src)
        for model in (cpu, cuda):
            out = generate(
                model, prompt, SamplerConfig("mpfr", 4, 3, 24), src, self_drafter(model, 1)
            )
            assert out.token_ids == ref.token_ids
        on_gpu = generate(cuda, prompt, SamplerConfig("basic-uwm", max_new_tokens=24), src)
        assert on_gpu.token_ids == ref.token_ids
