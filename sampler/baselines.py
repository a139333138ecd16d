"""Unwatermarked speculative baselines in the decoder's harness: ``vsps`` and ``gls``.

- ``vsps`` — speculative sampling (Leviathan et al. 2023; Chen et al. 2023): one draft chain of
  L tokens from the drafter Q; draft token x at a context is accepted with probability
  min(1, P(x)/Q(x)); at the first rejection a token is drawn from the residual
  norm(max(P − Q, 0)); after L acceptances the bonus token is drawn from P.
- ``gls`` — Rowan et al. 2025's list-level coupling (InvariantMultiDraftStrategy): draft i in
  1..B has its own Gumbel noise G_i^{(d)} over the vocabulary at each depth d and drafts
  x_i = argmax_x log Q(x|c) + G_i^{(d)}(x). At a tree context c with alive drafts A(c) (those
  whose path passes through c) the target emits y = argmax over i in A(c) and x of
  log P(x|c) + G_i^{(d)}(x). The max of |A| i.i.d. standard Gumbels is a Gumbel shifted by
  log |A| for every x alike, so y ~ P(·|c) exactly; A(c) depends only on the noise of earlier
  depths. The emitted token is always y — also at a rejection (y not among the drafts) and for
  the bonus: replacing it there by a fresh draw from P biases the law (case C10,
  ``tests/sampler/test_baselines.py`` shows it).

Randomness is a ``torch.Generator`` seeded with the request nonce; nothing here is keyed.
Shapes: V vocabulary size; dense log-probabilities are (V,) float64 with −inf off the support.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import PreTrainedModel

from sampler.cached_lm import CachedLM
from sampler.drafters import Drafter
from sampler.processing import Processing, dense_logp, process
from sampler.tree import DraftTree

BASELINES = frozenset({"vsps", "gls"})


@dataclass(frozen=True)
class BaselineRun:
    """What ``generate_baseline`` returns: the response (no prompt, no EOS) and its counters."""

    token_ids: list[int]
    finish_reason: Literal["eos", "length"]
    target_forward_passes: int
    drafter_calls: int
    accepted_per_level: tuple[int, ...]
    drafted_per_level: tuple[int, ...]
    prefill_seconds: float
    seconds: float


def gumbels(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard Gumbel noise −ln(−ln U), float64; U = 0 gives −inf (never an argmax)."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return -torch.log(-torch.log(u))


def gls_drafts(q_logp: torch.Tensor, noise: torch.Tensor) -> list[int]:
    """Draft tokens of the drafts at one context: argmax_x log Q(x) + G_i(x).

    Args:
        q_logp: (V,) float64 dense drafter log-probabilities. noise: (A, V) the drafts' Gumbels.
    Returns:
        (A,) token ids, one per draft, in the order of ``noise``'s rows.
    """
    return torch.argmax(q_logp[None, :] + noise, dim=1).tolist()


def gls_target(p_logp: torch.Tensor, noise: torch.Tensor) -> int:
    """The coupled target token: argmax over drafts i and tokens x of log P(x) + G_i(x).

    Args:
        p_logp: (V,) float64 dense target log-probabilities. noise: (A, V), A >= 1, the alive
            drafts' Gumbels at this depth.
    Returns:
        a token id distributed as P (max of A i.i.d. Gumbels is Gumbel + ln A for every x).
    """
    scores = p_logp[None, :] + noise  # (A, V)
    return int(torch.argmax(scores.reshape(-1)).item() % p_logp.shape[0])


def vsps_accepts(p_logp: torch.Tensor, q_logp: torch.Tensor, token: int, u: float) -> bool:
    """Accept draft ``token`` iff u < P(x)/Q(x) (probability min(1, P(x)/Q(x)))."""
    return u < float(torch.exp(p_logp[token] - q_logp[token]))


def residual_logp(p_logp: torch.Tensor, q_logp: torch.Tensor) -> torch.Tensor:
    """(V,) log of norm(max(P − Q, 0)), the law of the token after a rejection.

    Falls back to P when P = Q numerically (a rejection then has probability 0 anyway).
    """
    diff = torch.clamp(p_logp.exp() - q_logp.exp(), min=0.0)
    total = diff.sum()
    if not total > 0:
        return p_logp
    return torch.log(diff / total)


def _sample(logp: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(logp.exp(), 1, generator=generator).item())


def generate_baseline(
    target: PreTrainedModel,
    prompt: list[int],
    method: str,
    drafts: int,
    lookahead: int,
    max_new_tokens: int,
    processing: Processing,
    drafter: Drafter,
    seed: int,
    eos_ids: frozenset[int],
    on_tokens: Callable[[list[int]], None] | None,
) -> BaselineRun:
    """Run ``vsps`` or ``gls`` (module docstring); called by ``sampler.decoder.generate``.

    The step structure is the decoder's: one drafter call per tree level, one tree-attention
    target forward per step over the KV cache, realised-path KV selection, bonus token.

    Returns:
        a ``BaselineRun``.
    """
    if method not in BASELINES:
        raise ValueError(f"expected a baseline method in {sorted(BASELINES)}, got {method!r}")
    vocab = target.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    b = 1 if method == "vsps" else drafts
    start = time.perf_counter()
    lm = CachedLM(target)
    if len(prompt) > 1:
        lm.extend(prompt[:-1])
    drafter.start(prompt)
    calls_before = drafter.calls
    prefill = time.perf_counter() - start
    target_before = lm.forward_calls
    committed = list(prompt)
    accepted: list[int] = []
    drafted: list[int] = []
    finish: Literal["eos", "length"] = "length"
    while len(committed) - len(prompt) < max_new_tokens:
        depth = min(lookahead, max_new_tokens - (len(committed) - len(prompt)))
        tree = DraftTree(committed[-1], (), 0, set(), None, b)
        members: dict[int, list[int]] = {0: list(range(b))}  # node -> drafts through it
        q_at: dict[int, torch.Tensor] = {}  # node -> dense drafter law at that context
        noise = gumbels(generator, (b, depth + 1, vocab)) if method == "gls" else None
        for level in range(1, depth + 1):
            parents = tree.levels[level - 1] if level - 1 < len(tree.levels) else []
            if not parents:
                break
            q = dense_logp(process(drafter.propose(tree, level, committed), processing), vocab)
            for row, parent in enumerate(parents):
                if not bool(torch.isfinite(q[row]).any()):
                    continue  # the drafter proposes nothing here: no children, P decides
                alive = members[parent]
                q_at[parent] = q[row]
                if noise is not None:
                    tokens = gls_drafts(q[row], noise[alive, level - 1])
                else:
                    tokens = [_sample(q[row], generator)]
                tree.add_drafts(parent, tokens)
                for i, token in zip(alive, tokens, strict=True):
                    members.setdefault(tree.nodes[parent].children[token], []).append(i)
            while len(drafted) < level:
                drafted.append(0)
            drafted[level - 1] += 1
        base = len(committed) - 1
        visible = torch.ones((len(tree), base + len(tree)), dtype=torch.bool)
        visible[:, base:] = tree.ancestors()
        logits = lm.forward(
            [n.token for n in tree.nodes], [n.depth for n in tree.nodes], visible, base
        )
        p = dense_logp(process(logits, processing), vocab)  # (n, V)
        emitted_before = len(committed)
        node, visited = 0, []
        for level in range(depth + 1):
            visited.append(node)
            children = tree.nodes[node].children if level < depth else {}
            if noise is not None:
                token = gls_target(p[node], noise[members[node], level])
            elif children:
                ((draft, child),) = children.items()
                u = float(torch.rand((), generator=generator, dtype=torch.float64))
                if vsps_accepts(p[node], q_at[node], draft, u):
                    token = draft
                else:
                    token = _sample(residual_logp(p[node], q_at[node]), generator)
            else:  # bonus token
                token = _sample(p[node], generator)
            if token in eos_ids:
                finish = "eos"
                break
            committed.append(token)
            child = children.get(token)
            if child is not None:
                while len(accepted) <= level:
                    accepted.append(0)
                accepted[level] += 1
            if child is None or len(committed) - len(prompt) >= max_new_tokens:
                break
            node = child
        lm.keep(base, [base + i for i in visited][: len(committed) - 1 - base])
        drafter.finish_step(tree, visited, committed)
        if on_tokens is not None:
            on_tokens(committed[emitted_before:])
        if finish == "eos":
            break
    return BaselineRun(
        token_ids=committed[len(prompt) :],
        finish_reason=finish,
        target_forward_passes=lm.forward_calls - target_before,
        drafter_calls=drafter.calls - calls_before,
        accepted_per_level=tuple(accepted),
        drafted_per_level=tuple(drafted),
        prefill_seconds=prefill,
        seconds=time.perf_counter() - start - prefill,
    )
