"""The speculative decoder: keyed multi-draft speculative sampling (MPFR paper Alg. 7 / Alg. 10).

Glossary:
- target P_k / drafter Q_k: processed next-token laws (``sampler.processing``).
- draft tree: contexts reachable by the B drafts within ℓ = min(L, N − n) tokens; each occupied
  context c with multiplicity ν(c) draws ν(c) drafts by MPFR(Q_k(·|c), Π(c), ν(c)).
- accepted: the target's keyed race winner y(c*) is one of the drafted children D(c*).
- bonus token: after ℓ accepted levels, the target's winner at the leaf context.
- clock: Exp(1) increments from the keyed source Π(c) (``keyed``), shared by draft and target.

Every emitted token is the target's keyed race winner at its own context, so the output is a
function of (key, nonce, prompt, target) only: identical to autoregressive keyed sampling
(``basic-uwm``) for every drafter, B and L (stopping-time drafter invariance, Prop. 4.4 /
Prop. C.3; exactness of the law, Thm. A.6).

One step = ℓ drafter calls (one per tree level) + ONE target forward over the whole tree.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import PreTrainedModel

from keyed import KeyedSource, Label, Secret, label_at
from keyed.tensor import exponential_clocks
from sampler.cached_lm import CachedLM
from sampler.drafters import Drafter, feed_target_hidden, wants_target_hidden
from sampler.processing import Processing, Support, process
from sampler.race import mpfr_samples, race_winner
from sampler.tree import DraftTree

Method = Literal["ar", "basic-uwm", "pfr", "mpfr", "pfr-nowm", "mpfr-nowm", "vsps", "gls"]
METHODS: tuple[str, ...] = (
    "ar", "basic-uwm", "pfr", "mpfr", "pfr-nowm", "mpfr-nowm", "vsps", "gls"
)  # fmt: skip
SPECULATIVE = frozenset({"pfr", "mpfr", "pfr-nowm", "mpfr-nowm", "vsps", "gls"})
"""Methods that draft; ``vsps`` and ``gls`` are the unwatermarked baselines
(``sampler.baselines``)."""
BASELINES = frozenset({"vsps", "gls"})
MAX_DRAFTS = 64
MAX_LOOKAHEAD = 32


@dataclass(frozen=True)
class SamplerConfig:
    """What to sample and how.

    Attributes:
        method: one of ``METHODS``.
        drafts: B >= 1 (``pfr`` forces 1; ignored by ``ar``/``basic-uwm``).
        lookahead: L >= 1 (ignored by ``ar``/``basic-uwm``).
        max_new_tokens: N >= 1.
        processing: temperature, top-k, top-p.
    Raises:
        ValueError: at construction, naming the field and the limit.
    """

    method: str = "mpfr"
    drafts: int = 4
    lookahead: int = 4
    max_new_tokens: int = 128
    processing: Processing = field(default_factory=Processing)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if not 1 <= self.drafts <= MAX_DRAFTS:
            raise ValueError(f"drafts must be in [1, {MAX_DRAFTS}], got {self.drafts}")
        if not 1 <= self.lookahead <= MAX_LOOKAHEAD:
            raise ValueError(f"lookahead must be in [1, {MAX_LOOKAHEAD}], got {self.lookahead}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def speculative(self) -> bool:
        return self.method in SPECULATIVE

    @property
    def effective_drafts(self) -> int:
        return 1 if self.method in ("pfr", "pfr-nowm", "vsps") else self.drafts


@dataclass(frozen=True)
class GenerationStats:
    """Counters of one generation. Seconds are wall-clock; prefill is reported separately."""

    emitted_tokens: int
    target_forward_passes: int
    drafter_calls: int
    accepted_per_level: tuple[int, ...]
    drafted_per_level: tuple[int, ...]
    prefill_seconds: float
    seconds: float

    @property
    def aatps(self) -> float:
        """Average accepted tokens per step: emitted tokens per target forward pass."""
        return self.emitted_tokens / max(self.target_forward_passes, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.emitted_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class GenerationResult:
    """A completion without the prompt (case C3); EOS is not included in ``token_ids``."""

    token_ids: tuple[int, ...]
    finish_reason: Literal["eos", "length"]
    method: str
    watermark_applied: bool
    stats: GenerationStats


@dataclass
class _State:
    """What carries from one step to the next."""

    committed: list[int]  # prompt + response
    prompt_len: int
    history: set[Label] = field(default_factory=set)  # labels used at response positions
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)

    @property
    def emitted(self) -> int:
        return len(self.committed) - self.prompt_len


def count_at(counts: list[int], index: int) -> None:
    """``counts[index] += 1``, growing ``counts`` with zeros (per-level counters)."""
    while len(counts) <= index:
        counts.append(0)
    counts[index] += 1


def verify_tree(lm: CachedLM, tree: DraftTree, base: int) -> torch.Tensor:
    """One target forward over the root and every tree node (tree-attention mask over the
    cached prefix of ``base`` tokens): (len(tree), V) logits, node order."""
    visible = torch.ones((len(tree), base + len(tree)), dtype=torch.bool)
    visible[:, base:] = tree.ancestors()
    return lm.forward([n.token for n in tree.nodes], [n.depth for n in tree.nodes], visible, base)


def _winners(
    support: Support, tree: DraftTree, source: KeyedSource | None, generator: torch.Generator | None
) -> list[int]:
    """Target-side token at every tree node: keyed race winner, or a plain sample for ``ar``."""
    if source is None:
        assert generator is not None
        probs = support.logp.exp().to(torch.float64).cpu()
        picks = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        return support.tokens.cpu().gather(1, picks[:, None]).squeeze(1).tolist()
    clocks = exponential_clocks(
        tree.keys(list(range(len(tree))), support.tokens.device), support.tokens, 1
    )[..., 0]  # (n, K)
    return race_winner(support.logp, support.tokens, clocks).tolist()


def _grow_tree(
    tree: DraftTree, drafter: Drafter, depth: int, state: _State, processing: Processing
) -> None:
    """Draft tree construction: one drafter call per level (Alg. 10, lines 3-9)."""
    for level in range(1, depth + 1):
        parents = tree.levels[level - 1] if level - 1 < len(tree.levels) else []
        if not parents:
            return
        logits = drafter.propose(tree, level, state.committed)  # (n, V)
        q = process(logits, processing)
        counts = [tree.nodes[i].multiplicity for i in parents]
        clocks = exponential_clocks(tree.keys(parents, q.tokens.device), q.tokens, max(counts))
        for parent, drafts in zip(
            parents, mpfr_samples(q.logp, q.tokens, clocks, counts), strict=True
        ):
            tree.add_drafts(parent, drafts)
        count_at(state.drafted, level - 1)


def generate(
    target: PreTrainedModel,
    prompt: list[int],
    config: SamplerConfig,
    source: KeyedSource | None = None,
    drafter: Drafter | None = None,
    eos_ids: frozenset[int] = frozenset(),
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Sample a completion of ``prompt`` from the target (MPFR paper Alg. 7 / Alg. 10).

    Args:
        target: a causal LM (eval mode) on its device.
        prompt: the prompt's token ids (at least one).
        config: method, B, L, N and the logit processing.
        source: the keyed source (secret, context width, masking, nonce) for keyed methods;
            ``*-nowm`` methods replace its secret by an ephemeral one; ``ar`` uses its nonce
            as the seed of a plain multinomial sampler.
        drafter: required for speculative methods.
        eos_ids: tokens that end the completion (not included in the result).
        on_tokens: called after every step with the ids that step emitted, in order (EOS
            excluded, so the last call may get ``[]``); the calls concatenate to the result's
            ``token_ids``. For streaming; an exception it raises stops generation and propagates
            (e.g. to cancel a request).
    Returns:
        ``GenerationResult`` with the completion ids (no prompt), stats and
        ``watermark_applied`` (False for ``ar``, ``*-nowm`` and temperature 0).
    Raises:
        ValueError: empty prompt, ids outside the vocabulary, missing source or drafter.
    """
    vocab = target.config.vocab_size
    if not prompt:
        raise ValueError("prompt must contain at least one token")
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise ValueError(f"prompt ids must be in [0, {vocab})")
    if source is None:
        raise ValueError("a keyed source (key or nonce) is required")
    if config.speculative and drafter is None:
        raise ValueError(f"method {config.method!r} needs a drafter")
    if config.method in BASELINES:
        from sampler.baselines import generate_baseline  # it builds on this module

        return generate_baseline(
            target, prompt, config, drafter, source.nonce, eos_ids, on_tokens
        )  # fmt: skip
    generator: torch.Generator | None = None
    keyed: KeyedSource | None = source
    if config.method == "ar":
        generator = torch.Generator().manual_seed(source.nonce)
        keyed = None
    elif config.method.endswith("-nowm"):
        keyed = KeyedSource(
            Secret(secrets.token_bytes(32)), source.context_width, source.masking, source.nonce
        )
    watermark = (
        keyed is not None
        and config.method in ("basic-uwm", "pfr", "mpfr")
        and not (config.processing.greedy)
    )
    width = source.context_width
    drafts = config.effective_drafts
    lookahead = config.lookahead if config.speculative else 0

    start = time.perf_counter()
    lm = CachedLM(target)
    lm.keep_hidden = config.speculative and wants_target_hidden(drafter)
    if drafter is not None and config.speculative:
        drafter.start(prompt)
    if len(prompt) > 1:
        lm.extend(prompt[:-1])
        feed_target_hidden(drafter, lm, -1)
    if drafter is not None and config.speculative:
        drafter_calls_before = drafter.calls
    prefill = time.perf_counter() - start
    target_calls_before = lm.forward_calls

    state = _State(committed=list(prompt), prompt_len=len(prompt))
    finish: Literal["eos", "length"] = "length"
    while state.emitted < config.max_new_tokens:
        budget = config.max_new_tokens - state.emitted
        depth = min(lookahead, budget)
        root_label = label_at(state.committed, len(state.committed), width)
        tree = DraftTree(
            state.committed[-1], root_label, state.emitted, state.history, keyed, drafts
        )
        # 1. draft tree: one drafter call per level
        if depth and drafter is not None:
            _grow_tree(tree, drafter, depth, state, config.processing)
        # 2. verification: one target forward over root + every node, tree-attention mask
        base = len(state.committed) - 1
        logits = verify_tree(lm, tree, base)
        winners = _winners(process(logits, config.processing), tree, keyed, generator)
        # 3. walk the realised target path; emit target winners while they were drafted
        emitted_before = len(state.committed)
        node, visited = 0, []
        for level in range(depth + 1):
            token = winners[node]
            visited.append(node)
            state.history.add(tree.nodes[node].label)
            if token in eos_ids:
                finish = "eos"
                break
            state.committed.append(token)
            child = tree.nodes[node].children.get(token) if level < depth else None
            if child is not None:  # the target winner was drafted: accepted at this level
                count_at(state.accepted, level)
            if child is None or state.emitted >= config.max_new_tokens:
                break
            node = child
        # 4. KV cache: keep only the realised path (the last emitted token is the next root)
        # visited[k] holds token k of the path root, y1, ..., so the cache keeps exactly
        # committed[:-1] (after EOS the loop ends and the cache no longer matters).
        lm.keep(base, [base + i for i in visited][: len(state.committed) - 1 - base])
        if drafter is not None and config.speculative:
            drafter.finish_step(tree, visited, state.committed)
            feed_target_hidden(drafter, lm, visited[-1])
        if on_tokens is not None:
            on_tokens(state.committed[emitted_before:])
        if finish == "eos":
            break
    seconds = time.perf_counter() - start - prefill
    stats = GenerationStats(
        emitted_tokens=state.emitted + (1 if finish == "eos" else 0),
        target_forward_passes=lm.forward_calls - target_calls_before,
        drafter_calls=(drafter.calls - drafter_calls_before)
        if drafter is not None and config.speculative
        else 0,
        accepted_per_level=tuple(state.accepted),
        drafted_per_level=tuple(state.drafted),
        prefill_seconds=prefill,
        seconds=seconds,
    )
    return GenerationResult(
        token_ids=tuple(state.committed[state.prompt_len :]),
        finish_reason=finish,
        method=config.method,
        watermark_applied=watermark,
        stats=stats,
    )
