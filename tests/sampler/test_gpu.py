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


def test_static_target_on_cuda_equals_transformers_and_itself():
    """The static target on CUDA with its graphs: float64 weights close to transformers float64
    on the CPU (tolerance below); float32 weights: mpfr = basic-uwm and batched = solo, bit
    for bit (one device, one kernel per shape)."""
    from sampler.batch import generate_many
    from sampler.drafters import NgramDrafter, fresh_drafter
    from sampler.targets.static import ATTENTION_BLOCK, StaticLlama
    from sampler.targets.transformers import CachedLM
    from tests.sampler.conftest import VOCAB

    model = tiny_llama(0, layers=3)
    exact = StaticLlama(
        model, device="cuda", weights=torch.float64, group_slots=2, rows=4,
        capacity=2 * ATTENTION_BLOCK, slots=4,
    )  # fmt: skip
    assert exact.graphs
    prompt = [(5 * j + 2) % VOCAB for j in range(ATTENTION_BLOCK + 9)]
    ours, theirs = exact.new_cache().extend(prompt), CachedLM(model).extend(prompt)
    # Not the CPU's 1e-12 (tests/sampler/test_static_target.py): RMSNorm and RoPE's cos/sin run
    # in float32 in both implementations (as transformers computes them), and CUDA's reduction
    # order and rsqrtf/cosf move their last bits (~1e-7 relative, a few float32 ulps) from the
    # CPU's. Over 3 layers and logits up to ~7 that is ~1e-6 (1e-4 leaves a margin), while a
    # wrong mask, position or block changes which keys a row reads: far more than 1e-4.
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)
    served = StaticLlama(
        tiny_llama(0, layers=3), device="cuda", weights=torch.float32, group_slots=2, rows=4,
        capacity=2 * ATTENTION_BLOCK, slots=8,
    )  # fmt: skip
    assert served.capture_windows() > 0  # both windows, before the first forward
    requests = []
    for i in range(5):
        src = KeyedSource(Secret((40 + i).to_bytes(32, "little")), 4, True, i)
        prompt = [(7 * i + 3 * j) % VOCAB for j in range(1 + 2 * i)]
        want = generate(served, prompt, SamplerConfig("basic-uwm", max_new_tokens=20), src)
        config = SamplerConfig("mpfr", 4, 3, 20)
        got = generate(served, prompt, config, src, NgramDrafter(VOCAB))
        assert got.token_ids == want.token_ids
        requests.append((prompt, config, src, NgramDrafter(VOCAB), want.token_ids))
    own = [(p, c, s, fresh_drafter(d)) for p, c, s, d, _ in requests]
    batched = generate_many(served, own, max_batch=5)
    assert [r.token_ids for r in batched] == [w for *_, w in requests]
