"""Fresh samples per nonce, and detection power, on the real model (docs/design.md §2).

With masking on, repeated contexts and the first m response positions draw their clocks from
the per-request nonce stream, so the same key and prompt with another nonce give another exact
sample, while the keyed positions keep the watermark. One key (m = 4), ``PROMPTS`` shared
prompts, ``basic-uwm`` (whose tokens ``mpfr`` equals for every drafter, held exactly by
tests/sampler):

- diversity: ``NONCES`` nonces per prompt, ``DIVERSITY_TOKENS`` new tokens; most prompts
  (more than half) give at least 9 distinct outputs of 10;
- power: ``POWER_NONCES`` nonces per prompt × ``POWER_TOKENS`` new tokens, detected from the
  decoded text: TPR at α = 0.01 (the p-values are valid, so this is TPR at 1 % FPR) >= 0.9.

Outputs are a deterministic function of (key, nonce, prompt, backend), so each check repeats
exactly on one backend. The last full run (17 of 20 prompts with >= 9 distinct, TPR 1.0):
``bench/results/nonce_diversity24_after.json``, ``nonce_power64_after.json``. ~17 min on 2 CPU
cores (marker ``slow``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from detector import detect
from keyed import KeyedSource, Secret
from sampler.completion import chat_prompt_ids, eos_ids
from sampler.decoder import GenerationResult, SamplerConfig, generate
from sampler.models import LoadedModel

pytestmark = [pytest.mark.slow, pytest.mark.realmodel, pytest.mark.timeout(3600)]

PROMPTS = 20
NONCES = 10
DIVERSITY_TOKENS = 24
POWER_NONCES = 2
POWER_TOKENS = 64
WIDTH = 4
SECRET = Secret(hashlib.blake2b(b"poissonmark-bench:nonce-diversity", digest_size=32).digest())


def shared_prompts(data_files: Path, n: int) -> list[dict]:
    """n prompts, half ELI5 and half summarisation, chosen by a fixed hash of their id."""
    chosen: list[dict] = []
    for name in ("prompts-eli5.jsonl", "prompts-summarize.jsonl"):
        rows = [json.loads(line) for line in (data_files / name).read_text().splitlines()]
        rows.sort(key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
        chosen += rows[: n // 2]
    return chosen


def _generate(loaded: LoadedModel, ids: list[int], nonce: int, tokens: int) -> GenerationResult:
    source = KeyedSource(SECRET, WIDTH, True, nonce)
    config = SamplerConfig("basic-uwm", max_new_tokens=tokens)
    return generate(loaded.target, ids, config, source, eos_ids=eos_ids(loaded))


def test_other_nonces_give_other_samples(real_model: LoadedModel, data_files: Path) -> None:
    distinct = []
    for row in shared_prompts(data_files, PROMPTS):
        ids = chat_prompt_ids(real_model.tokenizer, messages=row["messages"])
        outputs = {
            _generate(real_model, ids, 1000 + j, DIVERSITY_TOKENS).token_ids for j in range(NONCES)
        }
        distinct.append(len(outputs))
    assert sum(d >= 9 for d in distinct) > PROMPTS // 2, distinct


def test_every_nonce_keeps_the_watermark(real_model: LoadedModel, data_files: Path) -> None:
    source = KeyedSource(SECRET, WIDTH, True)
    log10_p = []
    for row in shared_prompts(data_files, PROMPTS):
        ids = chat_prompt_ids(real_model.tokenizer, messages=row["messages"])
        for j in range(POWER_NONCES):
            result = _generate(real_model, ids, 2000 + j, POWER_TOKENS)
            text = real_model.tokenizer.decode(list(result.token_ids), skip_special_tokens=False)
            log10_p.append(
                detect(real_model.tokenizer, source, text=text).scores["aaronson"].log10_p_value
            )
    assert sum(v < -2.0 for v in log10_p) / len(log10_p) >= 0.9, log10_p
