"""Distillation objectives for parallel drafters (MDraft paper §4, App. C-D; docs/design.md §7).

Notation for one context c (shapes in brackets; V vocabulary, L block length, K proposals;
every function also takes any leading batch axes, e.g. [A, K, L, V] for A contexts):
- log q [L, V]: the drafter's position laws q_ℓ(·|c) (one pass, shared by all proposals), or
  [K, L, V] for an autoregressive drafter, whose q_ℓ^{(k)} = q(·|c, x^{(k)}_{<ℓ}) follows each
  proposal's own prefix (``sampler.drafters.eagle``); a log q with as many axes as log p is per
  proposal.
- x [K, L]: K draft blocks sampled from q at temperature 1.
- log p [K, L, V]: verifier laws p_ℓ^{(k)} = p(·| c, x^{(k)}_{<ℓ}) (row ℓ = 1 is the same for
  every k).
- p̂_ℓ = K⁻¹ Σ_k p_ℓ^{(k)}: the prefix-averaged law (Eq. 1's average).
- target r_ℓ^{(k)} ∝ (p_ℓ^{(k)})^{1−α} (p̂_ℓ)^α, built in log space (Eq. 1).
- loss = K⁻¹ Σ_k L⁻¹ Σ_ℓ w_{ℓ,k} D(q_ℓ, r_ℓ^{(k)}) with D the reverse KL KL(q‖r) (Eq. 2) or the
  forward KL KL(r‖q); targets and weights are held fixed (no gradient).
- survival weights w_{ℓ,k} ∝ Π_{m<ℓ} a_{m,k}, a_{m,k} = min(1, p_m^{(k)}(x_m)/q_m(x_m)),
  normalised to sum to L per proposal (App. D); DFlash weights w_ℓ = exp(−(ℓ−1)/γ).

Objectives (``Objective``): ``mdraft`` (RKL, α = 0.9, K = 4 by default —
K = 1 reduces it to per-prefix RKL —, survival weights), ``rkl``
(per-prefix reverse KL: α = 0, K = 1, uniform), ``fkl`` (per-prefix forward KL: α = 0, K = 1,
uniform) and ``ce`` (off-policy cross-entropy on the target's own continuation, DFlash weights).

All log-probabilities are float tensors with −inf allowed off the support; nothing here samples
(callers pass the drafts), so every function is deterministic.

Shapes (the brackets above): log q [L, V] or [K, L, V], drafts x [K, L] int64, log p [K, L, V],
targets [K, L, V], weights and acceptance [K, L]; laws float32 log-probabilities, any leading
batch axes (e.g. A contexts) allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Divergence = Literal["rkl", "fkl"]
Weighting = Literal["uniform", "survival", "dflash"]
OBJECTIVES = ("mdraft", "rkl", "fkl", "ce")


@dataclass(frozen=True)
class Objective:
    """One training objective.

    Attributes:
        name: one of ``OBJECTIVES``.
        alpha: blending coefficient α in [0, 1] (``mdraft`` only matters when K >= 2).
        proposals: K >= 1 draft blocks per context (on-policy objectives).
        divergence: ``rkl`` or ``fkl``.
        weighting: ``uniform``, ``survival`` or ``dflash``.
        gamma: DFlash decay γ > 0.
    Raises:
        ValueError: naming the field and its range.
    """

    name: str = "mdraft"
    alpha: float = 0.9
    proposals: int = 4
    divergence: Divergence = "rkl"
    weighting: Weighting = "survival"
    gamma: float = 4.0

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}; got {self.name!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if not 1 <= self.proposals <= 64:
            raise ValueError(f"proposals (K) must be in [1, 64], got {self.proposals}")
        if self.divergence not in ("rkl", "fkl"):
            raise ValueError(f"divergence must be rkl or fkl, got {self.divergence!r}")
        if self.weighting not in ("uniform", "survival", "dflash"):
            raise ValueError(
                f"weighting must be uniform, survival or dflash, got {self.weighting!r}"
            )
        if not self.gamma > 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")

    @property
    def on_policy(self) -> bool:
        return self.name != "ce"

    @classmethod
    def named(cls, name: str, alpha: float = 0.9, proposals: int = 4) -> Objective:
        """The paper's settings for ``name``; ``alpha``/``proposals`` apply to ``mdraft`` only
        (``rkl``/``fkl`` are per-prefix: α = 0, K = 1)."""
        if name == "mdraft":
            return cls(name, alpha, proposals, "rkl", "survival")
        if name == "rkl":
            return cls(name, 0.0, 1, "rkl", "uniform")
        if name == "fkl":
            return cls(name, 0.0, 1, "fkl", "uniform")
        if name == "ce":
            return cls(name, 0.0, 1, "rkl", "dflash")
        return cls(name)  # raises: unknown name


def _xlogy_kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """Σ_y a(y) (log a(y) − log b(y)) over the last axis, with 0 · (anything) = 0."""
    a = log_a.exp()
    terms = torch.where(a > 0, a * (log_a - log_b), torch.zeros_like(a))
    return terms.sum(-1)


def blended_target(log_p: torch.Tensor, alpha: float) -> torch.Tensor:
    """log r^{(k)} = normalise((1−α) log p^{(k)} + α log p̂) (MDraft Eq. 1).

    Args:
        log_p: [K, L, V] verifier log-laws of the K proposals.
        alpha: α in [0, 1]; 0 returns ``log_p`` (detached, as always).
    Returns:
        [K, L, V] normalised log targets (−inf where the blend has no support).
    """
    log_p = log_p.detach()  # targets are constants (Eq. 2 is differentiated in q only)
    if alpha == 0.0:
        return log_p
    k = log_p.shape[-3]
    log_mean = torch.logsumexp(log_p, dim=-3, keepdim=True) - math.log(k)  # log p̂ [1, L, V]
    # (1 − α) log p^{(k)} + α log p̂ is −inf wherever p^{(k)} is 0 (α < 1)
    mixed = log_mean.expand_as(log_p) if alpha == 1.0 else (1 - alpha) * log_p + alpha * log_mean
    return mixed - torch.logsumexp(mixed, dim=-1, keepdim=True)


def survival_weights(log_p_drafted: torch.Tensor, log_q_drafted: torch.Tensor) -> torch.Tensor:
    """Detached survival weights w_{ℓ,k} ∝ Π_{m<ℓ} min(1, p/q), summing to L per proposal.

    Args:
        log_p_drafted, log_q_drafted: [K, L] log p_m^{(k)}(x_m^{(k)}) and log q_m(x_m^{(k)}).
    Returns:
        [K, L] weights (MDraft App. D, "Survival weights").
    """
    log_a = torch.clamp(log_p_drafted - log_q_drafted, max=0.0).detach()
    log_reach = torch.cumsum(log_a, dim=-1) - log_a  # Σ_{m<ℓ} log a_m (empty sum = 0)
    reach = log_reach.exp()
    length = reach.shape[-1]
    return reach * (length / reach.sum(dim=-1, keepdim=True))


def dflash_weights(length: int, gamma: float) -> torch.Tensor:
    """[L] w_ℓ = exp(−(ℓ−1)/γ), ℓ = 1..L (MDraft App. D, "DFlash weights")."""
    return torch.exp(-torch.arange(length, dtype=torch.float64) / gamma)


def _per_proposal(log_q: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``log_q`` as [..., K, L, V] like ``like``: a shared [..., L, V] law repeated K times,
    a per-proposal one as it is."""
    if log_q.dim() == like.dim():
        return log_q
    return log_q.unsqueeze(-3).expand_as(like)


