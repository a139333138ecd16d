"""What a method draws: per-method policies plugged into the one step loop (``sampler.loop``).

A policy answers two questions of a speculative step (MPFR paper Alg. 10):
(a) ``drafts``: which tokens the drafts take at the contexts of one tree level, given the
    drafter's processed law Q_k there;
(b) ``targets``: which token the target emits at a tree context, given its processed law P_k
    from the step's one verification forward.
The loop emits (b) along the walk while it was drafted, so for every policy the emitted tokens
follow the target's law; which policy a method uses is its row in ``sampler.methods.METHODS``.

Here: the keyed race (``basic-uwm``, ``pfr``, ``mpfr`` and the ``*-nowm`` ones, whose source
just has an ephemeral secret) and plain multinomial sampling (``ar``); the unwatermarked
speculative baselines ``vsps`` and ``gls`` are in ``sampler.baselines``.

Keyed context keys are a function of the tree, the keyed source and the sequence's
``History`` (``context_keys``), not something the tree carries.

Shapes: n tree contexts, K support slots, B drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from keyed import KeyedSource, Label, label_at
from keyed.tensor import clock_uniforms, clock_uniforms_cpu, exponential_clocks
from sampler.processing import Support
from sampler.race import mpfr_samples, race_winner_of_uniforms, race_winners_of_uniforms
from sampler.tree import DraftTree


@dataclass
class History:
    """A sequence's committed prefix as the keyed source sees it (carried across steps).

    Attributes:
        committed: prompt + response token ids.
        prompt_len: tokens of the prompt.
        width: m, the context width of labels.
        used: labels of the contexts the response positions so far past the prompt window
            (the first m, whose labels reach into the prompt) were drawn at, EOS's included:
            the labels keyed so far (the repeated-context rule), as the detector's labels
            scored so far (``keyed.detection_plan``).
    """

    committed: list[int]
    prompt_len: int
    width: int
    used: set[Label] = field(default_factory=set)

    @property
    def emitted(self) -> int:
        return len(self.committed) - self.prompt_len

    def use_context(self) -> None:
        """Record that the next response position is drawn at the current context (a
        position in the prompt window draws from the nonce stream: its label is not used)."""
        if self.emitted >= self.width:
            self.used.add(label_at(self.committed, len(self.committed), self.width))


def context_keys(
    tree: DraftTree, nodes: list[int], source: KeyedSource, history: History
) -> torch.Tensor:
    """Context keys of Π(c) for tree contexts c (docs/design.md §2, repeated-context rule).

    Node i stands for the context h ‖ path(i) at response position t = ``history.emitted +
    depth(i)``. With masking on, its key is the nonce stream's if t < m (the prompt window: the
    label reaches into the prompt) or if its label was used at an earlier response position
    past the window (``history.used``, or an ancestor on the path at t' >= m); otherwise, and
    always with masking off, the label's (``KeyedSource.context_key``).

    Returns:
        (n, 2) int64, one (κ0, κ1) per entry of ``nodes``.
    """
    return torch.from_numpy(np.array(_key_list(tree, nodes, source, history), dtype=np.int64))


def _key_list(
    tree: DraftTree, nodes: list[int] | range, source: KeyedSource, history: History
) -> list[tuple[int, int]]:
    """``context_keys`` as a list of (κ0, κ1) (at least one node)."""
    width, emitted = history.width, history.emitted
    tail = history.committed[-width:]  # enough for every label of the tree (padding included)
    keys: list[tuple[int, int]] = []
    for node in nodes:
        context = tail + tree.path_tokens(node)
        along = [
            label_at(context, len(tail) + d, width) for d in range(len(context) - len(tail) + 1)
        ]
        label, depth = along[-1], len(along) - 1
        earlier = along[max(width - emitted, 0) : depth]  # ancestors' labels past the window
        repeated = label in history.used or label in earlier
        keys.append(source.context_key(label, emitted + depth, repeated))
    return keys


def race_targets(
    items: Sequence[tuple[KeyedRace, DraftTree, History]], p: Support
) -> list[Callable[[int], int]]:
    """``KeyedRace.targets`` of several trees in one pass: one clock-uniform call and one race
    (``race.race_winner_of_uniforms``: slot by slot, row by row) over all their nodes, whose
    processed laws are the consecutive row blocks of ``p`` (each tree's nodes in node order,
    the trees in ``items``' order): a node's winner is the same bits in any batch.

    Args:
        items: (policy, tree, history) per tree.
        p: (Σ n_i, K) processed target laws.
    Returns:
        Per tree, node -> the token its keyed race emits (−1: no support).
    Raises:
        ValueError: ``p``'s rows are not the trees' nodes.
    """
    sizes = [len(tree) for _, tree, _ in items]
    if sum(sizes) != p.tokens.shape[0]:
        raise ValueError(f"expected {sum(sizes)} rows of target laws, got {p.tokens.shape[0]}")
    keys: list[tuple[int, int]] = []
    for policy, tree, history in items:
        keys.extend(_key_list(tree, range(len(tree)), policy.source, history))
    words = np.array(keys, dtype=np.int64)
    winners: list[int]
    if p.tokens.device.type == "cpu":  # NumPy arrays throughout: no torch op per node or tree
        tokens = p.tokens.numpy()
        u = clock_uniforms_cpu(words, tokens, 1)[..., 0]
        winners = race_winners_of_uniforms(p.logp.numpy(), tokens, u).tolist()
    else:
        u_t = clock_uniforms(torch.from_numpy(words), p.tokens, 1)[..., 0]
        winners = race_winner_of_uniforms(p.logp, p.tokens, u_t).tolist()
    out: list[Callable[[int], int]] = []
    start = 0
    for size in sizes:
        out.append(winners[start : start + size].__getitem__)
        start += size
    return out


class Policy(Protocol):
    """How one method draws drafts and target tokens (module docstring)."""

    def drafts(
        self, tree: DraftTree, parents: list[int], q: Support, history: History
    ) -> list[list[int]]:
        """Draft tokens at each of ``parents`` (the nodes of one level, in order), whose
        drafter laws are ``q`` (n, K); an empty list where the drafter proposes nothing."""
        ...

    def targets(self, tree: DraftTree, p: Support, history: History) -> Callable[[int], int]:
        """The token the target emits at a node, from P_k at every node (``p``:
        (len(tree), K)). The loop calls it along the walk, path order, visited nodes only."""
        ...


class KeyedRace:
    """The keyed race: drafts are MPFR(Q_k, Π(c), ν(c)) (Alg. 6), the target emits the race
    winner of P_k under Π(c) (Alg. 2/3): a deterministic function of (key, nonce, prefix).

    Args:
        source: the request's keyed source (an ephemeral secret for ``*-nowm``).
    """

    def __init__(self, source: KeyedSource) -> None:
        self.source = source

    def drafts(
        self, tree: DraftTree, parents: list[int], q: Support, history: History
    ) -> list[list[int]]:
        counts = [tree.nodes[i].multiplicity for i in parents]
        keys = context_keys(tree, parents, self.source, history).to(q.tokens.device)
        clocks = exponential_clocks(keys, q.tokens, max(counts))  # (n, K, max ν)
        return mpfr_samples(q.logp, q.tokens, clocks, counts)

    def targets(self, tree: DraftTree, p: Support, history: History) -> Callable[[int], int]:
        return race_targets([(self, tree, history)], p)[0]


class Multinomial:
    """Plain sampling (``ar``): the target's token is a multinomial draw from P_k, from a
    ``torch.Generator`` seeded with the request nonce; never drafts (not speculative).

    Args:
        seed: the generator's seed.
    """

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def drafts(
        self, tree: DraftTree, parents: list[int], q: Support, history: History
    ) -> list[list[int]]:
        raise AssertionError("ar does not draft")

    def targets(self, tree: DraftTree, p: Support, history: History) -> Callable[[int], int]:
        probs = p.logp.exp().to(torch.float64).cpu()  # (n, K)
        picks = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)  # (n,)
        tokens: list[int] = p.tokens.cpu().gather(1, picks[:, None]).squeeze(1).tolist()
        return tokens.__getitem__
