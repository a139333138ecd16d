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

Randomness is a ``torch.Generator`` seeded with the request nonce; nothing here is keyed. The
Gumbels of a depth are drawn lazily (``LevelNoise``): only for tokens in a support an argmax
looks at, each (draft, token) once — the same joint law as full-vocabulary noise, since a token
outside every support never wins and is never seen.
Shapes: V vocabulary size; dense log-probabilities are (V,) float64 with −inf off the support.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

import torch
from transformers import PreTrainedModel

from sampler.cached_lm import CachedLM
from sampler.decoder import (
    BASELINES,
    GenerationResult,
    GenerationStats,
    SamplerConfig,
    count_at,
    verify_tree,
)
from sampler.drafters import Drafter, feed_target_hidden, wants_target_hidden
from sampler.processing import dense_logp, process
from sampler.tree import DraftTree


def gumbels(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard Gumbel noise −ln(−ln U), float64; U = 0 gives −inf (never an argmax)."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    return -torch.log(-torch.log(u))


class LevelNoise:
    """The Gumbels G_i(x) of the B drafts at one depth, drawn on first use per token.

    Each draft passes through exactly one tree node per depth, where its row is read twice: by
    its drafted token (over Q's support there) and by the target's coupled token (over P's).
    Drawing a column only when a support first needs it, and keeping it, gives every read the
    same values as one (B, V) draw would, at the cost of the supports (top-k) instead of V.

    Args:
        generator: the request's generator. drafts: B.
    """

    def __init__(self, generator: torch.Generator, drafts: int) -> None:
        self._generator = generator
        self._drafts = drafts
        self.tokens = torch.empty(0, dtype=torch.int64)  # (K,) ids drawn so far
        self.values = torch.empty((drafts, 0), dtype=torch.float64)  # (B, K)

    def over(self, support: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids (K,) and noise (B, K) covering ``support`` ((n,) int64 token ids) and more."""
        missing = torch.unique(support[~torch.isin(support, self.tokens)])
        if missing.numel():
            fresh = gumbels(self._generator, (self._drafts, missing.numel()))
            self.tokens = torch.cat([self.tokens, missing])
            self.values = torch.cat([self.values, fresh], dim=1)
        return self.tokens, self.values


def _support(logp: torch.Tensor) -> torch.Tensor:
    """(n,) int64 ids where a dense (V,) log-probability is finite."""
    return torch.nonzero(torch.isfinite(logp)).squeeze(1)


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
    config: SamplerConfig,
    drafter: Drafter,
    seed: int,
    eos_ids: frozenset[int],
    on_tokens: Callable[[list[int]], None] | None,
) -> GenerationResult:
    """Run ``vsps`` or ``gls`` (module docstring); called by ``sampler.decoder.generate``,
    which validated the prompt, the config and the drafter.

    The step structure is the decoder's: one drafter call per tree level, one tree-attention
    target forward per step over the KV cache (``verify_tree``), realised-path KV selection,
    bonus token.

    Args:
        seed: seeds the generator of every draw (the request nonce).
    Returns:
        the decoder's ``GenerationResult`` (``watermark_applied`` False).
    """
    method, processing, max_new_tokens = config.method, config.processing, config.max_new_tokens
    if method not in BASELINES:
        raise ValueError(f"expected a baseline method in {sorted(BASELINES)}, got {method!r}")
    vocab = target.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    b, lookahead = config.effective_drafts, config.lookahead
    start = time.perf_counter()
    lm = CachedLM(target)
    lm.keep_hidden = wants_target_hidden(drafter)
    drafter.start(prompt)
    if len(prompt) > 1:
        lm.extend(prompt[:-1])
        feed_target_hidden(drafter, lm, -1)
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
        noise = [LevelNoise(generator, b) for _ in range(depth + 1)] if method == "gls" else None
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
                    ids, values = noise[level - 1].over(_support(q[row]))
                    tokens = ids[gls_drafts(q[row][ids], values[alive])].tolist()
                else:
                    tokens = [_sample(q[row], generator)]
                tree.add_drafts(parent, tokens)
                for i, token in zip(alive, tokens, strict=True):
                    members.setdefault(tree.nodes[parent].children[token], []).append(i)
            count_at(drafted, level - 1)
        base = len(committed) - 1
        logits = verify_tree(lm, tree, base)
        p = dense_logp(process(logits, processing), vocab)  # (n, V)
        emitted_before = len(committed)
        node, visited = 0, []
        for level in range(depth + 1):
            visited.append(node)
            children = tree.nodes[node].children if level < depth else {}
            if noise is not None:
                ids, values = noise[level].over(_support(p[node]))
                token = int(ids[gls_target(p[node][ids], values[members[node]])])
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
                count_at(accepted, level)
            if child is None or len(committed) - len(prompt) >= max_new_tokens:
                break
            node = child
        lm.keep(base, [base + i for i in visited][: len(committed) - 1 - base])
        drafter.finish_step(tree, visited, committed)
        feed_target_hidden(drafter, lm, visited[-1])
        if on_tokens is not None:
            on_tokens(committed[emitted_before:])
        if finish == "eos":
            break
    ids = committed[len(prompt) :]
    stats = GenerationStats(
        emitted_tokens=len(ids) + (1 if finish == "eos" else 0),
        target_forward_passes=lm.forward_calls - target_before,
        drafter_calls=drafter.calls - calls_before,
        accepted_per_level=tuple(accepted),
        drafted_per_level=tuple(drafted),
        prefill_seconds=prefill,
        seconds=time.perf_counter() - start - prefill,
    )
    return GenerationResult(tuple(ids), finish, method, False, stats)
