"""Draft trees sized for the hardware: each step, the number of drafts B and
the depth ℓ that maximise the expected emitted tokens per second.

The keyed race's output does not depend on B or L (MPFR paper Thm. 5.1), so a keyed-race
request may change its tree every step without changing a token: only the speed moves. The
choice is a cost model in the spirit of Sequoia (Chen et al. 2024):

    tokens(B, ℓ) = 1 + π·Σ_{s=1..ℓ} Π_{j=1..s} a_j(B)        (the bonus token included)
    seconds(B, ℓ) = s·t(1 + f·B·ℓ) + ℓ·c + o                  (ℓ = 0: s₀·t(1) + o)
    choice        = argmax tokens / seconds

- t(n): the target's forward seconds over n new tokens after a cached context, measured once
  per machine and target (``sampler.targets.profile.ForwardProfile``; cached as JSON in the data
  dir, keyed by the CPU, threads, torch version, precision and model).
- π: the share of the request's tree steps where the drafter proposed anything (an n-gram
  drafter often has no match); a_j(B): the request's own acceptance rate, over the steps with
  a proposal, at level j given level j−1 accepted, with B drafts
  (a Beta(1, 2) prior, mean 1/3: with Beta(1, 1) every request began by drafting where trees
  cost 1.5 one-token forwards (llama.cpp) until its own rejections said otherwise, ~15 trees of
  2-3 nodes per 128 tokens, 24 % accepted, 3 % slower than ``basic-uwm``, in one-off runs;
  counted from its steps; a larger B never estimated below a smaller one).
- f: the share of the planned B·ℓ nodes the drafter actually proposes (an n-gram drafter with
  no match proposes none), c: drafting seconds per level (0 until measured: the first tree
  with an unmeasured drafter counts as an explore), o: the step's other seconds (walk,
  race, KV keep), s and s₀: its tree and one-token forwards' measured seconds over the
  profile's (``TreeChooser.forward_scale``); running means of this request's steps. A
  forward whose node count differs from the last one's pays for a new compute graph on
  llama.cpp: that one-off cost is measured apart and spread over the steps the new size is
  expected to run (at most ``SWITCH_STEPS``), so a size that loses in steady state is
  left even though leaving costs a rebuild.
- only where the target's logits do not depend on the tree (``tree_invariant``: the bfloat16
  runner, llama.cpp (precision gguf) or float64); on transformers' float32 ``auto`` drafts
  as ``fixed``.
- ℓ = 0 (a one-token step, no drafting) is a candidate: where no tree pays the request steps
  as ``basic-uwm`` does, and every ``EXPLORE_EVERY``-th such step tries a tree once so
  that a drafter that starts to match (repeated text) is noticed; the explored tree is the
  cheapest one (B = 1, ℓ = 1: on llama.cpp a 17-node tree costs ~10 one-token forwards, a
  2-node one ~2; level-1 acceptance of one draft lifts every B's estimate); each one that is
  rejected at level 1 doubles that interval (up to ``EXPLORE_MAX``), an accepted one halves it
  (down to ``EXPLORE_EVERY``), so the interval settles where explores are accepted about half
  the time, and it is never shorter than what keeps explores within ``EXPLORE_BUDGET`` of the
  decoding time (``TreeChooser.explore_interval``: a drafter whose pass costs two steps
  explores every 64th step at most). On llama.cpp, where no tree pays, exploring every 8th
  step cost ~6 %; resetting to 8 on each accepted explore, one in 5-7 with the
  n-gram drafter on chat answers, ~4 % (one-off runs). Explores also stop once their
  measured loss reaches ``EXPLORE_BUDGET`` of the request's time (its steps so far and its
  tokens still to go at the one-token rate): a lone request never pays more than that for them.
  The budget is 0.5 %: where no tree pays (Intel Xeon with AMX, the eagle drafter: a one-draft
  step 8.29 ms for 1.42 tokens against 4.71 ms a token) a budget of 2 % kept the default 2-5 %
  behind ``basic-uwm`` (bench/results/speed_cpu_xeon_amx_memory.md); at 0.5 % a 128-token request
  there does not explore, a longer one while its explores' loss fits the budget.
- a lone request whose best tree is priced below ``HOLD_MARGIN`` of a one-token step keeps
  that verdict for ``HOLD_STEPS`` steps (an explore that falls due or a tree step ends it):
  one-token steps move the evidence little, so pricing every tree again on each of them is
  Python the step pays for nothing.
- a process remembers (``sampler.tree_evidence.TreeMemory``, per target, drafter and
  processing): every request's steps also count there, and a new request starts from it — the
  drafter's cost, the forward scales and the other seconds as ``MEMORY_COST_STEPS`` steps of
  evidence, acceptance and the proposal rate as ``MEMORY_ACCEPTANCE_STEPS`` (they differ more
  between requests) — instead of from the priors, so its first explore is priced and a
  drafter that pays is used at once.
- in a batch (``BatchPrice``: R ≥ 2 requests share one forward) a node costs the batch's
  marginal row time, not a lone forward's: a step is worth its expected tokens less the
  seconds it adds to the shared step, s·(t(r + 1 + f·B·ℓ) − t(r + 1)) + ℓ·c (r: the rows the
  other requests already put in the forward), at the batch's one-token rate R / (s₀·t(R))
  tokens a second (``TreeChooser.batch_price``); a one-token step is worth 1.

Shapes: n tree nodes (root included); B drafts; ℓ depth.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from transformers import PreTrainedModel

from sampler.targets.base import Target
from sampler.targets.profile import ForwardProfile
from sampler.targets.transformers import as_target
from sampler.tree_evidence import Evidence, TreeMemory

log = logging.getLogger("poissonmark.autotree")

CANDIDATE_DRAFTS: Final = (1, 2, 4, 8, 16)
PRIOR_ACCEPTED: Final = 1.0  # the Beta prior of each level's acceptance (module docstring)
PRIOR_REJECTED: Final = 2.0
EXPLORE_EVERY: Final = 8
EXPLORE_MAX: Final = 64
EXPLORE_BUDGET: Final = 0.005  # explores' expected loss, as a share of decoding time
SWITCH_STEPS: Final = EXPLORE_EVERY  # a change of tree size is priced over this many steps
HOLD_STEPS: Final = 8  # a lone one-token verdict with trees below HOLD_MARGIN of it stands ...
HOLD_MARGIN: Final = 0.9  # ... this many steps (one-token steps move the evidence little)


def tree_invariant(target: Target | PreTrainedModel) -> bool:
    """Whether ``target``'s logits at a context are the same bits whatever the tree or batch
    around it: the row-invariant runner (``sampler.targets.cpu_bf16``), llama.cpp as
    ``sampler.targets.llamacpp`` runs it, the static layout (``sampler.targets.static``) or float64
    weights. Only there
    does tree ``auto`` choose trees: on transformers' float32 a timing-driven tree could flip
    a near-tie between runs of the same request, so ``auto`` drafts as ``fixed`` there
    (``Target.invariant``)."""
    return as_target(target).invariant


@dataclass(frozen=True)
class BatchPrice:
    """How a node is priced in a step that R >= 2 requests share (module docstring).

    Attributes:
        rows: the rows the other requests put in the forward so far (at least their roots).
        rate: the batch's one-token rate, tokens per second: R / t(R).
    """

    rows: int
    rate: float


@dataclass
class TreeChooser:
    """One request's tree sizing (module docstring).

    Args:
        profile: the target's ``ForwardProfile``.
        max_drafts: B's cap (the request's ``drafts``).
        max_depth: ℓ's cap (the request's ``lookahead``).
    Attributes:
        choices: (B, ℓ) -> steps it was chosen.
    """

    profile: ForwardProfile
    max_drafts: int
    max_depth: int
    memory: TreeMemory | None = None
    choices: Counter[tuple[int, int]] = field(default_factory=Counter)
    evidence: Evidence = field(default_factory=Evidence)
    _since_tree: int = 0
    _explore_every: int = EXPLORE_EVERY
    _exploring: bool = False
    _elapsed: float = 0.0  # seconds of this request's observed steps
    _explore_loss: float = 0.0  # of them, what its explores cost beyond their tokens
    _remaining: int = 0  # tokens to go at the last choice
    _last_nodes: int | None = None  # the last step's forward nodes
    _hold: int = 0  # one-token steps the last clear verdict still covers
    _hold_interval: float = 0.0  # ... while fewer steps than this separate them from a tree

    def __post_init__(self) -> None:
        if self.max_drafts < 1 or self.max_depth < 1:
            raise ValueError(f"expected caps >= 1, got B {self.max_drafts}, L {self.max_depth}")
        smaller = [b for b in CANDIDATE_DRAFTS if b < self.max_drafts]
        self.drafts_options = (*smaller, self.max_drafts)
        if self.memory is not None:
            self.evidence = self.memory.seed(self.max_depth)

    def acceptance(self, drafts: int, level: int) -> float:
        """a_level(B): the posterior mean acceptance at ``level`` (1-based) given the level
        before accepted, with ``drafts`` drafts; never below a smaller B's."""
        b = max(x for x in self.drafts_options if x <= max(drafts, 1))
        return self._acceptances(level)[b][level - 1]

    def _acceptances(self, depth: int) -> dict[int, list[float]]:
        """a_s(B) (``acceptance``) for s = 1..``depth``, every candidate B, in one pass."""
        table: dict[int, list[float]] = {}
        floor = [0.0] * depth
        for b in self.drafts_options:
            reached = self.evidence.reached.get(b, [])
            accepted = self.evidence.accepted.get(b, [])
            for i in range(depth):
                r = reached[i] if i < len(reached) else 0.0
                a = accepted[i] if i < len(accepted) else 0.0
                posterior = (a + PRIOR_ACCEPTED) / (r + PRIOR_ACCEPTED + PRIOR_REJECTED)
                floor[i] = max(floor[i], posterior)
            table[b] = list(floor)
        return table

    def proposal_rate(self) -> float:
        """π: the share of this request's tree steps where the drafter proposed a node (1
        before the first; an n-gram drafter without a match proposes none)."""
        return self.evidence.proposing.get(1.0)

    def expected_tokens(self, drafts: int, depth: int) -> float:
        """1 + π·Σ_{s<=ℓ} Π_{j<=s} a_j(B): emitted tokens of a step, the bonus included."""
        total, survive = 1.0, self.proposal_rate()
        for a in self._acceptances(depth)[drafts] if depth else []:
            survive *= a
            total += survive
        return total

    def forward_scale(self, tree: bool, switched: bool = False) -> float:
        """This request's forwards, of one token (``tree`` False) or of a tree with nodes,
        measured against the profile: the mean of seconds / t(nodes) over its steps whose
        node count did (``switched``) or did not change from the step before. Unmeasured, a
        steady scale is the other kind's steady one (the machine's load scales both), else 1,
        never a changing one (that would charge a rebuild on every step); a changing scale is
        the steady one of its kind. On llama.cpp a 2-node forward inside requests cost
        1.31-1.5 one-token ones (``measure_profile``'s comment), other load on the machine
        scales every forward, and a forward whose node count differs from the last one's pays
        for a new compute graph (llama.cpp reuses a graph only for the same shape)."""
        scale = self.evidence.scale
        steady = scale[(tree, False)].get(scale[(not tree, False)].get(1.0))
        return scale[(tree, True)].get(steady) if switched else steady

    def _switched(self, nodes: int) -> bool:
        """Whether a forward of ``nodes`` nodes changes the node count of the last step (the
        first step of a request does: the prefill before it had another shape)."""
        return self._last_nodes is None or nodes != self._last_nodes

    def level_seconds(self) -> float:
        """c: the drafter's measured seconds per level, 0 until measured (no tree step yet in
        this request or in its process's memory); a tree run before that counts as an
        explore (``choose``)."""
        return self.evidence.draft_level.get(0.0)

    def expected_seconds(self, drafts: int, depth: int, tokens: float | None = None) -> float:
        """s·t(1 + f·B·ℓ) + ℓ·c + o (module docstring; s: ``forward_scale`` of forwards that
        keep their node count), plus, where the step changes the node count of the last one,
        the change's one-off cost spread over the steps the new size is expected to run
        (the tokens to go at its expected tokens per step, at most ``SWITCH_STEPS``: a size
        is reconsidered every step, and explores come back to trees every ``EXPLORE_EVERY``
        steps or later; at least one): a new compute graph is paid once, not on every step
        of a size, so a size that loses in steady state is left even when leaving costs a
        rebuild. ``tokens``: ``expected_tokens(drafts, depth)`` where the caller has it."""
        return self._seconds(self._terms(depth > 0), drafts, depth, tokens)

    def _terms(self, tree: bool) -> tuple[float, float, float, float, float]:
        """What ``expected_seconds`` reads of the evidence for a tree or a one-token step: the
        steady forward scale, a change's extra scale, the fill f, c and o."""
        e = self.evidence
        steady, extra = self.forward_scale(tree, False), self._change_extra(tree)
        return steady, extra, e.fill.get(1.0), self.level_seconds(), e.other.get(0.0)

    def _change_extra(self, tree: bool) -> float:
        """The scale a forward of its kind adds when it changes the node count (a rebuilt
        compute graph), at least 0."""
        return max(self.forward_scale(tree, True) - self.forward_scale(tree, False), 0.0)

    def _seconds(
        self,
        terms: tuple[float, float, float, float, float],
        drafts: int,
        depth: int,
        tokens: float | None,
    ) -> float:
        steady, extra, fill, level, other = terms
        nodes = 1 + fill * drafts * depth if depth else 1.0
        cost = self.profile.cost(nodes)
        seconds = steady * cost + depth * level + other
        if extra and self._switched(round(nodes)):
            if tokens is None:
                tokens = self.expected_tokens(drafts, depth)
            seconds += extra * cost / min(max(self._remaining / tokens, 1.0), SWITCH_STEPS)
        return seconds

    def batch_price(self, rows: int, requests: int) -> BatchPrice:
        """The pricing of a step shared by ``requests`` requests whose others put ``rows``
        rows in the forward: their one-token rate from this request's measured one-token
        forwards (s₀·t(R)), so a load that scales every forward cancels out."""
        seconds = self.forward_scale(False) * self.profile.cost(requests)
        return BatchPrice(rows, requests / seconds)

    def choose(self, remaining: int, price: BatchPrice | None = None) -> tuple[int, int]:
        """(B, ℓ) for the next step, ℓ <= ``remaining`` tokens to go; (1, 0): no tree. The
        caller ``record``s what it runs (a node cap may shrink it). Alone: the best expected
        tokens per second; with a ``price`` (a shared batch step), the best expected tokens
        less the seconds the tree adds to the batch's forward at its rate (module docstring)."""
        self._remaining = max(remaining, 0)
        if price is None and self._hold > 0 and self._since_tree + 1 < self._hold_interval:
            self._hold -= 1  # a clear one-token verdict stands (``HOLD_STEPS``)
            self._since_tree += 1
            return (1, 0)
        depth_cap = min(self.max_depth, self._remaining)
        acceptances, terms = self._acceptances(depth_cap), self._terms(True)
        scale, _, fill, level_seconds, _ = terms
        if price is None:
            best, best_rate = (1, 0), 1.0 / self.expected_seconds(1, 0)
        else:
            best, best_rate = (1, 0), 1.0
            base = self.profile.cost(price.rows + 1)
        best_tree, best_tree_rate = None, -float("inf")
        for drafts in self.drafts_options:
            tokens, survive = 1.0, self.proposal_rate()
            for depth in range(1, depth_cap + 1):  # the sum of expected_tokens, incrementally
                survive *= acceptances[drafts][depth - 1]
                tokens += survive
                if price is None:
                    rate = tokens / self._seconds(terms, drafts, depth, tokens)
                else:
                    rows = price.rows + 1 + fill * drafts * depth
                    added = scale * (self.profile.cost(rows) - base) + depth * level_seconds
                    rate = tokens - price.rate * added
                if rate > best_tree_rate:
                    best_tree, best_tree_rate = (drafts, depth), rate
        if best_tree is not None and best_tree_rate > best_rate:
            best = best_tree
            # priced with an unmeasured drafter: its loss counts against the explore budget
            self._exploring = self.evidence.draft_level.count == 0
        elif (
            best_tree is not None
            and self._since_tree + 1 >= self._explore_every  # cheap test first: every step
            and self._since_tree + 1 >= self.explore_interval()
            and self.explore_fits()
        ):
            best = (1, 1)  # explore, cheaply: does the drafter's best guess start to match?
            self._exploring = True
        self._since_tree = 0 if best[1] > 0 else self._since_tree + 1
        clear = price is None and best == (1, 0) and best_tree_rate < HOLD_MARGIN * best_rate
        self._hold = HOLD_STEPS - 1 if clear else 0
        if clear:  # no explore falls due before this (the interval moves only with evidence)
            self._hold_interval = self.explore_interval() if self.explore_fits() else math.inf
        return best

    def explore_loss(self) -> float:
        """An explore's expected seconds beyond what its expected tokens cost one at a time:
        a one-step excursion to B = ℓ = 1 from one-token steps pays both changes of node count
        in full (into the tree and back out of it): s_c·t(2) + c + o + (s₀_c − s₀)·t(1) −
        tokens(1, 1)·(s₀·t(1) + o), at least 0 (``forward_scale``: s of steady forwards,
        s_c of forwards that change the node count)."""
        back = self._change_extra(False) * self.profile.cost(1)
        tree = self.forward_scale(True, True) * self.profile.cost(1 + self.evidence.fill.get(1.0))
        seconds = tree + self.level_seconds() + self.evidence.other.get(0.0) + back
        return max(seconds - self.expected_tokens(1, 1) * self.one_token_seconds(), 0.0)

    def one_token_seconds(self) -> float:
        """A one-token step's seconds where the last step was one too: s₀·t(1) + o."""
        steady, _, _, _, other = self._terms(False)
        return steady * self.profile.cost(1) + other

    def explore_fits(self) -> bool:
        """Whether one more explore keeps the request's explores within ``EXPLORE_BUDGET`` of
        its time: their measured loss so far plus this one's expected loss against its steps'
        seconds so far plus its tokens to go at the one-token rate."""
        total = self._elapsed + self._remaining * self.one_token_seconds()
        return self._explore_loss + self.explore_loss() <= EXPLORE_BUDGET * total

    def explore_interval(self) -> float:
        """One-token steps between explores: the back-off interval (doubled by a rejected
        explore, halved by an accepted one), and at least what keeps the explores' expected
        loss within ``EXPLORE_BUDGET`` of the decoding time — loss = seconds(1, 1) −
        tokens(1, 1)·seconds(1, 0), the time an explore takes beyond what its expected tokens
        cost one at a time — capped at ``EXPLORE_MAX``. A costly drafter (the heads' pass
        through a float32 LM head after a llama.cpp forward: ~22 ms once timed, two steps) explores
        rarely; a cheap one (n-gram lookup) at the back-off interval."""
        step = self.one_token_seconds()
        floor = self.explore_loss() / (EXPLORE_BUDGET * step) if step > 0 else 0.0
        return max(self._explore_every, min(floor, EXPLORE_MAX))

    def record(self, drafts: int, depth: int) -> tuple[int, int]:
        """Count the tree a step runs (after any node cap); B rounded down to a candidate so
        that its outcome is counted where ``acceptance`` reads it. Returns (B, ℓ)."""
        options = [b for b in self.drafts_options if b <= max(drafts, 1)]
        drafts = max(options) if depth > 0 else 1
        self.choices[(drafts, depth)] += 1
        return drafts, depth

    def observe(
        self,
        drafts: int,
        depth: int,
        proposed: int,
        accepted: int,
        stopped: bool,
        draft_seconds: float,
        other_seconds: float,
        forward_seconds: float | None = None,
        batched: bool = False,
    ) -> None:
        """One step's outcome.

        Args:
            drafts, depth: the tree the step planned (B, ℓ).
            proposed: nodes the drafter proposed (the tree's size less the root).
            accepted: levels the target accepted (0..ℓ).
            stopped: the step ended at EOS or the token budget (the level after the last
                accepted one was not rejected: it is not counted).
            draft_seconds: the step's drafting time; other_seconds: its time besides the
                target forward and the drafting.
            forward_seconds: its verification forward's time, when it ran alone: scales the
                profile (``forward_scale``).
            batched: the step shared its forward and drafting with other requests: its
                share of the drafting does not go into the process's memory (a lone request
                pays the whole level).
        """
        switched = self._switched(1 + proposed)
        measured = (
            forward_seconds
            if forward_seconds is not None
            else self.forward_scale(proposed > 0, switched) * self.profile.cost(1 + proposed)
        )
        seconds = draft_seconds + other_seconds + measured
        explored = depth > 0 and self._exploring
        one_token = self.one_token_seconds() if explored else 0.0  # before this step counts
        self._elapsed += seconds
        step = (drafts, depth, proposed, accepted, stopped, draft_seconds, other_seconds)
        self._last_nodes = 1 + proposed
        if depth > 0:
            self._hold = 0
        self.evidence.add(self.profile, *step, forward_seconds, self.max_depth, switched)
        if self.memory is not None:
            with self.memory.lock:
                self.memory.evidence.add(
                    self.profile, *step, forward_seconds, self.max_depth, switched, not batched
                )
        if explored:
            self._exploring = False
            back = self._change_extra(False) * self.profile.cost(1)  # the rebuild back out
            self._explore_loss += seconds + back - (accepted + 1) * one_token
            rejected = accepted == 0 and not stopped
            self._explore_every = (
                min(2 * self._explore_every, EXPLORE_MAX)
                if rejected
                else max(self._explore_every // 2, EXPLORE_EVERY)
            )
