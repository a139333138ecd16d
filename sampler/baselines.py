"""Unwatermarked speculative baselines as policies of the one step loop (``sampler.loop``):
``Vsps`` for ``vsps`` and ``Gls`` for ``gls`` (``sampler.policies`` has the protocol).

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

Randomness is a ``torch.Generator`` seeded with the request nonce, drawn in a fixed order
(drafts level by level, then the target's draws along the walk); nothing here is keyed. The
Gumbels of a depth are drawn lazily (``LevelNoise``): only for tokens in a support an argmax
looks at, each (draft, token) once — the same joint law as full-vocabulary noise, since a token
outside every support never wins and is never seen.
Shapes: V vocabulary size; dense log-probabilities are (V,) float64 with −inf off the support.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sampler.policies import History
from sampler.processing import Support, dense_logp
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


class _Step:
    """What a baseline keeps within one step: the dense drafter law at each drafted node, the
    drafts through each node (by the edge (parent, token) that leads to it) and, for ``gls``,
    each depth's noise."""

    def __init__(self, tree: DraftTree) -> None:
        self.tree = tree
        self.q_at: dict[int, torch.Tensor] = {}  # node -> (V,) dense drafter law there
        self.members: dict[tuple[int, int], list[int]] = {}  # (parent, token) -> drafts
        self.noise: list[LevelNoise] = []  # depth -> the drafts' Gumbels (gls)

    def alive(self, node: int) -> list[int]:
        """The drafts whose path passes through ``node``."""
        n = self.tree.nodes[node]
        return list(range(n.multiplicity)) if n.parent < 0 else self.members[(n.parent, n.token)]


class _Baseline:
    """Shared by the two baselines: one generator seeded with the request nonce, per-step
    scratch keyed by the tree it belongs to, dense laws over the vocabulary."""

    def __init__(self, seed: int, vocab: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self._step: _Step | None = None

    def step(self, tree: DraftTree) -> _Step:
        if self._step is None or self._step.tree is not tree:
            self._step = _Step(tree)
        return self._step

    def drafts(
        self, tree: DraftTree, parents: list[int], q: Support, history: History
    ) -> list[list[int]]:
        step, dense = self.step(tree), dense_logp(q, self.vocab)  # (n, V)
        out: list[list[int]] = []
        for row, parent in enumerate(parents):
            if not bool(torch.isfinite(dense[row]).any()):
                out.append([])  # the drafter proposes nothing here: no children, P decides
                continue
            alive = step.alive(parent)
            step.q_at[parent] = dense[row]
            tokens = self.draft(step, tree.nodes[parent].depth, dense[row], alive)
            for i, token in zip(alive, tokens, strict=True):
                step.members.setdefault((parent, token), []).append(i)
            out.append(tokens)
        return out

    def targets(self, tree: DraftTree, p: Support, history: History) -> Callable[[int], int]:
        step, dense = self.step(tree), dense_logp(p, self.vocab)  # (len(tree), V)
        return lambda node: self.target(step, node, dense[node])

    def draft(self, step: _Step, depth: int, q: torch.Tensor, alive: list[int]) -> list[int]:
        """Tokens of the ``alive`` drafts at a context of ``depth`` with law ``q`` (V,)."""
        raise NotImplementedError

    def target(self, step: _Step, node: int, p: torch.Tensor) -> int:
        """The target's token at ``node``, whose law is ``p`` (V,)."""
        raise NotImplementedError


class Vsps(_Baseline):
    """``vsps`` (module docstring): one chain; accept the draft with probability
    min(1, P/Q), else draw from the residual; the bonus (no draft) is drawn from P."""

    def draft(self, step: _Step, depth: int, q: torch.Tensor, alive: list[int]) -> list[int]:
        return [_sample(q, self.generator)]

    def target(self, step: _Step, node: int, p: torch.Tensor) -> int:
        children = step.tree.nodes[node].children
        if not children:  # bonus token (or a context the drafter proposed nothing at)
            return _sample(p, self.generator)
        ((draft, _),) = children.items()
        u = float(torch.rand((), generator=self.generator, dtype=torch.float64))
        if vsps_accepts(p, step.q_at[node], draft, u):
            return draft
        return _sample(residual_logp(p, step.q_at[node]), self.generator)


class Gls(_Baseline):
    """``gls`` (module docstring): drafts and the target's token are argmaxes over the same
    per-depth Gumbels of the drafts alive at the context."""

    def _noise(self, step: _Step, depth: int) -> LevelNoise:
        while len(step.noise) <= depth:
            step.noise.append(LevelNoise(self.generator, step.tree.nodes[0].multiplicity))
        return step.noise[depth]

    def draft(self, step: _Step, depth: int, q: torch.Tensor, alive: list[int]) -> list[int]:
        ids, values = self._noise(step, depth).over(_support(q))
        return ids[gls_drafts(q[ids], values[alive])].tolist()

    def target(self, step: _Step, node: int, p: torch.Tensor) -> int:
        ids, values = self._noise(step, step.tree.nodes[node].depth).over(_support(p))
        return int(ids[gls_target(p[ids], values[step.alive(node)])])
