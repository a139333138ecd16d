"""Drafters: Q_k(·|c) for every context of one tree level, in one call (docs/design.md §3).

Specs: ``model:PATH`` (an autoregressive HF model sharing the tokenizer), ``self:N`` (the
target's first N layers + its norm and head), ``heads:PATH`` (parallel heads on the target's
hidden state, ``sampler.drafters.heads``, trained by ``poissonmark distill``; plain ``heads`` = the
shipped ones), ``eagle:PATH`` (an autoregressive draft head on the target's features,
``sampler.drafters.eagle``; plain ``eagle`` = the shipped one), ``ngram`` (prompt lookup over
prompt + output), ``fixed:TOKEN`` (always proposes one token; a test drafter for case C11).
A drafter's logits may put -inf everywhere (no proposal): the tree simply stops growing there.

Shapes: n contexts of a level, V target vocabulary.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from sampler.processing import Processing, Support, process
from sampler.targets.base import TargetLM
from sampler.targets.transformers import CachedLM
from sampler.tree import DraftTree


class Drafter(Protocol):
    """What the decoder needs from a drafter. A point-mass drafter may also have
    ``points(tree, level, committed) -> list[int | None]`` (one proposal or None per node):
    the decoder then takes its support without processing its logits (``draft_law``)."""

    name: str
    calls: int

    def start(self, prompt: list[int]) -> None:
        """Forget the previous request; ``prompt`` is the new committed prefix."""

    def propose(self, tree: DraftTree, level: int, committed: list[int]) -> torch.Tensor:
        """(n, V) logits of Q(·|c) for the n nodes of depth ``level - 1`` (in tree order)."""

    def finish_step(self, tree: DraftTree, visited: list[int], committed: list[int]) -> None:
        """The step emitted tokens through ``visited`` nodes; ``committed`` is the new prefix."""


def draft_law(
    drafter: Drafter, tree: DraftTree, level: int, committed: list[int], processing: Processing
) -> Support:
    """Q_k at the n nodes of depth ``level - 1``: the drafter's logits processed as the
    target's (``sampler.processing.process``). A drafter with ``support`` processes its own
    law (the eagle head over its draft vocabulary: N columns instead of V). A point-mass
    drafter (one with ``points``: n-gram, fixed token) gives its (n, 1) support directly, what
    processing would return
    without its cost (temperature, top-k and top-p leave a point mass as it is; the other slots
    of the processed support are -inf, which no race draws). Processing a (1, 49152) point
    mass took ~100 us warm (one-off timing), 25x the n-gram lookup itself."""
    support = getattr(drafter, "support", None)
    if support is not None:  # a drafter that processes its own law (a draft vocabulary)
        return support(tree, level, committed, processing)  # type: ignore[no-any-return]
    points = getattr(drafter, "points", None)
    if points is None:
        # processed on the host whatever the drafter's device: one copy of the level's rows
        # instead of a chain of small device kernels and syncs (the race's result is the same
        # on every device, tests/sampler/test_gpu.py)
        return process(drafter.propose(tree, level, committed).cpu(), processing)
    return point_support(points(tree, level, committed))


def point_support(points: list[int | None]) -> Support:
    """(n, 1) support of point masses; an empty row (logp -inf) for None."""
    tokens = [[p if p is not None else 0] for p in points]
    logp = [[0.0 if p is not None else -torch.inf] for p in points]
    return Support(
        tokens=torch.tensor(tokens, dtype=torch.int64).reshape(-1, 1),
        logp=torch.tensor(logp, dtype=torch.float64).reshape(-1, 1),
    )


def point_logits(points: list[int | None], vocab_size: int) -> torch.Tensor:
    """(n, V) float64 logits of point masses: 0 at the point, -inf elsewhere (all -inf for
    None)."""
    logits = torch.full((len(points), vocab_size), -torch.inf, dtype=torch.float64)
    for row, point in enumerate(points):
        if point is not None:
            logits[row, point] = 0.0
    return logits


def wants_target_hidden(drafter: Drafter | None) -> bool:
    """Whether ``drafter`` reads the target's hidden states
    (``sampler.drafters.heads.HeadsDrafter``, ``sampler.drafters.eagle.EagleDrafter``)."""
    return bool(getattr(drafter, "uses_target_hidden", False))


@dataclass(frozen=True)
class HiddenRow:
    """The target's final (normed) hidden state at the token before the next root: row ``row``
    of its latest forward's (q, d) ``states`` (``row`` None: ``states`` is that (d,) row),
    indexed only when a drafter reads it: a one-token step never does."""

    states: torch.Tensor
    row: int | None = None

    def get(self) -> torch.Tensor:
        """(d,) the hidden state."""
        return self.states if self.row is None else self.states[self.row]


def feed_target_hidden(drafter: Drafter | None, lm: TargetLM, row: int) -> None:
    """Hand row ``row`` of the target's latest final hidden states (the token before the next
    step's root) to a drafter that reads them; a no-op for every other drafter."""
    if wants_target_hidden(drafter) and lm.last_hidden is not None:
        drafter.see_target_hidden(lm.last_hidden, row)  # type: ignore[union-attr]


