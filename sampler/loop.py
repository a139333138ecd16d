"""The one speculative step loop (MPFR paper Alg. 7 / Alg. 10; docs/design.md §3, Decoder).

One step, from the committed prefix h (``step``):
1. draft tree: level s = 1..ℓ, ONE drafter call over all contexts of level s−1; the policy
   draws their drafts, equal drafts merge into one child (``grow_tree``).
2. verification: ONE target forward over the root and every node, tree-attention mask, over
   the KV cache of h (``verify_tree``).
3. walk: from the root, emit the policy's target token while it was drafted; after ℓ accepted
   levels the bonus; stop at EOS or the token budget (``walk``).
4. KV cache: keep only the realised path; the drafter is told the step's path.
What a method draws is its policy (``sampler.policies``); a one-token method is this loop with
ℓ = 0. Everything a request carries between steps is one ``SequenceState``: batching
(``sampler.batch``) is this step over a set of sequences, built from the same pieces
(``new_tree``, ``grow_level``, ``tree_inputs``, ``finish_step``).

Shapes: n tree nodes, K support slots, V vocabulary, P cached positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from keyed import KeyedSource
from sampler.autotree import BatchPrice, TreeChooser, tree_invariant
from sampler.drafters import Drafter, draft_law, feed_target_hidden, wants_target_hidden
from sampler.methods import SamplerConfig
from sampler.policies import History, KeyedRace, Policy, race_targets
from sampler.processing import Support, process
from sampler.stats import FinishReason, GenerationResult, GenerationStats, StepSeconds, count_at
from sampler.targets.base import Target, TargetLM
from sampler.targets.profile import profile_for
from sampler.targets.transformers import as_target
from sampler.tree import DraftTree
from sampler.tree_evidence import memory_for


@dataclass
class StepTotals:
    """The running sums behind ``sampler.stats.StepSeconds`` (seconds)."""

    draft: float = 0.0
    forward: float = 0.0
    walk: float = 0.0


@dataclass
class SequenceState:
    """One request between steps.

    Attributes:
        config: the request's method, B, L, N and processing.
        history: committed prefix (prompt + response) and the labels used so far.
        policy: the method's policy for this request.
        lm: the target with its KV cache of ``committed[:-1]``.
        drafter: None for a method that does not draft (one-token steps).
        eos_ids: tokens that end the sequence.
        finish: set once EOS is drawn.
        chooser: with ``config.tree == "auto"`` on a keyed-race method, the per-step choice
            of B and ℓ (``sampler.autotree``; the output does not depend on it, Thm. 5.1).
        started, prefill_seconds, target_calls_before, drafter_calls_before: for the stats.
        timing: the decoding seconds by part so far (``StepTotals``).
    """

    config: SamplerConfig
    history: History
    policy: Policy
    lm: TargetLM
    drafter: Drafter | None
    eos_ids: frozenset[int]
    started: float
    prefill_seconds: float = 0.0
    target_calls_before: int = 0
    drafter_calls_before: int = 0
    accepted: list[int] = field(default_factory=list)  # per level
    drafted: list[int] = field(default_factory=list)  # per level
    finish: FinishReason | None = None
    chooser: TreeChooser | None = None  # tree "auto": B and ℓ per step (sampler.autotree)
    timing: StepTotals = field(default_factory=lambda: StepTotals())

    @property
    def done(self) -> bool:
        return self.finish is not None or self.history.emitted >= self.config.max_new_tokens


def start(
    target: Target | PreTrainedModel,
    prompt: list[int],
    config: SamplerConfig,
    source: KeyedSource,
    drafter: Drafter | None,
    eos_ids: frozenset[int],
) -> SequenceState:
    """Prefill one request: ``start_many`` of one."""
    return start_many(target, [(prompt, config, source, drafter)], eos_ids)[0]


def start_many(
    target: Target | PreTrainedModel,
    requests: list[tuple[list[int], SamplerConfig, KeyedSource, Drafter | None]],
    eos_ids: frozenset[int],
) -> list[SequenceState]:
    """Prefill R requests: each target KV cache over its ``prompt[:-1]`` (the last token is
    the first root), together in one target forward (``Target.prefill``: each prompt a causal
    chain on its own cache, logits unread; groups split at ``PREFILL_PADDED_TOKENS``); each drafter
    starts on its prompt (a method that does not draft drops it).

    Args:
        requests: (prompt ids, config, keyed source, own drafter or None) per request.
    Returns:
        R sequences, in order; ``prefill_seconds`` is the shared prefill's time.
    """
    target = as_target(target)
    auto = tree_invariant(target)  # else tree "auto" drafts as "fixed" (autotree)
    if auto and any(c.tree == "auto" and c.speculative for _, c, _, _ in requests):
        profile_for(target)  # measured once per machine (~2 s), before the clock starts
    started = time.perf_counter()
    lms, drafters = [], []
    for prompt, config, _, drafter in requests:
        drafter = drafter if config.speculative else None
        lm = target.new_batch_cache()
        lm.keep_hidden = wants_target_hidden(drafter)
        if drafter is not None:
            drafter.start(prompt)
        lms.append(lm)
        drafters.append(drafter)
    chains = [(lm, prompt[:-1]) for lm, (prompt, *_) in zip(lms, requests, strict=True)]
    for group in prefill_groups([(lm, chain) for lm, chain in chains if chain]):
        target.prefill([lm for lm, _ in group], [chain for _, chain in group])
    prefill = time.perf_counter() - started
    seqs = []
    for lm, drafter, (prompt, config, source, _) in zip(lms, drafters, requests, strict=True):
        if len(prompt) > 1:
            feed_target_hidden(drafter, lm, -1)
        policy = config.spec.policy_for(source, target.vocab_size)
        chooser = None
        if auto and config.tree == "auto" and drafter is not None and isinstance(policy, KeyedRace):
            chooser = TreeChooser(
                profile_for(target),
                config.effective_drafts,
                config.effective_lookahead,
                memory_for(target, drafter.name, config.processing),
            )
        seqs.append(
            SequenceState(
                config,
                History(list(prompt), len(prompt), source.context_width),
                policy, lm, drafter, eos_ids, started,
                prefill_seconds=prefill,
                target_calls_before=lm.forward_calls,
                drafter_calls_before=drafter.calls if drafter is not None else 0,
                chooser=chooser,
            )
        )  # fmt: skip
    return seqs


PREFILL_PADDED_TOKENS = 2048
"""A joint prefill's bound on rows × its longest chain (the padded size the batched forward's
logits and attention scale with): longer groups split, a longer chain runs alone."""


def prefill_groups(
    chains: list[tuple[TargetLM, list[int]]], padded: int = PREFILL_PADDED_TOKENS
) -> list[list[tuple[TargetLM, list[int]]]]:
    """Consecutive groups of ``chains`` with len(group) × longest chain <= ``padded`` (a chain
    longer than that alone), in order."""
    groups: list[list[tuple[TargetLM, list[int]]]] = []
    for item in chains:
        if groups:
            group = groups[-1]
            longest = max(len(item[1]), *(len(c) for _, c in group))
            if (len(group) + 1) * longest <= padded:
                group.append(item)
                continue
        groups.append([item])
    return groups


def step(seq: SequenceState) -> list[int]:
    """One speculative step (module docstring); returns the ids it emitted (EOS excluded)."""
    tree, depth = new_tree(seq)
    # 1. draft tree: one drafter call per level
    drafting = 0.0
    if depth > 0:
        began = time.perf_counter()
        grow_tree(seq, tree, depth)
        drafting = time.perf_counter() - began
    # 2. verification: one target forward over root + every node, tree-attention mask
    began = time.perf_counter()
    logits = verify_tree(seq.lm, tree, len(seq.history.committed) - 1)
    # its time, for the tree chooser; on an accelerator the forward is asynchronous and the
    # clock would read the launch only
    verifying = time.perf_counter() - began if logits.device.type == "cpu" else None
    seq.timing.forward += time.perf_counter() - began
    # 3.-4. walk, KV keep, drafter finish
    return finish_step(seq, tree, logits, depth, drafting, verifying)


def new_tree(
    seq: SequenceState, nodes: int | None = None, price: BatchPrice | None = None
) -> tuple[DraftTree, int]:
    """The step's empty draft tree (root = the last committed token) and its depth
    ℓ = min(L, N − n).

    With a ``chooser`` (tree ``auto``) B and ℓ are its choice for this step (ℓ may be 0: a
    one-token step).

    Args:
        nodes: a cap on the tree's size (root included; ``None``: none). A draft tree of B
            drafts and depth ℓ has at most 1 + B·ℓ nodes; over the cap, B and then ℓ shrink
            (a cap of 1: no drafts, a one-token step). For the keyed race this never changes the
            output (Thm. 5.1: the emitted tokens are invariant of B and L); the batched step
            applies it to keyed-race methods only (``sampler.batch``).
        price: the chooser's pricing in a shared batch step (``sampler.autotree.BatchPrice``).
    Returns:
        (tree, depth).
    """
    config = seq.config
    remaining = config.max_new_tokens - seq.history.emitted
    if seq.chooser is not None:
        drafts, depth = seq.chooser.choose(remaining, price)
    else:
        depth = min(config.effective_lookahead, remaining)
        drafts = config.effective_drafts
    if nodes is not None and nodes <= 1:
        depth = 0  # the root alone: a one-token step
    elif nodes is not None and depth > 0 and 1 + drafts * depth > nodes:
        room = nodes - 1
        drafts = max(1, min(drafts, room // depth))  # B first: depth carries long accepts
        depth = max(1, min(depth, room // drafts))
    if seq.chooser is not None:
        drafts, depth = seq.chooser.record(drafts, depth)
    return DraftTree(seq.history.committed[-1], drafts), depth


def finish_step(
    seq: SequenceState,
    tree: DraftTree,
    logits: torch.Tensor,
    depth: int,
    draft_seconds: float = 0.0,
    forward_seconds: float | None = None,
    batched: bool = False,
    target: Callable[[int], int] | None = None,
    share: float = 0.0,
) -> list[int]:
    """Steps 3-4 after the verification forward's (len(tree), V) ``logits``: the walk, the KV
    keep, the drafter's finish; returns the ids the step emitted (EOS excluded). A
    ``chooser`` is told the step's outcome (``draft_seconds``: the step's drafting time;
    ``forward_seconds``: its own verification forward's, None when it shared one; ``batched``:
    the step was one of a batch's). ``target``: the policy's token per node when a batch
    computed it (``targets_many``; ``share``: this sequence's seconds of that), else
    it is computed here from ``logits``."""
    began = time.perf_counter()
    committed = seq.history.committed
    base = len(committed) - 1
    if target is None:
        target = seq.policy.targets(tree, process(logits, seq.config.processing), seq.history)
    # 3. walk the realised target path; emit target tokens while they were drafted
    emitted_before = len(committed)
    visited = walk(seq, tree, target, depth)
    # 4. KV cache: keep only the realised path (the last emitted token is the next root);
    # visited[k] holds token k of the path root, y1, ..., so the cache keeps committed[:-1]
    # (after EOS the sequence is done and the cache no longer matters).
    seq.lm.keep(base, [base + i for i in visited][: len(committed) - 1 - base])
    if seq.drafter is not None:
        seq.drafter.finish_step(tree, visited, committed)
        feed_target_hidden(seq.drafter, seq.lm, visited[-1])
    walking = time.perf_counter() - began + share
    seq.timing.draft += draft_seconds
    seq.timing.walk += walking
    if seq.chooser is not None:
        seq.chooser.observe(
            tree.nodes[0].multiplicity, depth, len(tree) - 1, len(visited) - 1, seq.done,
            draft_seconds, walking, forward_seconds, batched,
        )  # fmt: skip
    return committed[emitted_before:]


def targets_many(
    seqs: list[SequenceState], trees: list[DraftTree], logits: list[torch.Tensor]
) -> tuple[list[Callable[[int], int]], float]:
    """The policy's token per node of each sequence's tree, from its (len(tree), V) logits, as
    ``finish_step`` computes it alone: each sequence's logits processed with its own
    processing, and the keyed races of all keyed-race sequences of one support width K in one
    pass (``policies.race_targets``: the same bits as each alone).

    Returns:
        Per sequence, node -> target token; and each sequence's share of the seconds spent here.
    """
    began = time.perf_counter()
    out: list[Callable[[int], int] | None] = [None] * len(seqs)
    laws = [process(rows, s.config.processing) for s, rows in zip(seqs, logits, strict=True)]
    groups: dict[int, list[int]] = {}  # keyed-race sequences by support width K
    for i, s in enumerate(seqs):
        if isinstance(s.policy, KeyedRace):
            groups.setdefault(laws[i].tokens.shape[1], []).append(i)
    for raced in groups.values():
        joint = Support(
            torch.cat([laws[i].tokens for i in raced]), torch.cat([laws[i].logp for i in raced])
        )
        items = []
        for i in raced:
            policy = seqs[i].policy
            assert isinstance(policy, KeyedRace)
            items.append((policy, trees[i], seqs[i].history))
        for i, target in zip(raced, race_targets(items, joint), strict=True):
            out[i] = target
    for i, s in enumerate(seqs):
        if out[i] is None:
            out[i] = s.policy.targets(trees[i], laws[i], s.history)
    share = (time.perf_counter() - began) / max(len(seqs), 1)
    return [t for t in out if t is not None], share


def grow_tree(seq: SequenceState, tree: DraftTree, depth: int) -> None:
    """Draft tree construction: one drafter call per level (Alg. 10, lines 3-9)."""
    for level in range(1, depth + 1):
        if not grow_level(seq, tree, level):
            return


def grow_level(seq: SequenceState, tree: DraftTree, level: int) -> bool:
    """Level ``level`` of the draft tree: ONE drafter call over the contexts of level − 1, the
    policy's drafts there; False (nothing done) when level − 1 is empty."""
    parents = tree.level(level - 1)
    if not parents:
        return False
    assert seq.drafter is not None, "a method with lookahead drafts"
    q = draft_law(seq.drafter, tree, level, seq.history.committed, seq.config.processing)
    drafts = seq.policy.drafts(tree, parents, q, seq.history)
    for parent, tokens in zip(parents, drafts, strict=True):
        tree.add_drafts(parent, tokens)
    count_at(seq.drafted, level - 1)
    return True


def verify_tree(lm: TargetLM, tree: DraftTree, base: int) -> torch.Tensor:
    """One target forward over the root and every tree node (tree-attention mask over the
    cached prefix of ``base`` tokens): (len(tree), V) logits, node order. A chain (the root
    alone, a one-token step, or one draft per level) is the causal ``extend`` of its tokens:
    the same forward, without a mask to build and check."""
    if base == lm.cached and tree.is_chain():
        return lm.extend([node.token for node in tree.nodes])
    return lm.forward(*tree_inputs(tree, base), base)


def tree_inputs(tree: DraftTree, base: int) -> tuple[list[int], list[int], torch.Tensor]:
    """The verification forward's inputs of ``tree`` over a cached prefix of ``base`` tokens:
    node tokens, node depths and the (n, base + n) bool tree-attention mask."""
    visible = torch.ones((len(tree), base + len(tree)), dtype=torch.bool)
    visible[:, base:] = tree.ancestors()
    return [n.token for n in tree.nodes], [n.depth for n in tree.nodes], visible


def walk(
    seq: SequenceState, tree: DraftTree, target_token: Callable[[int], int], depth: int
) -> list[int]:
    """Emit the target's token at the root, then at each child it selects while that child was
    drafted (accepted), up to ``depth`` levels + the bonus; returns the visited nodes."""
    history = seq.history
    node, visited = 0, []
    for level in range(depth + 1):
        token = target_token(node)
        visited.append(node)
        history.use_context()
        if token in seq.eos_ids:
            seq.finish = "eos"
            break
        history.committed.append(token)
        child = tree.nodes[node].children.get(token)
        if child is not None:  # the target's token was drafted: accepted at this level
            count_at(seq.accepted, level)
        if child is None or history.emitted >= seq.config.max_new_tokens:
            break
        node = child
    return visited


def result(seq: SequenceState) -> GenerationResult:
    """The result of a finished sequence: the completion ids (no prompt), finish reason,
    watermark flag and counters."""
    config = seq.config
    out = GenerationResult(
        token_ids=tuple(seq.history.committed[seq.history.prompt_len :]),
        finish_reason=seq.finish or "length",
        method=config.method,
        watermark_applied=config.spec.watermarked and not config.processing.greedy,
        stats=stats(seq),
    )
    if seq.chooser is not None and seq.chooser.memory is not None:
        seq.chooser.memory.save()  # after the stats: the write is not decoding time
    return out


def stats(seq: SequenceState) -> GenerationStats:
    """The counters of a finished sequence."""
    drafter_calls = seq.drafter.calls - seq.drafter_calls_before if seq.drafter else 0
    return GenerationStats(
        emitted_tokens=seq.history.emitted + (1 if seq.finish == "eos" else 0),
        target_forward_passes=seq.lm.forward_calls - seq.target_calls_before,
        drafter_calls=drafter_calls,
        accepted_per_level=tuple(seq.accepted),
        drafted_per_level=tuple(seq.drafted),
        prefill_seconds=seq.prefill_seconds,
        seconds=time.perf_counter() - seq.started - seq.prefill_seconds,
        tree_choices=tuple(sorted((b, depth, n) for (b, depth), n in seq.chooser.choices.items()))
        if seq.chooser is not None
        else (),
        step_seconds=StepSeconds(seq.timing.draft, seq.timing.forward, seq.timing.walk),
    )
