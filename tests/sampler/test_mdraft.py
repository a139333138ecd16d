"""MDraft objectives (MDraft paper §4.5, App. C Table 3): exact identities and the two-branch
example's optima, found by minimising our loss functions themselves."""

from __future__ import annotations

import math

import pytest
import torch

from sampler.training.mdraft import (
    Objective,
    acceptance_probabilities,
    blended_target,
    disagreement,
    divergence,
    on_policy_loss,
    survival_weights,
)

TOKENS = ("chocolate", "cocoa", "drink", "brew")
DELTA = 1e-9  # "a small δ": brew's MDraft weight goes as δ^{0.065}; the table used ~1e-9
P_HOT = torch.tensor([0.42, 0.31, 0.27 - DELTA, DELTA], dtype=torch.float64)
P_COLD = torch.tensor([0.02, 0.01, 0.10, 0.87], dtype=torch.float64)
# Table 3: optimal shared second-position law, greedy acceptance A0 and T=1 acceptance A1.
TABLE_3 = {
    "rkl": ((0.338, 0.217, 0.445, 0.000), 0, 0.582),
    "fkl": ((0.280, 0.205, 0.210, 0.305), 0, 0.604),
    "mdraft": ((0.350, 0.253, 0.278, 0.119), 1, 0.655),
}


def _random_laws(generator: torch.Generator, k: int, length: int, vocab: int) -> torch.Tensor:
    return torch.log_softmax(
        3 * torch.randn((k, length, vocab), generator=generator, dtype=torch.float64), -1
    )


def _two_branch_optimum(objective: Objective) -> torch.Tensor:
    """argmin_q of the expected loss, the branch law (0.65 hot, 0.35 cold) as 13 + 7 of K = 20
    proposals so that p̂ is the exact branch average (the paper's population limit)."""
    log_p = torch.log(torch.stack([P_HOT] * 13 + [P_COLD] * 7))[:, None, :]  # [20, 1, 4]
    drafts = torch.zeros((20, 1), dtype=torch.long)
    theta = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS(
        [theta],
        lr=1,
        max_iter=500,
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = on_policy_loss(torch.log_softmax(theta, 0)[None], log_p, drafts, objective)
        loss.backward()
        return loss

    for _ in range(5):
        optimiser.step(closure)
    return torch.softmax(theta.detach(), 0)


@pytest.mark.parametrize("name", sorted(TABLE_3))
def test_two_branch_example_reproduces_table_3(name: str) -> None:
    objective = {
        "rkl": Objective("rkl", 0.0, 20, "rkl", "uniform"),
        "fkl": Objective("fkl", 0.0, 20, "fkl", "uniform"),
        "mdraft": Objective("mdraft", 0.9, 20, "rkl", "uniform"),
    }[name]
    q = _two_branch_optimum(objective)
    law, greedy_ok, a1 = TABLE_3[name]
    assert q.tolist() == pytest.approx(law, abs=0.005), dict(zip(TOKENS, q.tolist(), strict=True))
    assert int(torch.argmax(q) == 0) == greedy_ok  # A0: chocolate is the verifier's greedy pick
    accept = 0.65 * torch.minimum(q, P_HOT).sum() + 0.35 * torch.minimum(q, P_COLD).sum()
    assert float(accept) == pytest.approx(a1, abs=0.005)


def test_mdraft_optimum_has_the_closed_form() -> None:
    """§4.5 Eq. 6: q*(y) ∝ p̄(y) exp(−(1−α) J(y)); checked at α = 0.5 (not a table row)."""
    q = _two_branch_optimum(Objective("mdraft", 0.5, 20, "rkl", "uniform"))
    mean = 0.65 * P_HOT + 0.35 * P_COLD
    j = torch.log(mean) - (0.65 * torch.log(P_HOT) + 0.35 * torch.log(P_COLD))
    closed = mean * torch.exp(-0.5 * j)
    assert q.tolist() == pytest.approx((closed / closed.sum()).tolist(), abs=1e-6)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1.0])
def test_rkl_loss_is_marginal_term_plus_disagreement_penalty(alpha: float) -> None:
    """App. B: K⁻¹ Σ_k KL(q‖r^{(k)}) = KL(q‖p̂) + (1−α) Σ_y q(y) Ĵ(y) + K⁻¹ Σ_k log Z_k, the last
    term independent of q (checked by evaluating the identity at two different q)."""
    g = torch.Generator().manual_seed(7)
    log_p = _random_laws(g, 5, 3, 11)
    k = log_p.shape[0]
    log_mean = torch.logsumexp(log_p, 0) - math.log(k)
    mixed = (1 - alpha) * log_p + alpha * log_mean
    log_z = torch.logsumexp(mixed, -1).mean(0)  # [L]
    objective = Objective("mdraft", alpha, k, "rkl", "uniform")
    for _ in range(2):
        log_q = torch.log_softmax(2 * torch.randn((3, 11), generator=g, dtype=torch.float64), -1)
        lhs = divergence(log_q, blended_target(log_p, alpha), "rkl").mean(0)  # [L]
        marginal = (log_q.exp() * (log_q - log_mean)).sum(-1)
        penalty = (log_q.exp() * disagreement(log_p)).sum(-1)
        assert lhs.tolist() == pytest.approx(
            (marginal + (1 - alpha) * penalty + log_z).tolist(), abs=1e-12
        )
        drafts = torch.zeros((k, 3), dtype=torch.long)
        assert float(on_policy_loss(log_q, log_p, drafts, objective)) == pytest.approx(
            float(lhs.mean()), abs=1e-12
        )