def fresh_drafter(drafter: Drafter) -> Drafter:
    """A new drafter of the same kind sharing ``drafter``'s weights (model, heads) but none of
    its per-request state (KV cache, hidden state, call count): drafters are stateful, so each
    request of a batch needs its own (``sampler.batch``). Cheap: no weights are loaded."""
    clone = copy.copy(drafter)
    clone.calls = 0
    clone.start([])  # every drafter's start() replaces (never mutates) its per-request state
    return clone


def _fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    v = logits.shape[-1]
    if v == vocab_size:
        return logits
    if v > vocab_size:
        return logits[:, :vocab_size]
    pad = torch.full(
        (logits.shape[0], vocab_size - v), -torch.inf, dtype=logits.dtype, device=logits.device
    )
    return torch.cat([logits, pad], dim=1)


class ModelDrafter:
    """An autoregressive LM drafting over the tree with its own KV cache (reused across steps).

    Level 1 feeds the committed tokens the cache lacks plus the root; level s feeds the nodes of
    depth s−1 with a tree mask. After a step only the realised path stays in the cache.
    """

    def __init__(self, model: PreTrainedModel, vocab_size: int, name: str) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.name = name
        self.calls = 0
        self.lm = CachedLM(model)
        self.done = 0  # committed tokens held in the cache
        self.slots: dict[int, int] = {}  # tree node -> cache position

    def start(self, prompt: list[int]) -> None:
        self.lm = CachedLM(self.model)
        self.done = 0
        self.slots = {}

    def propose(self, tree: DraftTree, level: int, committed: list[int]) -> torch.Tensor:
        self.calls += 1
        base = len(committed) - 1  # cache position (and position id) of the root
        if level == 1:
            pending = committed[self.done : base]
            logits = self.lm.extend([*pending, tree.nodes[0].token])[-1:]
            self.slots = {0: base}
            return _fit_vocab(logits, self.vocab_size)
        new = tree.levels[level - 1]
        anc = tree.ancestors(new[-1] + 1)
        q = len(new)
        visible = torch.zeros((q, self.lm.cached + q), dtype=torch.bool)
        visible[:, :base] = True
        for node, slot in self.slots.items():
            visible[:, slot] = anc[new, node]
        visible[:, self.lm.cached :] = torch.eye(q, dtype=torch.bool)
        for i, node in enumerate(new):
            self.slots[node] = self.lm.cached + i
        depths = [tree.nodes[i].depth for i in new]
        logits = self.lm.forward([tree.nodes[i].token for i in new], depths, visible, base)
        return _fit_vocab(logits, self.vocab_size)

    def finish_step(self, tree: DraftTree, visited: list[int], committed: list[int]) -> None:
        base = min(self.slots.values()) if self.slots else self.done
        kept = [self.slots[n] for n in visited if n in self.slots]
        self.lm.keep(base, kept)
        self.done = base + len(kept)
        self.slots = {}


