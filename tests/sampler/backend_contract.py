"""What every tree-invariant target backend must do in the decoder, checked the same way for each
(``tests/sampler/test_invariant.py``, ``test_static_target.py``) on a tiny random Llama:
MPFR/PFR emit BASIC-UWM's tokens whatever the drafter (MPFR paper Thm. 5.1), and continuous
batching gives every request its solo tokens."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from keyed import KeyedSource
from sampler.batch import generate_many
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import NgramDrafter, fresh_drafter, self_drafter
from sampler.processing import Processing
from sampler.targets.base import Target
from tests.sampler.conftest import VOCAB

SPECULATIVE_CONFIGS = [
    pytest.param(SamplerConfig("mpfr", 4, 3, 24), id="mpfr_B4L3"),
    pytest.param(SamplerConfig("mpfr", 2, 5, 24, Processing(0.7, 20, 0.9)), id="mpfr_B2L5_warm"),
    pytest.param(SamplerConfig("mpfr", 4, 3, 24, tree="auto"), id="mpfr_auto"),
    pytest.param(SamplerConfig("pfr", 1, 4, 24), id="pfr_L4"),
]
"""The speculative configurations each backend is checked under."""


def assert_speculative_equals_basic_uwm(
    target: Target, config: SamplerConfig, source: Callable[[int], KeyedSource]
) -> None:
    """Three prompts, ``ngram`` and ``self:1`` drafters: ``config`` emits BASIC-UWM's tokens for
    the same key (``source(i)``), and some drafts were accepted (trees shared forwards)."""
    basic = SamplerConfig("basic-uwm", max_new_tokens=config.max_new_tokens,
                          processing=config.processing)  # fmt: skip
    accepted = 0
    for i in range(3):
        prompt = [(11 * i + 5 * j + 1) % VOCAB for j in range(2 + 3 * i)]
        want = generate(target, prompt, basic, source(i)).token_ids
        for drafter in (NgramDrafter(VOCAB), self_drafter(target.model, 1)):
            got = generate(target, prompt, config, source(i), drafter)
            assert got.token_ids == want
            accepted += sum(got.stats.accepted_per_level)
    assert accepted > 0


def assert_batched_equals_solo(
    target: Target, source: Callable[[int], KeyedSource], max_batch: int, node_budget: int
) -> None:
    """Five mixed requests (mpfr, basic-uwm, processed, pfr) stepped together, ``max_batch`` at
    a time under ``node_budget``: each request's tokens equal its solo run."""
    requests = []
    for i, config in enumerate(
        [SamplerConfig("mpfr", 4, 3, 20), SamplerConfig("basic-uwm", max_new_tokens=14),
         SamplerConfig("mpfr", 2, 2, 17, Processing(0.7, 20, 0.9)),
         SamplerConfig("pfr", 1, 3, 9), SamplerConfig("mpfr", 3, 4, 12)]
    ):  # fmt: skip
        drafter = NgramDrafter(VOCAB) if config.speculative else None
        requests.append(
            ([(7 * i + 3 * j) % VOCAB for j in range(1 + 2 * i)], config, source(i), drafter)
        )
    solo = [generate(target, p, c, s, fresh_drafter(d) if d else None) for p, c, s, d in requests]
    own = [(p, c, s, fresh_drafter(d) if d else None) for p, c, s, d in requests]
    batched = generate_many(target, own, max_batch=max_batch, node_budget=node_budget)
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
