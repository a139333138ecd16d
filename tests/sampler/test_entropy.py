"""The processed target entropy per position (``sampler.entropy``), and the weighted test's H0
on human text with the real model's entropies as weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import binom
from transformers import LlamaForCausalLM

from detector.weighted import entropy_weighted_test
from keyed import detection_plan_arrays, label_key_words, pivot_array
from sampler.entropy import position_laws, processed_entropy, support_entropy
from sampler.models import LoadedModel
from sampler.processing import Processing, dense_logp, process
from tests.detector.helpers import fixed_secret
from tests.sampler.conftest import VOCAB

IDS = [3, 5, 7, 1, 9, 12, 40, 2, 2, 2, 8, 63, 0, 17]


def direct_entropy(model: LlamaForCausalLM, ids: list[int], processing: Processing) -> np.ndarray:
    """H of the processed law of token t given ids[:t], t >= 1, from one full forward and the
    dense law: −Σ_v p_v ln p_v over the vocabulary."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]  # (T - 1, V)
    logp = dense_logp(process(logits, processing), VOCAB)
    p = logp.exp()
    return (-(torch.where(p > 0, p * logp, torch.zeros_like(p))).sum(-1)).numpy()


@pytest.mark.parametrize(
    "processing",
    [
        pytest.param(Processing(1.0, 0, 1.0), id="T1"),
        pytest.param(Processing(0.7, 0, 0.95), id="T07_topp095"),
        pytest.param(Processing(1.3, 5, 1.0), id="T13_top5"),
        pytest.param(Processing(0.5, 10, 0.8), id="T05_top10_topp08"),
    ],
)
@pytest.mark.parametrize("chunk", [3, 128])
def test_matches_a_direct_computation(
    target: LlamaForCausalLM, processing: Processing, chunk: int
) -> None:
    got = processed_entropy(target, IDS, processing, chunk=chunk).numpy()
    assert got.shape == (len(IDS),)
    assert got[0] == 0.0  # no prefix: position 0 has no context
    np.testing.assert_allclose(got[1:], direct_entropy(target, IDS, processing), rtol=1e-10)


def test_prefix_conditions_position_zero(target: LlamaForCausalLM) -> None:
    processing = Processing(0.7, 0, 0.95)
    got = processed_entropy(target, IDS, processing, prefix=[1], chunk=4).numpy()
    whole = direct_entropy(target, [1, *IDS], processing)  # positions 1.. of [1, *IDS]
    np.testing.assert_allclose(got, whole, rtol=1e-10)


def test_support_entropy_closed_forms() -> None:
    uniform = torch.log(torch.full((1, 8), 1 / 8, dtype=torch.float64))
    one = torch.tensor([[0.0, -math.inf, -math.inf]], dtype=torch.float64)
    assert support_entropy(uniform).item() == pytest.approx(math.log(8), rel=1e-14)
    assert support_entropy(one).item() == 0.0


def test_greedy_and_empty(target: LlamaForCausalLM) -> None:
    assert processed_entropy(target, IDS, Processing(0.0, 50, 1.0)).abs().sum() == 0.0
    assert processed_entropy(target, [], Processing()).shape == (0,)


def test_errors_name_the_input(target: LlamaForCausalLM) -> None:
    with pytest.raises(ValueError, match="chunk"):
        processed_entropy(target, IDS, Processing(), chunk=0)
    with pytest.raises(ValueError, match=r"ids in \[0, 64\)"):
        processed_entropy(target, [1, 64], Processing())
    with pytest.raises(ValueError, match="at most 512 tokens"):
        processed_entropy(target, [1] * 513, Processing())


@pytest.mark.realmodel
def test_weighted_h0_on_human_text_with_model_entropies(
    real_model: LoadedModel, data_files: Path
) -> None:
    """Human passages (their first 96 tokens) under 60 fixed keys, weights from SmolLM2's
    entropies at T = 0.7, top-p 0.95: the weights do not depend on the key, so the weighted p
    is exact under H0 and the rejections at α = 0.05 are at most Binomial(N, α) — checked
    against its 99.9 % upper quantile (0.1 % false alarm; α = 0.05 rather than 0.01 so that
    N = 480 tests can show a miscalibration). Fails if the weights leaked key information or
    the tail were too small."""
    tokenizer = real_model.tokenizer
    processing = Processing(0.7, 0, 0.95)
    with (data_files / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f][:8]
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    log_p = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:96]
        entropy = processed_entropy(
            real_model.target, ids, processing, prefix=[tokenizer.bos_token_id]
        ).numpy()
        token_ids = np.array(ids, dtype=np.int64)
        plan = detection_plan_arrays(token_ids, 4, special)
        for k in range(60):
            keys = label_key_words(fixed_secret(f"entropy-h0-{k}"), plan.labels)  # (M, 2)
            terms = -np.log1p(-pivot_array(keys, token_ids[plan.scored]))  # (M,)
            log_p.append(entropy_weighted_test(plan.skip, terms, entropy).log_p)
    alpha = 0.05
    rejected = int(np.sum(np.array(log_p) < math.log(alpha)))
    assert rejected <= binom.ppf(0.999, len(log_p), alpha), rejected


@pytest.mark.parametrize(
    "processing",
    [
        pytest.param(Processing(1.0, 0, 1.0), id="T1"),
        pytest.param(Processing(0.7, 5, 0.9), id="T07_top5_topp09"),
        pytest.param(Processing(0.0, 50, 1.0), id="greedy"),
    ],
)
def test_position_laws_match_a_direct_computation(
    target: LlamaForCausalLM, processing: Processing
) -> None:
    """The own token's processed ln p (−inf outside the support) and its raw rank, against
    the dense law of one full forward; the entropy is ``processed_entropy``'s."""
    laws = position_laws(target, IDS, processing, prefix=[1], chunk=5)
    with torch.no_grad():
        logits = target(torch.tensor([[1, *IDS]])).logits[0, :-1]  # (T, V): row t -> IDS[t]
    own = torch.tensor(IDS)[:, None]
    logp = dense_logp(process(logits, processing), VOCAB).gather(1, own)[:, 0]
    rank = (logits > logits.gather(1, own)).sum(-1)
    torch.testing.assert_close(laws.token_logp, logp, rtol=1e-10, atol=1e-12)
    assert torch.equal(laws.raw_rank, rank)
    whole = processed_entropy(target, IDS, processing, prefix=[1])  # one chunk: float64 rounding
    torch.testing.assert_close(laws.entropy, whole, rtol=1e-10, atol=1e-12)
    if processing.top_k == 5:  # some of the text's tokens fall outside the top 5
        assert bool(torch.isneginf(laws.token_logp).any()) and bool((rank >= 5).any())
    if processing.greedy:
        assert set(laws.token_logp.tolist()) <= {0.0, -math.inf}


def test_position_laws_without_prefix_leave_position_zero_empty(target: LlamaForCausalLM) -> None:
    laws = position_laws(target, IDS, Processing())
    assert (laws.entropy[0], laws.token_logp[0], laws.raw_rank[0]) == (0.0, 0.0, 0)
    assert position_laws(target, [], Processing()).raw_rank.shape == (0,)
