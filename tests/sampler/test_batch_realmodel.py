"""Continuous batching on the real SmolLM2-135M-Instruct (float32): ``complete_many``
gives each request the tokens ``complete`` gives it alone. A batched forward rounds floats
differently from a solo one, so a near-tie of the race can flip: the issue allows 1 in 20."""

from __future__ import annotations

import json

import pytest

from keyed import KeyedSource, Secret
from sampler.completion import CompletionRequest, complete, complete_many, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.processing import Processing

pytestmark = pytest.mark.realmodel


def _requests(real_model, data_files, count: int, tokens: int, mixed: bool):  # type: ignore[no-untyped-def]
    lines = (data_files / "prompts-eli5.jsonl").read_text().splitlines()[:count]
    out = []
    for i, line in enumerate(lines):
        ids = prompt_ids(real_model, messages=json.loads(line)["messages"])
        config = SamplerConfig("mpfr", 4, 4, tokens)
        drafter: str | None = "ngram"
        if mixed:  # methods, processing, B, L and drafters differ request to request
            config = [
                SamplerConfig("mpfr", 4, 4, tokens),
                SamplerConfig("basic-uwm", max_new_tokens=tokens - 5),
                SamplerConfig("pfr", 1, 3, tokens, Processing(0.8, 50, 0.95)),
                SamplerConfig("mpfr", 2, 2, tokens - 9, Processing(1.0, 0, 0.9)),
                SamplerConfig("ar", max_new_tokens=tokens),
                SamplerConfig("mpfr", 3, 4, tokens, Processing(0.7, 0, 1.0)),
            ][i % 6]
            drafter = ["ngram", None, "heads", "self:8", None, "heads"][i % 6]
        source = KeyedSource(Secret(bytes([i + 7]) * 32), 4, True, 31 * i)
        out.append(CompletionRequest(ids, config, source, drafter))
    return out


def _agreeing(real_model, requests, max_batch: int) -> int:  # type: ignore[no-untyped-def]
    batched = complete_many(real_model, requests, max_batch=max_batch)
    solo = [complete(real_model, r.ids, r.config, r.source, r.drafter) for r in requests]
    return sum(b.result.token_ids == s.result.token_ids for b, s in zip(batched, solo, strict=True))


def test_batched_equals_solo_mixed_real_model(real_model, data_files) -> None:  # type: ignore[no-untyped-def]
    """Six mixed requests (mpfr, basic-uwm, pfr, ar; ngram, heads, self:8), 4 at a time."""
    requests = _requests(real_model, data_files, 6, 24, mixed=True)
    assert _agreeing(real_model, requests, max_batch=4) >= 5


@pytest.mark.slow
def test_batched_equals_solo_20_prompts_128_tokens(real_model, data_files) -> None:  # type: ignore[no-untyped-def]
    """The issue's bar: mpfr, 128 tokens, 20 prompts, 8 at a time: >= 19 of 20 identical."""
    requests = _requests(real_model, data_files, 20, 128, mixed=False)
    assert _agreeing(real_model, requests, max_batch=8) >= 19


@pytest.fixture(scope="module")
def real_model_bf16(data_dir):  # type: ignore[no-untyped-def]
    """The real model on the row-invariant bfloat16 runner (``sampler.targets.cpu_bf16``)."""
    from sampler.models import DEFAULT_MODEL, load_model
    from sampler.targets.cpu_bf16 import RowInvarianceError

    try:
        return load_model(DEFAULT_MODEL, data_dir, device="cpu", precision="bfloat16")
    except RowInvarianceError as refused:  # the runner's answer on such a CPU: float32 only
        pytest.skip(f"bfloat16 kernels not row-invariant on this CPU: {refused}")


def test_bfloat16_batched_equals_solo_mixed_real_model(real_model_bf16, data_files) -> None:  # type: ignore[no-untyped-def]
    """The same six mixed requests on the bfloat16 runner: row-invariant kernels leave no
    near-tie to flip, so all six are identical (no 1-in-20 allowance)."""
    requests = _requests(real_model_bf16, data_files, 6, 24, mixed=True)
    assert _agreeing(real_model_bf16, requests, max_batch=4) == 6


def test_bfloat16_mpfr_equals_basic_uwm_real_model(real_model_bf16, data_files) -> None:  # type: ignore[no-untyped-def]
    """Thm. 5.1 on the real model in bfloat16: mpfr (heads B4 L4, ngram B2 L3) emits
    basic-uwm's tokens on every prompt, and drafts were accepted (trees shared forwards)."""
    requests = _requests(real_model_bf16, data_files, 3, 40, mixed=False)
    accepted = 0
    for r in requests:
        want = complete(
            real_model_bf16, r.ids, SamplerConfig("basic-uwm", max_new_tokens=40), r.source
        )
        for config, drafter in ((SamplerConfig("mpfr", 4, 4, 40), "heads"),
                                (SamplerConfig("mpfr", 2, 3, 40), "ngram")):  # fmt: skip
            got = complete(real_model_bf16, r.ids, config, r.source, drafter)
            assert got.result.token_ids == want.result.token_ids
            accepted += sum(got.result.stats.accepted_per_level)
    assert accepted > 0


@pytest.mark.slow
def test_bfloat16_batched_equals_solo_20_prompts_128_tokens(real_model_bf16, data_files) -> None:  # type: ignore[no-untyped-def]
    """The issue's bar on the bfloat16 runner: 20 of 20 identical."""
    requests = _requests(real_model_bf16, data_files, 20, 128, mixed=False)
    assert _agreeing(real_model_bf16, requests, max_batch=8) == 20