def divergence(log_q: torch.Tensor, log_r: torch.Tensor, kind: Divergence) -> torch.Tensor:
    """Per-(k, ℓ) divergence between q [L, V] (or [K, L, V]) and targets r [K, L, V]: [K, L].

    ``rkl``: KL(q_ℓ ‖ r_ℓ^{(k)}); ``fkl``: KL(r_ℓ^{(k)} ‖ q_ℓ).
    """
    q = _per_proposal(log_q, log_r)
    if kind == "rkl":
        return _xlogy_kl(q, log_r)
    return _xlogy_kl(log_r, q)


def on_policy_loss(
    log_q: torch.Tensor,
    log_p: torch.Tensor,
    drafts: torch.Tensor,
    objective: Objective,
) -> torch.Tensor:
    """MDraft Eq. 2 for one context: K⁻¹ Σ_k L⁻¹ Σ_ℓ w_{ℓ,k} D(q_ℓ, r_ℓ^{(k)}).

    Args:
        log_q: [L, V] drafter log-laws (differentiable), or [K, L, V] per proposal.
        log_p: [K, L, V] verifier log-laws on the K sampled blocks (no gradient needed).
        drafts: [K, L] int64 sampled draft tokens (for survival weights).
        objective: α, divergence and weighting (K is ``log_p.shape[0]``).
    Returns:
        scalar loss (averaged over any leading context axes too).
    """
    with torch.no_grad():
        log_r = blended_target(log_p, objective.alpha)
        if objective.weighting == "survival":
            weights = survival_weights(*_drafted(log_q.detach(), log_p, drafts))
        elif objective.weighting == "dflash":
            weights = dflash_weights(log_p.shape[-2], objective.gamma).to(log_q)
        else:
            weights = torch.ones((), dtype=log_q.dtype, device=log_q.device)
    per = divergence(log_q, log_r, objective.divergence)  # [..., K, L]
    return (weights.to(per) * per).mean()