def self_drafter(target: PreTrainedModel, layers: int) -> ModelDrafter:
    """Early-exit drafter: the target's first ``layers`` layers + its final norm and LM head.

    Shares the target's weights (no copy). Raises ValueError unless 1 <= layers < depth.
    """
    depth = target.config.num_hidden_layers
    if not 1 <= layers < depth:
        raise ValueError(f"self:N needs 1 <= N < {depth} (the target's depth), got {layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    with torch.device("meta"):
        shell = type(target)(config)
    shell.model.embed_tokens = target.model.embed_tokens
    shell.model.layers = nn.ModuleList(target.model.layers[:layers])
    shell.model.norm = target.model.norm
    shell.model.rotary_emb = target.model.rotary_emb
    shell.lm_head = target.lm_head
    shell.train(False)  # eval mode (``eval`` is untyped on transformers models)
    return ModelDrafter(shell, target.config.vocab_size, f"self:{layers}")


def model_drafter(path: str, target: PreTrainedModel) -> ModelDrafter:
    """An HF causal LM from a local directory, on the target's device and dtype."""
    param = next(target.parameters())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=param.dtype)
    model = model.to(param.device)  # type: ignore[arg-type]  # transformers' wrapped .to hides self
    model.eval()
    return ModelDrafter(model, target.config.vocab_size, f"model:{path}")


class NgramDrafter:
    """Prompt lookup: propose the token that followed the latest earlier occurrence of the
    context's last n tokens (n = max_ngram..1) in prompt + output + path. Point-mass proposals."""

    def __init__(self, vocab_size: int, max_ngram: int = 3) -> None:
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.name = "ngram"
        self.calls = 0

    def start(self, prompt: list[int]) -> None:
        return None

    def _lookup(self, seq: list[int]) -> int | None:
        """The token after the latest earlier occurrence of the longest tail of ``seq`` (up
        to ``max_ngram`` tokens) that occurs earlier; None when the last token never did.

        Walks the earlier occurrences of the last token, latest first (``list.index`` on the
        reversed prefix: C speed; one-off timing, 4 against 106 us for a 450-token random context
        scanned slice by slice), and extends each match backwards."""
        if len(seq) < 2:
            return None
        last, before = seq[-1], seq[-2::-1]  # before[i] = seq[len(seq) - 2 - i]
        best, longest, i = None, 0, 0
        while longest < self.max_ngram:
            try:
                i = before.index(last, i)
            except ValueError:
                break
            end = len(seq) - 2 - i  # seq[end] == last, and seq[end + 1] exists
            n = 1
            while n < self.max_ngram and n <= end and seq[end - n] == seq[-1 - n]:
                n += 1
            if n > longest:
                best, longest = seq[end + 1], n
            i += 1
        return best

    def points(self, tree: DraftTree, level: int, committed: list[int]) -> list[int | None]:
        """The proposal at each node of depth ``level - 1`` (tree order), None for none."""
        self.calls += 1
        proposals: list[int | None] = []
        for node in tree.levels[level - 1]:
            proposal = self._lookup(committed + tree.path_tokens(node))
            ok = proposal is not None and proposal < self.vocab_size
            proposals.append(proposal if ok else None)
        return proposals

    def propose(self, tree: DraftTree, level: int, committed: list[int]) -> torch.Tensor:
        return point_logits(self.points(tree, level, committed), self.vocab_size)

    def finish_step(self, tree: DraftTree, visited: list[int], committed: list[int]) -> None:
        return None


class FixedTokenDrafter:
    """Always proposes ``token`` (case C11: the output must still equal keyed AR decoding)."""

    def __init__(self, vocab_size: int, token: int) -> None:
        if not 0 <= token < vocab_size:
            raise ValueError(f"fixed:TOKEN needs 0 <= TOKEN < {vocab_size}, got {token}")
        self.vocab_size = vocab_size
        self.token = token
        self.name = f"fixed:{token}"
        self.calls = 0

    def start(self, prompt: list[int]) -> None:
        return None

    def points(self, tree: DraftTree, level: int, committed: list[int]) -> list[int | None]:
        self.calls += 1
        return [self.token] * len(tree.levels[level - 1])

    def propose(self, tree: DraftTree, level: int, committed: list[int]) -> torch.Tensor:
        return point_logits(self.points(tree, level, committed), self.vocab_size)

    def finish_step(self, tree: DraftTree, visited: list[int], committed: list[int]) -> None:
        return None
