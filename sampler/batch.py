"""Continuous batching: the one speculative step (``sampler.loop``) over a set of sequences.

``step_many(seqs)`` is ``loop.step`` for R requests at once:
1. draft trees: level s = 1..max ℓ, every request whose level s−1 is occupied grows it
   (``loop.grow_level``: its own drafter call and policy). Heads drafters of keyed-race
   requests run their one heads pass for all of them in ONE batched call (``prime_heads``),
   eagle drafters each level for all of them in ONE head call (``prime_eagle``); other
   drafters (ngram, self:N, model:PATH) keep one call per request and level.
2. verification: ONE target forward over all requests' trees (``targets.transformers.forward_many``:
   per-request KV rows padded to a common length, a block-diagonal tree-attention mask,
   per-request position ids); the logits are split back per request.
3.-4. every request's keyed races in one pass (``loop.targets_many``), then walk, KV keep,
   drafter finish per request (``loop.finish_step``), exactly as ``step``.

Each request keeps its own key, nonce, method, processing, B, L and stop condition; requests
join (``Batch.add_many``: the joiners' prefills in one forward) and leave (``Batch.remove``,
or when done) between steps.
A request's emitted ids are those it gets served alone (up to the floating-point rounding of a
batched forward, which in float64 never changed a token in the tests): its tokens are its own
keyed race winners at its own contexts.

Tree ``auto``: each request's chooser prices its nodes at the batch's marginal row
(``sampler.autotree.BatchPrice``: the rows the requests before it planned, the batch's one-token
rate), so a tree is drafted where its expected tokens beat the time it adds to the shared
forward.

Node budget: with ``node_budget`` set, a step whose trees could exceed it (Σ 1 + B·ℓ) caps
each keyed-race request's tree at ``node_budget // R`` nodes (``loop.new_tree``; one node: a
one-token step): a smaller B and ℓ, the same output (Thm. 5.1: the keyed race's output is
invariant of B and L). Methods whose output depends on the tree (``vsps``, ``gls``) are never
capped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import PreTrainedModel

from keyed import KeyedSource
from sampler.drafters import Drafter
from sampler.drafters.eagle import EagleDrafter, prime_eagle
from sampler.drafters.heads import HeadsDrafter, prime_heads
from sampler.loop import (
    SequenceState,
    finish_step,
    grow_level,
    new_tree,
    result,
    start_many,
    targets_many,
    tree_inputs,
)
from sampler.methods import SamplerConfig
from sampler.policies import KeyedRace
from sampler.stats import GenerationResult
from sampler.targets.base import Target
from sampler.targets.transformers import as_target, forward_many
from sampler.tree import DraftTree


def budget_invariant(seq: SequenceState) -> bool:
    """Whether ``seq``'s output is invariant of its tree's B and ℓ (the keyed race)."""
    return isinstance(seq.policy, KeyedRace)


def step_many(seqs: list[SequenceState], node_budget: int | None = None) -> list[list[int]]:
    """One speculative step of every sequence in ``seqs`` (module docstring).

    Args:
        seqs: R >= 1 sequences on the same target, none done.
        node_budget: cap on the tree nodes of one verification forward of R >= 2 sequences
            (``None``: none); only keyed-race sequences are capped, each at
            ``node_budget // R`` nodes (at least 1: a one-token step).
    Returns:
        Per sequence, the ids its step emitted (EOS excluded).
    """
    if not seqs:
        return []
    cap = None
    if node_budget is not None and len(seqs) > 1:  # a lone request steps as ``loop.step``
        bound = sum(1 + s.config.effective_drafts * s.config.effective_lookahead for s in seqs)
        if bound > node_budget:
            cap = max(node_budget // len(seqs), 1)
    planned, extra = [], 0
    for s in seqs:  # tree "auto" prices a node at the batch's marginal row (BatchPrice)
        price = None
        if s.chooser is not None and len(seqs) > 1:
            price = s.chooser.batch_price(len(seqs) - 1 + extra, len(seqs))
        tree, depth = new_tree(s, cap if budget_invariant(s) else None, price)
        extra += tree.nodes[0].multiplicity * depth
        planned.append((tree, depth))
    trees: list[DraftTree] = [tree for tree, _ in planned]
    depths = [depth for _, depth in planned]
    # 1. draft trees, level by level over the requests
    heads = [
        (s.drafter, s.history.committed[-1])
        for s, d in zip(seqs, depths, strict=True)
        if d > 0 and isinstance(s.drafter, HeadsDrafter) and budget_invariant(s)
    ]
    if len(heads) > 1:
        prime_heads([h for h, _ in heads], [root for _, root in heads])
    drafting = [0.0] * len(seqs)  # per request: its drafter calls' seconds (its chooser's c)
    growing = [i for i, d in enumerate(depths) if d > 0]
    for level in range(1, max(depths, default=0) + 1):
        eagles: list[tuple[int, EagleDrafter]] = []
        for i in growing:
            drafter = seqs[i].drafter
            if (
                depths[i] >= level
                and isinstance(drafter, EagleDrafter)
                and budget_invariant(seqs[i])
            ):
                eagles.append((i, drafter))
        if len(eagles) > 1:
            began = time.perf_counter()
            prime_eagle([d for _, d in eagles], [trees[i] for i, _ in eagles], level)
            share = (time.perf_counter() - began) / len(eagles)  # each request's part
            for i, _ in eagles:
                drafting[i] += share
        still = []
        for i in growing:
            if depths[i] < level:
                continue
            began = time.perf_counter()
            if grow_level(seqs[i], trees[i], level):
                still.append(i)
            drafting[i] += time.perf_counter() - began
        growing = still
        if not growing:
            break
    # 2. one target forward over every request's tree
    bases = [len(s.history.committed) - 1 for s in seqs]
    inputs = [tree_inputs(tree, base) for tree, base in zip(trees, bases, strict=True)]
    began = time.perf_counter()
    logits = forward_many(
        [s.lm for s in seqs],
        [tokens for tokens, _, _ in inputs],
        [d for _, d, _ in inputs],
        [visible for _, _, visible in inputs],
        bases,
    )
    shared = time.perf_counter() - began  # each request waited for the whole forward
    for s in seqs:
        s.timing.forward += shared
    # 3. every request's target tokens: the keyed races in one pass (``loop.targets_many``)
    targets, share = targets_many(seqs, trees, logits)
    # 3.-4. walk, KV keep and drafter finish, per request
    return [
        finish_step(s, tree, rows, depth, seconds, len(seqs) > 1, target=target, share=share)
        for s, tree, rows, depth, seconds, target in zip(
            seqs, trees, logits, depths, drafting, targets, strict=True
        )
    ]


@dataclass
class Member:
    """One request of a ``Batch``: its sequence and the caller's tag (e.g. a job)."""

    seq: SequenceState
    tag: object
    prompt_len: int


