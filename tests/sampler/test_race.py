"""Race primitives against theory: MPFR draws are i.i.d. from P (MPFR paper Thm. A.5), the keyed
race samples the processed law (case C6), the multi-draft coupling keeps the target law (C10)
and its acceptance respects Theorem 5.1."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from keyed import KeyedSource, Secret, label_key
from keyed.tensor import exponential_clocks, keys_tensor
from sampler.policies import History, KeyedRace, context_keys, race_targets
from sampler.processing import Processing, Support, process
from sampler.race import acceptance_lower_bound, mpfr_samples, race_winner
from sampler.tree import DraftTree
from tests.sampler.conftest import C10_CASES

N_KEYS = 20_000
# Every statistical assertion below uses α = 0.001: with fixed keys the tests are deterministic,
# and a correct implementation fails one of them with probability 0.1 % per assertion.
ALPHA = 1e-3


def many_keys(n: int, tag: int = 0) -> torch.Tensor:
    secret = Secret(bytes([tag]) * 32)
    return keys_tensor([label_key(secret, (i, tag)) for i in range(n)])  # (n, 2)


def chisquare_p(counts: np.ndarray, probs: np.ndarray) -> float:
    mask = probs > 0
    assert counts[~mask].sum() == 0, "a zero-probability outcome occurred"
    expected = probs[mask] / probs[mask].sum() * counts.sum()  # table values are rounded
    return float(stats.chisquare(counts[mask], expected).pvalue)


P = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05], dtype=torch.float64)


def test_mpfr_draws_are_iid_from_p():
    """Thm. A.5: the B = 3 smallest mapped-Poisson scores carry i.i.d. samples of P."""
    keys = many_keys(N_KEYS)
    tokens = torch.arange(5).expand(N_KEYS, 5)
    logp = P.log().expand(N_KEYS, 5)
    clocks = exponential_clocks(keys, tokens, 3)  # (N, 5, 3)
    draws = np.array(mpfr_samples(logp, tokens, clocks, [3] * N_KEYS))  # (N, 3)
    p = P.numpy()
    for i in range(3):
        counts = np.bincount(draws[:, i], minlength=5)
        assert chisquare_p(counts, p) > ALPHA, f"draw {i} marginal"
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        joint = np.bincount(draws[:, i] * 5 + draws[:, j], minlength=25)
        assert chisquare_p(joint, np.outer(p, p).ravel()) > ALPHA, f"draws {i},{j} not independent"


def test_mpfr_first_draw_is_the_race_winner():
    keys = many_keys(500, tag=3)
    tokens = torch.arange(5).expand(500, 5)
    logp = P.log().expand(500, 5)
    clocks = exponential_clocks(keys, tokens, 4)
    first = [d[0] for d in mpfr_samples(logp, tokens, clocks, [4] * 500)]
    assert first == race_winner(logp, tokens, clocks[..., 0]).tolist()


def test_mpfr_respects_counts_and_empty_support():
    logp = torch.tensor([[0.0, -torch.inf], [-torch.inf, -torch.inf]], dtype=torch.float64)
    tokens = torch.tensor([[7, 9], [7, 9]])
    clocks = exponential_clocks(many_keys(2, tag=4), tokens, 3)
    out = mpfr_samples(logp, tokens, clocks, [3, 2])
    assert out == [[7, 7, 7], []]
    assert race_winner(logp, tokens, clocks[..., 0]).tolist() == [7, -1]


def test_case_c6_keyed_race_follows_processed_law():
    """C6: logits [2, 1, 0.5], T = 0.7, top-k 2 -> [0.80668, 0.19332, 0]."""
    support = process(torch.tensor([[2.0, 1.0, 0.5]]), Processing(0.7, 2, 1.0))
    keys = many_keys(N_KEYS, tag=5)
    tokens = support.tokens.expand(N_KEYS, -1)
    logp = support.logp.expand(N_KEYS, -1)
    winners = race_winner(logp, tokens, exponential_clocks(keys, tokens, 1)[..., 0]).numpy()
    counts = np.bincount(winners, minlength=3)
    assert counts[2] == 0
    assert chisquare_p(counts, np.array([0.80668, 0.19332, 0.0])) > ALPHA
    wrong_order = np.array([0.6285, 0.2312, 0.1402])  # keying before warping: must be rejected
    assert chisquare_p(counts, wrong_order) < 1e-12


@pytest.mark.parametrize(("p_logits", "q_logits", "processing", "expected"), C10_CASES)
@pytest.mark.parametrize("drafts", [1, 4])
def test_case_c10_multidraft_coupling_keeps_target_law(
    p_logits, q_logits, processing, expected, drafts
):
    """C10 for one MPFR level: drafts from Q_k and the target winner share clocks; the emitted
    token is the target winner, so its law is P_k whatever Q is; acceptance >= Thm. 5.1."""
    if processing is None:  # given as probabilities
        p_raw, q_raw, processing = (
            torch.tensor([p_logits]).log(),
            torch.tensor([q_logits]).log(),
            Processing(1.0, 0, 1.0),
        )
    else:
        p_raw, q_raw = torch.tensor([p_logits]), torch.tensor([q_logits])
    ps, qs = process(p_raw, processing), process(q_raw, processing)
    keys = many_keys(N_KEYS, tag=6 + drafts)
    # clocks for the union of the two supports, token by token
    tokens = torch.arange(3 if len(p_logits) == 3 else 2).expand(N_KEYS, -1)
    clocks = exponential_clocks(keys, tokens, drafts)
    dense_p = (
        torch.full((1, tokens.shape[1]), -torch.inf, dtype=torch.float64)
        .scatter(1, ps.tokens, ps.logp)
        .expand(N_KEYS, -1)
    )
    dense_q = (
        torch.full((1, tokens.shape[1]), -torch.inf, dtype=torch.float64)
        .scatter(1, qs.tokens, qs.logp)
        .expand(N_KEYS, -1)
    )
    emitted = race_winner(dense_p, tokens, clocks[..., 0]).numpy()
    drafted = mpfr_samples(dense_q, tokens, clocks, [drafts] * N_KEYS)
    accepted = np.mean([e in d for e, d in zip(emitted.tolist(), drafted, strict=True)])
    counts = np.bincount(emitted, minlength=len(expected))
    assert chisquare_p(counts, np.array(expected)) > ALPHA
    bound = acceptance_lower_bound(dense_p[0].exp(), dense_q[0].exp(), drafts)
    # binomial standard error at n = 20,000 is <= 0.0036; 4 sigma slack keeps α well below 0.001
    assert accepted >= bound - 4 * 0.0036, (accepted, bound)


def test_acceptance_bound_values():
    same = torch.tensor([0.5, 0.5], dtype=torch.float64)
    # P = Q: 1 − Σ p (1/2)^B
    assert acceptance_lower_bound(same, same, 1) == pytest.approx(0.5)
    assert acceptance_lower_bound(same, same, 4) == pytest.approx(1 - 1 / 16)
    disjoint = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert acceptance_lower_bound(disjoint, torch.tensor([0.0, 1.0]), 3) == pytest.approx(0.0)


def test_race_targets_of_several_trees_are_each_trees_alone():
    """``policies.race_targets`` races the nodes of several trees (a lone root, a chain, a
    branching tree; masking on, one history inside the prompt window) in one pass: every
    node's winner is the one its tree gets alone, and the law with torch's clocks agrees."""
    lone = DraftTree(5, 1)
    chain = DraftTree(7, 1)
    chain.add_drafts(0, [8])
    chain.add_drafts(1, [9])
    branching = DraftTree(3, 3)
    branching.add_drafts(0, [4, 6, 4])
    histories = [
        History([1, 2, 3, 4, 5, 6, 7, 5], 3, 4),
        History([9, 9, 7], 2, 4),  # inside the prompt window: the nonce stream
        History([2, 4, 6, 8, 10, 12, 3], 1, 4),
    ]
    trees = [lone, chain, branching]
    policies = [KeyedRace(KeyedSource(Secret(bytes([i]) * 32), 4, True, 40 + i)) for i in range(3)]
    rows = sum(len(t) for t in trees)
    laws = process(torch.randn((rows, 500), generator=torch.Generator().manual_seed(9)),
                   Processing(1.0, 50, 1.0))  # fmt: skip
    together = race_targets(list(zip(policies, trees, histories, strict=True)), laws)
    start = 0
    for policy, tree, history, target in zip(policies, trees, histories, together, strict=True):
        alone = Support(
            laws.tokens[start : start + len(tree)], laws.logp[start : start + len(tree)]
        )
        by_itself = policy.targets(tree, alone, history)
        for node in range(len(tree)):
            assert target(node) == by_itself(node)
            keys = context_keys(tree, [node], policy.source, history)
            clocks = exponential_clocks(keys, alone.tokens[node : node + 1], 1)[..., 0]
            expected = race_winner(
                alone.logp[node : node + 1], alone.tokens[node : node + 1], clocks
            )
            assert target(node) == int(expected[0])
        start += len(tree)
