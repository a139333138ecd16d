"""Every test reported beside the verdict is valid under H0, on human and repetitive text.

The tests that read the target's law (``entropy_weighting``, ``likelihood_ratio``,
``edit_filter``: ``detector.weighted``) have key-independent weights, so under H0 the scored
pivots stay i.i.d. U(0, 1) given the weights and each p is exact or a valid bound
(docs/design.md §4). This checks it end to end on the real model, where the repeated-context
rule leaves few and oddly placed scored positions too:

- human: the 227 passages of ``data/human-pydoc.jsonl`` × ``HUMAN_KEYS`` keys;
- repetitive: ``REPETITIVE_TEXTS`` id sequences of ``helpers.repetitive_ids`` (fixed seed) ×
  ``REPETITIVE_KEYS`` keys.

For each test and α in ``ALPHAS`` the count of p < α must not exceed the 99.5 % quantile of
Binomial(N, α): a valid test exceeds it with probability <= 0.005 per comparison (16
comparisons, so a valid detector fails this file with probability <= 0.08 by a union bound; the
keys and texts are fixed, so a pass or a failure repeats). The law is read as the service reads
it without a prompt: after BOS, through the served backend, with the generate defaults T = 1,
top-k 50. ~15 min on 2 CPU cores (marker ``slow``). Result of the last full run:
``bench/results/detector_exposed_h0.json``.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from scipy import stats

from detector import DetectOptions, detect
from detector.weighted import entropy_weighted_test, likelihood_ratio_test, rank_filtered_test
from keyed import KeyedSource, Secret
from sampler.entropy import position_laws
from sampler.models import LoadedModel
from sampler.processing_config import Processing
from tests.detector.helpers import repetitive_ids

pytestmark = [pytest.mark.slow, pytest.mark.realmodel, pytest.mark.timeout(3600)]

ALPHAS = (0.01, 0.1)
HUMAN_KEYS = 20
REPETITIVE_TEXTS = 300
REPETITIVE_KEYS = 10
REPETITIVE_SEED = 20261204
WIDTH = 4
PROCESSING = Processing(temperature=1.0, top_k=50)
TESTS = ("plain", "entropy_weighted", "likelihood_ratio", "edit_filtered")


def _source(name: str) -> KeyedSource:
    """A fixed public test key (BLAKE2b of a name), m = 4, masking on."""
    secret = Secret(hashlib.blake2b(name.encode(), digest_size=32).digest())
    return KeyedSource(secret, context_width=WIDTH, masking=True)


def log_p_values(
    loaded: LoadedModel, ids: list[int], prefix: list[int], keys: int, tag: str
) -> dict[str, list[float]]:
    """ln p of every test for ``ids`` under ``keys`` keys: {test: [ln p per key]}. The law is
    computed once per text: the weights do not depend on the key."""
    laws = position_laws(loaded.target, ids, PROCESSING, prefix=prefix)
    entropy = laws.entropy.numpy()
    logp = laws.token_logp.numpy()
    rank = laws.raw_rank.numpy()
    out: dict[str, list[float]] = {t: [] for t in TESTS}
    for k in range(keys):
        found = detect(
            loaded.tokenizer,
            _source(f"h0-exposed-{tag}-{k}"),
            token_ids=ids,
            options=DetectOptions(),
        )
        skip = found.evidence.skip
        terms = found.evidence.terms["aaronson"]
        out["plain"].append(found.p_value.log10_p_value * math.log(10))
        out["entropy_weighted"].append(entropy_weighted_test(skip, terms, entropy).log_p)
        out["likelihood_ratio"].append(likelihood_ratio_test(skip, terms, logp).log_p)
        out["edit_filtered"].append(rank_filtered_test(skip, terms, rank, WIDTH).log_p)
    return out


def excess_rejections(log_p: dict[str, list[float]]) -> list[str]:
    """Each (test, α) whose rejection count exceeds the Binomial(N, α) 99.5 % quantile."""
    n = len(log_p["plain"])
    over = []
    for a in ALPHAS:
        bound = int(stats.binom.ppf(0.995, n, a))
        for t in TESTS:
            count = sum(v < math.log(a) for v in log_p[t])
            if count > bound:
                over.append(f"{t} at α={a}: {count} of {n} > {bound}")
    return over


def _pooled(loaded: LoadedModel, corpus: list[list[int]], keys: int, tag: str) -> dict:
    tok = loaded.tokenizer
    prefix = [tok.bos_token_id] if tok.bos_token_id is not None else []
    pooled: dict[str, list[float]] = {t: [] for t in TESTS}
    for ids in corpus:
        for t, v in log_p_values(loaded, ids, prefix, keys, tag).items():
            pooled[t] += v
    return pooled


def test_exposed_tests_hold_their_level_on_human_text(
    real_model: LoadedModel, human_passages: list[str]
) -> None:
    tok = real_model.tokenizer
    corpus = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in human_passages]
    assert excess_rejections(_pooled(real_model, corpus, HUMAN_KEYS, "human")) == []


def test_exposed_tests_hold_their_level_on_repetitive_text(real_model: LoadedModel) -> None:
    rng = np.random.default_rng(REPETITIVE_SEED)
    corpus = [repetitive_ids(rng, i % 3) for i in range(REPETITIVE_TEXTS)]
    assert excess_rejections(_pooled(real_model, corpus, REPETITIVE_KEYS, "repetitive")) == []