class Batch:
    """The active requests of continuous batching: join, step together, leave.

    Args:
        target: the target all requests share (``sampler.targets.base.Target``; a bare
            transformers model runs on its own forward).
        node_budget: ``step_many``'s cap on tree nodes per verification forward (None: none).
    """

    def __init__(self, target: Target | PreTrainedModel, node_budget: int | None = None) -> None:
        self.target = as_target(target)
        self.node_budget = node_budget
        self.members: list[Member] = []

    def __len__(self) -> int:
        return len(self.members)

    def check(self, prompt: list[int], config: SamplerConfig, drafter: Drafter | None) -> None:
        """Whether a request may join: raises ``ValueError`` as ``decoder.generate`` does for
        an empty prompt, ids outside the vocabulary or a missing drafter, and for a drafter
        instance another member already uses (``drafters.fresh_drafter`` gives each its own).
        """
        vocab = self.target.vocab_size
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt ids must be in [0, {vocab})")
        if config.speculative and drafter is None:
            raise ValueError(f"method {config.method!r} needs a drafter")
        if drafter is not None and any(m.seq.drafter is drafter for m in self.members):
            raise ValueError("each request of a batch needs its own drafter instance")

    def add(
        self,
        prompt: list[int],
        config: SamplerConfig,
        source: KeyedSource,
        drafter: Drafter | None,
        eos_ids: frozenset[int],
        tag: object = None,
    ) -> Member:
        """Prefill a new request and add it: ``add_many`` of one.

        Raises:
            ValueError: as ``check``.
        """
        return self.add_many([(prompt, config, source, drafter, tag)], eos_ids)[0]

    def add_many(
        self,
        requests: Sequence[tuple[list[int], SamplerConfig, KeyedSource, Drafter | None, object]],
        eos_ids: frozenset[int],
    ) -> list[Member]:
        """Prefill new requests in ONE target forward (``loop.start_many``) and add them.

        Args:
            requests: (prompt ids, config, keyed source, own drafter or None, tag) per request.
        Returns:
            Their members, in order.
        Raises:
            ValueError: as ``check``, for the first request that may not join (none joins).
        """
        drafters = [d for _, _, _, d, _ in requests if d is not None]
        if len({id(d) for d in drafters}) < len(drafters):
            raise ValueError("each request of a batch needs its own drafter instance")
        for prompt, config, _, drafter, _ in requests:
            self.check(prompt, config, drafter)
        seqs = start_many(self.target, [(p, c, s, d) for p, c, s, d, _ in requests], eos_ids)
        members = [
            Member(seq, tag, len(prompt))
            for seq, (prompt, _, _, _, tag) in zip(seqs, requests, strict=True)
        ]
        self.members.extend(members)
        return members

    def remove(self, member: Member) -> None:
        """Drop a request (cancelled, or done); its KV cache goes with it."""
        self.members.remove(member)

    def step(self) -> list[tuple[Member, list[int]]]:
        """One step of every active request; the finished ones leave the batch.

        Returns:
            (member, ids emitted this step) per request that stepped, in batch order.
        """
        active = [m for m in self.members if not m.seq.done]
        emitted = step_many([m.seq for m in active], self.node_budget)
        for member in active:
            if member.seq.done:
                self.members.remove(member)
        return list(zip(active, emitted, strict=True))

    @staticmethod
    def result(member: Member) -> GenerationResult:
        """The result of a finished member (as ``decoder.generate`` returns it)."""
        return result(member.seq)


