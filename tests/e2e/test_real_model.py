"""End to end on the real SmolLM2-135M-Instruct (CPU, float32): MPFR equals keyed AR decoding,
and watermarked generations are detected (MPFR paper Prop. 4.4, Alg. 8)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from detector import detect
from keyed import KeyedSource, Secret
from sampler.completion import complete, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.models import LoadedModel

# generating 20 x 128 tokens in the module fixture counts against the first test's timeout
pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(3600)]

N_PROMPTS = 20
NEW_TOKENS = 128
EQUAL_TOKENS = 64


def shared_prompts(data_files: Path, n: int) -> list[dict]:
    """n prompts, half ELI5 and half summarisation, chosen by a fixed hash of their id."""
    chosen = []
    for name in ("prompts-eli5.jsonl", "prompts-summarize.jsonl"):
        rows = [json.loads(line) for line in (data_files / name).read_text().splitlines()]
        rows.sort(key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
        chosen += rows[: n // 2]
    return chosen


def key_for(i: int) -> KeyedSource:
    return KeyedSource(Secret(hashlib.sha256(b"e2e-key-%d" % i).digest()), 4, True, nonce=i)


@pytest.fixture(scope="module")
def generations(real_model: LoadedModel, data_files: Path) -> list[dict]:
    """basic-uwm completions (T = 1, top-k 50, 128 new tokens) of 20 shared prompts."""
    out = []
    for i, row in enumerate(shared_prompts(data_files, N_PROMPTS)):
        ids = prompt_ids(real_model, messages=row["messages"])
        done = complete(
            real_model, ids, SamplerConfig("basic-uwm", max_new_tokens=NEW_TOKENS), key_for(i)
        )
        out.append(
            {"id": row["id"], "prompt": ids, "ids": list(done.result.token_ids), "text": done.text}
        )
    return out


def test_mpfr_equals_basic_uwm_on_real_model(real_model: LoadedModel, generations):
    """mpfr (B = 4, L = 4; drafter ngram (chains) on 12 prompts, early-exit self:4 (branching
    trees; ~3x slower on CPU) on four, the shipped trained heads (branching trees) on four)
    reproduces keyed AR decoding token for token on >= 19 of 20 prompts x 64 tokens. float32
    tree logits can differ from single-token logits in the last bits, so a near-tie between the
    top two race scores may flip; any divergence is reported with the target's top-2 logit gap
    there."""
    equal, report = 0, []
    for i, g in enumerate(generations):
        done = complete(
            real_model,
            g["prompt"],
            SamplerConfig("mpfr", 4, 4, EQUAL_TOKENS),
            key_for(i),
            {1: "self:4", 3: "heads"}.get(i % 5, "ngram"),
        )
        got, want = list(done.result.token_ids), g["ids"][:EQUAL_TOKENS]
        if got == want:
            equal += 1
            continue
        at = next(
            (k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
            min(len(got), len(want)),
        )
        with torch.inference_mode():
            logits = real_model.model(torch.tensor([g["prompt"] + want[:at]])).logits[0, -1]
        top2 = torch.topk(logits.double(), 2).values
        report.append(
            f"{g['id']}: diverges at token {at}, top-2 logit gap {float(top2[0] - top2[1]):.3g}"
        )
    print("\n".join(report))
    assert equal >= 19, report


def test_watermarked_generations_are_detected(real_model: LoadedModel, generations):
    """H1: watermarked generations (128 new tokens) detected at α = 0.01; >= 90 % expected.
    The rate is printed; the assertion is the issue's 90 % floor."""
    flagged, rows = 0, []
    for i, g in enumerate(generations):
        source = key_for(i)
        result = detect(real_model.tokenizer, source, token_ids=g["ids"], text=g["text"])
        a = result.scores["aaronson"]
        assert math.isfinite(a.log10_p_value)
        rows.append((g["id"], result.num_scored, round(a.log10_p_value, 2), result.verdict.value))
        flagged += result.verdict.value == "watermarked"
    rate = flagged / len(generations)
    print(f"detection rate at alpha=0.01: {rate:.2f}", *rows, sep="\n")
    assert rate >= 0.9, rows


def test_detection_from_text_alone(real_model: LoadedModel, generations):
    """The product path: only the completion text comes back (C3); it is detected from text."""
    detected = sum(
        detect(real_model.tokenizer, key_for(i), text=g["text"]).verdict.value == "watermarked"
        for i, g in enumerate(generations)
    )
    assert detected >= 0.9 * len(generations)


def test_wrong_key_does_not_detect(real_model: LoadedModel, generations):
    """Under another key the same texts are human text as far as the detector knows: at
    α = 0.01 more than 2 flags of 20 has probability < 0.001 under H0."""
    other = KeyedSource(Secret(b"\x07" * 32), 4, True)
    flagged = sum(
        detect(real_model.tokenizer, other, token_ids=g["ids"]).verdict.value == "watermarked"
        for g in generations
    )
    assert flagged <= 2
