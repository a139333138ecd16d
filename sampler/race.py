"""Race primitives: the keyed Poisson functional representation (PFR) and its multi-sample
version MPFR. Pure tensor functions, batch-first over contexts, never a model call.

Glossary (MPFR paper §3-§5, App. A.3):
- clock E_{u,j} ~ Exp(1): j-th arrival increment of token u; arrival time
  G_{u,j} = Σ_{i<=j} E_{u,i}.
- race / PFR: winner = argmin_u E_{u,1} / P(u), computed as ln E − ln P.
- MPFR(P, Π, n): the tokens of the n smallest scores G_{u,j} / P(u) over (u, j); they
  are n
  i.i.d. samples of P (Alg. 6, Thm. A.5). A token contributes at most n arrivals, so
  j = 1..n suffices.

Shapes: N contexts, K support slots, B arrivals.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import torch

from sampler import compiled


def race_winner(logp: torch.Tensor, tokens: torch.Tensor, clocks: torch.Tensor) -> torch.Tensor:
    """Keyed race winner per context (PFR, MPFR paper Alg. 2/3) from given clocks: the law in
    torch ops (the decoder's race takes the uniforms: ``race_winner_of_uniforms``).

    Args:
        logp: (N, K) float64 processed log-probabilities, -inf off the support.
        tokens: (N, K) int64 token ids of the slots.
        clocks: (N, K) float64 first-arrival clocks E_{u,1} of those tokens.
    Returns:
        (N,) int64 winning token ids. A row with empty support returns -1.
    """
    if not (logp.shape == tokens.shape == clocks.shape):
        raise ValueError(
            f"expected equal (N, K) shapes, got {tuple(logp.shape)}, {tuple(tokens.shape)}, "
            f"{tuple(clocks.shape)}"
        )
    return _torch_race_winner(logp, tokens, clocks)


def _torch_race_winner(
    logp: torch.Tensor, tokens: torch.Tensor, clocks: torch.Tensor
) -> torch.Tensor:
    score = torch.log(clocks) - logp  # (N, K); +inf off the support
    best = torch.argmin(score, dim=-1, keepdim=True)  # (N, 1)
    won = tokens.gather(1, best).squeeze(1)  # (N,)
    return torch.where(torch.isneginf(logp).all(dim=-1), torch.full_like(won, -1), won)


RaceKernel = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


def race_winner_of_uniforms(
    logp: torch.Tensor, tokens: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """``race_winner`` with the clocks given as their uniforms, E = −ln U: one compiled pass
    per row takes E and the race together (``sampler.compiled``, decided once per process;
    torch otherwise), each slot's arithmetic the same wherever it sits in the call.

    Args:
        logp: (N, K) float64 processed log-probabilities, -inf off the support.
        tokens: (N, K) int64 token ids of the slots.
        uniforms: (N, K) float64 first-arrival uniforms U in (0, 1) of those tokens
            (``keyed.tensor.clock_uniforms``).
    Returns:
        (N,) int64 winning token ids; -1 for a row with empty support.
    """
    if not (logp.shape == tokens.shape == uniforms.shape):
        raise ValueError(
            f"expected equal (N, K) shapes, got {tuple(logp.shape)}, {tuple(tokens.shape)}, "
            f"{tuple(uniforms.shape)}"
        )
    if uniforms.device.type == "cpu":
        return torch.from_numpy(
            race_winners_of_uniforms(
                logp.detach().to(torch.float64).numpy(),
                tokens.to(torch.int64).numpy(),
                uniforms.detach().to(torch.float64).numpy(),
            )
        )
    return _torch_race_winner(logp, tokens, -torch.log(uniforms))


def race_winners_of_uniforms(
    logp: np.ndarray, tokens: np.ndarray, uniforms: np.ndarray
) -> np.ndarray:
    """``race_winner_of_uniforms`` on CPU arrays ((N, K) float64, int64, float64 -> (N,)
    int64): the compiled pass, or the torch path where it does not serve."""
    kernel = _race_kernel()
    if kernel is None:
        won = _torch_race_winner(
            torch.from_numpy(logp), torch.from_numpy(tokens), -torch.log(torch.from_numpy(uniforms))
        )
        return won.numpy()
    winners = np.empty(logp.shape[0], dtype=np.int64)
    kernel(
        np.ascontiguousarray(logp, dtype=np.float64),
        np.ascontiguousarray(tokens, dtype=np.int64),
        np.ascontiguousarray(uniforms, dtype=np.float64),
        winners,
    )
    return winners


def _race_kernel() -> RaceKernel | None:
    """``sampler._kernels.race_winners_of_uniforms_into`` once it passes its check, or None
    (torch), decided on the first call of the process (``sampler.compiled.once``)."""
    return compiled.once("race", _get_race, _race_agrees)


def _get_race(module: ModuleType) -> RaceKernel:
    kernel: RaceKernel = module.race_winners_of_uniforms_into
    return kernel


def _race_agrees(kernel: RaceKernel) -> bool:
    """The kernel's winners equal the torch path's on 64 random rows of 50 slots (some -inf,
    one empty row)."""
    generator = torch.Generator().manual_seed(1)
    logp = torch.log_softmax(torch.randn((64, 50), generator=generator, dtype=torch.float64), -1)
    logp[3, 20:] = -torch.inf
    logp[5] = -torch.inf
    tokens = torch.randperm(64 * 50, generator=generator).reshape(64, 50)
    uniforms = torch.rand((64, 50), generator=generator, dtype=torch.float64).clamp_(min=1e-300)
    winners = np.empty(64, dtype=np.int64)
    kernel(logp.numpy(), tokens.numpy(), uniforms.numpy(), winners)
    expected = _torch_race_winner(logp, tokens, -torch.log(uniforms))
    return bool(np.array_equal(winners, expected.numpy()))


def mpfr_scores(logp: torch.Tensor, clocks: torch.Tensor) -> torch.Tensor:
    """Mapped-Poisson scores ln G_{u,j} − ln P(u).

    Args:
        logp: (N, K) float64. clocks: (N, K, B) float64 increments E_{u,j}.
    Returns:
        (N, K, B) float64 log-scores, +inf off the support.
    """
    if clocks.shape[:2] != logp.shape:
        raise ValueError(
            f"expected clocks of shape {tuple(logp.shape)} + (B,), got {tuple(clocks.shape)}"
        )
    arrivals = torch.cumsum(clocks, dim=-1)  # (N, K, B) arrival times G_{u,j}
    return torch.log(arrivals) - logp[..., None]


def mpfr_samples(
    logp: torch.Tensor, tokens: torch.Tensor, clocks: torch.Tensor, counts: list[int]
) -> list[list[int]]:
    """The first ``counts[n]`` MPFR samples of each context, in arrival order (Alg. 6).

    Args:
        logp: (N, K) float64 processed log-probabilities (-inf off the support).
        tokens: (N, K) int64 token ids.
        clocks: (N, K, B) float64 increments with B >= max(counts).
        counts: N sample counts (the multiplicities ν(c)).
    Returns:
        N lists of token ids; an empty list for a context with empty support.
    """
    n, k, b = clocks.shape
    if len(counts) != n or (counts and max(counts) > b):
        raise ValueError(f"expected {n} counts each <= {b}, got {counts}")
    scores = mpfr_scores(logp, clocks).reshape(n, k * b)  # (N, K·B)
    take = max(counts, default=0)
    order = torch.topk(scores, min(take, k * b), dim=-1, largest=False)
    slots = order.indices // b  # (N, take) slot of each arrival
    finite = torch.isfinite(order.values)
    drawn = tokens.gather(1, slots)  # (N, take)
    drawn_list = drawn.tolist()
    finite_list = finite.tolist()
    return [
        [
            t
            for t, ok in zip(drawn_list[i][: counts[i]], finite_list[i][: counts[i]], strict=True)
            if ok
        ]
        for i in range(n)
    ]


def acceptance_lower_bound(p: torch.Tensor, q: torch.Tensor, drafts: int) -> float:
    """Theorem 5.1 (MPFR paper): P(accept) >= 1 − Σ_i P(i) · (P(i) / (P(i) + Q(i)))^B.

    Args:
        p, q: (V,) probability vectors of the processed target and drafter laws.
        drafts: B >= 1.
    Returns:
        the bound as a float in [0, 1].
    """
    p64, q64 = p.to(torch.float64), q.to(torch.float64)
    ratio = torch.where(p64 > 0, p64 / (p64 + q64), torch.zeros_like(p64))
    return float(1.0 - (p64 * ratio**drafts).sum())