def generate_many(
    target: Target | PreTrainedModel,
    requests: list[tuple[list[int], SamplerConfig, KeyedSource, Drafter | None]],
    eos_ids: frozenset[int] = frozenset(),
    max_batch: int | None = None,
    node_budget: int | None = None,
    on_tokens: Callable[[int, list[int]], None] | None = None,
) -> list[GenerationResult]:
    """``decoder.generate`` for many requests, continuously batched: at most ``max_batch``
    active at once (None: all); waiting ones join as soon as slots are free, those joining
    together in one prefill forward.

    Args:
        requests: (prompt ids, config, keyed source, own drafter or None) per request; each
            speculative request needs its own drafter instance (``drafters.fresh_drafter``).
        on_tokens: called with (request index, ids) after each step of that request.
    Returns:
        One ``GenerationResult`` per request, in order; each equals the request's solo
        ``generate`` output (module docstring).
    """
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch: expected >= 1, got {max_batch}")
    batch = Batch(target, node_budget)
    results: list[GenerationResult | None] = [None] * len(requests)
    waiting = list(enumerate(requests))[::-1]
    while waiting or batch.members:
        joining: list[tuple[list[int], SamplerConfig, KeyedSource, Drafter | None, int]] = []
        while waiting and (max_batch is None or len(batch) + len(joining) < max_batch):
            index, (prompt, config, source, drafter) = waiting.pop()
            joining.append((prompt, config, source, drafter, index))
        for member in batch.add_many(joining, eos_ids) if joining else []:
            if member.seq.done:  # nothing to generate (cannot happen for N >= 1)
                assert isinstance(member.tag, int)
                batch.remove(member)
                results[member.tag] = Batch.result(member)
        for member, ids in batch.step():
            tag = member.tag
            assert isinstance(tag, int)
            if on_tokens is not None:
                on_tokens(tag, ids)
            if member.seq.done:
                results[tag] = Batch.result(member)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]