def test_alpha_zero_is_per_prefix_rkl_and_k_one_ignores_alpha() -> None:
    g = torch.Generator().manual_seed(3)
    log_p = _random_laws(g, 4, 2, 9)
    log_q = torch.log_softmax(torch.randn((2, 9), generator=g, dtype=torch.float64), -1)
    drafts = torch.zeros((4, 2), dtype=torch.long)
    per_prefix = divergence(log_q, log_p, "rkl").mean()
    assert float(
        on_policy_loss(log_q, log_p, drafts, Objective("mdraft", 0.0, 4, "rkl", "uniform"))
    ) == pytest.approx(float(per_prefix), abs=1e-12)
    one = log_p[:1]
    losses = {
        a: float(
            on_policy_loss(log_q, one, drafts[:1], Objective("mdraft", a, 1, "rkl", "uniform"))
        )
        for a in (0.0, 0.5, 0.9, 1.0)
    }
    assert max(losses.values()) - min(losses.values()) < 1e-12
    # and with K = 4, alpha does change the loss (the check above can fail)
    four = {
        a: float(on_policy_loss(log_q, log_p, drafts, Objective("mdraft", a, 4, "rkl", "uniform")))
        for a in (0.0, 0.9)
    }
    assert abs(four[0.0] - four[0.9]) > 1e-3


def test_survival_weights_follow_acceptance_and_sum_to_l() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.1], [0.1, 0.9, 0.9, 0.9]], dtype=torch.float64))
    lq = torch.log(torch.tensor([[0.25, 0.4, 0.9, 0.3], [0.4, 0.1, 0.5, 0.2]], dtype=torch.float64))
    w = survival_weights(lp, lq)
    assert w.sum(1).tolist() == pytest.approx([4.0, 4.0])
    # block 0: a = (1, 0.5, 1, 1/3) -> reach (1, 1, 0.5, 0.5); block 1: a = (0.25, 1, 1, 1)
    assert (w[0] / w[0, 0]).tolist() == pytest.approx([1, 1, 0.5, 0.5])
    assert (w[1] / w[1, 0]).tolist() == pytest.approx([1, 0.25, 0.25, 0.25])


@pytest.mark.parametrize("alpha", [0.0, 0.9])
def test_gradient_flows_only_into_the_drafter(alpha: float) -> None:
    g = torch.Generator().manual_seed(5)
    log_p = _random_laws(g, 3, 2, 7).requires_grad_(True)
    theta = torch.randn((2, 7), generator=g, dtype=torch.float64, requires_grad=True)
    drafts = torch.randint(0, 7, (3, 2), generator=g)
    loss = on_policy_loss(
        torch.log_softmax(theta, -1), log_p, drafts, Objective("mdraft", alpha, 3, "rkl")
    )
    loss.backward()
    assert theta.grad is not None and float(theta.grad.abs().sum()) > 0
    assert log_p.grad is None
    assert not blended_target(log_p, alpha).requires_grad  # targets are constants


def test_objective_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="alpha must be in"):
        Objective(alpha=1.5)
    with pytest.raises(ValueError, match="proposals"):
        Objective(proposals=0)
    with pytest.raises(ValueError, match="objective must be one of"):
        Objective.named("dpo")


def test_per_proposal_laws_equal_a_repeated_shared_law_and_use_their_own_q() -> None:
    """An autoregressive drafter's [K, L, V] laws (one per proposal): repeating a shared law K
    times gives the shared law's loss and acceptances; distinct laws enter each proposal's
    divergence, survival weights and acceptances with their own q."""
    g = torch.Generator().manual_seed(7)
    k, length, vocab = 3, 4, 6
    log_p = _random_laws(g, k, length, vocab)
    shared = _random_laws(g, 1, length, vocab)[0]
    drafts = torch.randint(0, vocab, (k, length), generator=g)
    objective = Objective.named("mdraft", proposals=k)
    repeated = shared.expand(k, -1, -1)
    torch.testing.assert_close(
        on_policy_loss(repeated, log_p, drafts, objective),
        on_policy_loss(shared, log_p, drafts, objective),
        atol=1e-12,
        rtol=0,
    )
    own = _random_laws(g, k, length, vocab)
    accept = acceptance_probabilities(own, log_p, drafts)
    for j in range(k):
        for pos in range(length):
            tok = drafts[j, pos]
            want = min(1.0, float((log_p[j, pos, tok] - own[j, pos, tok]).exp()))
            assert accept[j, pos].item() == pytest.approx(want, abs=1e-12)
    per = divergence(own, blended_target(log_p, 0.9), "rkl")
    assert per.shape == (k, length)
    for j in range(k):
        single = divergence(own[j], blended_target(log_p, 0.9)[j : j + 1], "rkl")[0]
        torch.testing.assert_close(per[j], single, atol=1e-12, rtol=0)