def off_policy_loss(
    log_q: torch.Tensor, continuation: torch.Tensor, objective: Objective
) -> torch.Tensor:
    """Cross-entropy on the target's own continuation with DFlash weights:
    L⁻¹ Σ_ℓ w_ℓ · (−log q_ℓ(y_ℓ)).

    Args:
        log_q: [L, V] drafter log-laws. continuation: [L] int64 tokens the target produced.
    """
    length = log_q.shape[0]
    nll = -log_q.gather(1, continuation[:, None])[:, 0]
    weights = dflash_weights(length, objective.gamma).to(nll)
    return (weights * nll).sum() / length


def disagreement(log_p: torch.Tensor) -> torch.Tensor:
    """Ĵ(y) = log p̂(y) − K⁻¹ Σ_k log p^{(k)}(y) ≥ 0 (MDraft §4.5): [L, V]."""
    k = log_p.shape[-3]
    log_mean = torch.logsumexp(log_p, dim=-3) - math.log(k)
    return log_mean - log_p.mean(dim=-3)


def acceptance_probabilities(
    log_q: torch.Tensor, log_p: torch.Tensor, drafts: torch.Tensor
) -> torch.Tensor:
    """a_{ℓ,k} = min(1, p_ℓ^{(k)}(x_ℓ)/q_ℓ(x_ℓ)): [K, L], the chance that standard speculative
    sampling accepts draft token ℓ of block k given that the tokens before it were accepted."""
    lp, lq = _drafted(log_q, log_p, drafts)
    return torch.clamp(lp - lq, max=0.0).exp()


def _drafted(
    log_q: torch.Tensor, log_p: torch.Tensor, drafts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """([..., K, L], [..., K, L]): log p_ℓ^{(k)}(x_ℓ^{(k)}) and log q_ℓ(x_ℓ^{(k)})."""
    lp = log_p.gather(-1, drafts[..., None])[..., 0]
    lq = _per_proposal(log_q, log_p).gather(-1, drafts[..., None])[..., 0]
    return lp, lq
