"""An autoregressive draft head on the target's features (EAGLE, Li et al. 2024 §3; DESIGN §3,
Drafters, and §7).

At a step whose committed prefix is x_{≤t} (root token x_t), the head reads the target's final
(normed) hidden state h_{t−1} at the token before the root — as the parallel heads of
``sampler.drafters.heads`` do — and drafts the tree level by level, each node from its parent's head
state and its own token:

    u(c)  = W_in [rms(s(parent)); rms(E(token(c)))]    (EAGLE's fusion layer; s(parent of the
                                                        root) = h_{t−1})
    s(c)  = Layer(u(c) | u along the path root..c)      (one Llama decoder layer attending over
                                                        the node's path, rotary position = depth)
    Q(· | c) = softmax(LM_head(norm(s(c))))             (the target's own final norm and head)

rms(v) = v / sqrt(mean(v²) + 1e-6). The target's embedding E, final norm and LM head are frozen
and never stored with the head. Each node keeps its state s(c) and its path's keys and values
(a (depth + 1)-entry KV cache), so level s of the tree is ONE head call over all its contexts:
the n nodes of depth s − 1 take their parents' states and KV caches, a rectangular batch of
paths of equal length (no mask). The head is trained as it drafts, on its own states (EAGLE-3's
"training-time test"; ``sampler.training.eagle_train``). W_in starts at [I, 0] and the layer's
output projections at zero, so an untrained head drafts the target's own law at t−1 (its norm's gain
applied twice) at every depth: a weak but sane drafter. Exactness never depends on the head:
drafts are MPFR samples of Q (DESIGN §3, Decoder).

Shapes: n contexts of a level, d hidden size, V target vocabulary, H_kv key/value heads, D head
dimension, s path length (the context's depth + 1).

Files: ``<dir>/eagle.safetensors`` (the trainable weights, float16 by default) and
``<dir>/eagle.json`` (``EagleConfig``); ``<dir>/provenance.json`` where the trainer wrote one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import DynamicCache, LlamaConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from sampler.drafters.base import HiddenRow
from sampler.drafters.eagle_level import MAX_DEPTH, FastLevel, int8_available
from sampler.drafters.heads import (
    find_trained,
    load_for_target,
    output_head,
    target_fingerprint,
)
from sampler.processing import Processing, Support, process
from sampler.targets.base import Target
from sampler.targets.transformers import as_target
from sampler.tree import DraftTree

FORMAT = "poissonmark-eagle/1"

SHIPPED_EAGLE = Path(__file__).resolve().parent / "eagle_data" / "smollm2-135m-instruct"
"""The eagle head trained for SmolLM2-135M-Instruct by ``scripts/train_eagle.sh`` (spec
``eagle``; its ``provenance.json`` says on what data, objective, steps and commit)."""

PathCache = tuple[torch.Tensor, torch.Tensor]
"""The keys and values of n paths of s entries: ((n, H_kv, s, D), (n, H_kv, s, D))."""


@dataclass(frozen=True)
class EagleConfig:
    """What an eagle head file was trained for, and its layer's shape.

    Attributes:
        hidden_size: d of the target's hidden state.
        vocab_size: V of the target.
        heads, kv_heads: attention heads and key/value heads of the head's layer.
        intermediate_size: the layer's MLP width.
        target: ``sampler.drafters.heads.target_fingerprint`` of the target.
        objective: the training objective's name (informational).
        draft_vocab: N > 0: the head drafts only N tokens (its ``draft_tokens``, stored with
            its weights; the LM head's rows for them), the others get probability 0; 0: the
            whole vocabulary.
    """

    hidden_size: int
    vocab_size: int
    heads: int
    kv_heads: int
    intermediate_size: int
    target: str
    objective: str = ""
    draft_vocab: int = 0
    format: str = FORMAT


def _rms(v: torch.Tensor) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)


def _layer_config(config: EagleConfig) -> LlamaConfig:
    layer = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
    )
    layer._attn_implementation = "sdpa"  # any dtype, float64 included
    return layer


class EagleHead(nn.Module):
    """The trainable part: the fusion W_in (d × 2d) and one Llama decoder layer
    (transformers' ``LlamaDecoderLayer``) with its rotary embedding (module docstring)."""

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.config = config
        layer_config = _layer_config(config)
        self.fuse = nn.Linear(2 * d, d, bias=False)
        self.layer = LlamaDecoderLayer(layer_config, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(layer_config)
        with torch.no_grad():
            for p in self.layer.parameters():
                if p.dim() == 2:  # the norms keep their unit gains
                    nn.init.normal_(p, std=0.02)
            self.fuse.weight.zero_()
            self.fuse.weight[:, :d] = torch.eye(d)
            self.layer.self_attn.o_proj.weight.zero_()
            self.layer.mlp.down_proj.weight.zero_()
        self.draft_tokens: torch.Tensor | None
        if config.draft_vocab:
            self.register_buffer("draft_tokens", torch.arange(config.draft_vocab))
        else:
            self.draft_tokens = None
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # (head weight, its rows)

    def advance(
        self, state: torch.Tensor, token_embedding: torch.Tensor, past: PathCache | None
    ) -> tuple[torch.Tensor, PathCache]:
        """One level: the states of n contexts from their parents' states and paths.

        Args:
            state: (n, d) the parents' head states (h_{t−1} for the root), any float dtype.
            token_embedding: (n, d) E(token) of each context's last token.
            past: the parents' path caches of s − 1 entries each, or None at the root.
        Returns:
            ((n, d) states s(c) in the head's dtype, the contexts' path caches of s entries).
        """
        dtype = self.fuse.weight.dtype
        x = self.fuse(torch.cat([_rms(state.to(dtype)), _rms(token_embedding.to(dtype))], -1))
        n = x.shape[0]
        depth = 0 if past is None else past[0].shape[2]
        positions = torch.full((n, 1), depth, dtype=torch.long, device=x.device)
        x = x[:, None]  # (n, 1, d)
        cache = DynamicCache() if past is None else DynamicCache(ddp_cache_data=[past])
        out = self.layer(
            x,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            position_embeddings=self.rotary(x, positions),
        )
        layer = cache.layers[0]
        assert isinstance(layer, DynamicLayer) and layer.keys is not None
        assert layer.values is not None
        return out[:, 0], (layer.keys, layer.values)

    def logits(self, target: Target | PreTrainedModel, state: torch.Tensor) -> torch.Tensor:
        """(n, V) drafter logits of (n, d) head states. Whole vocabulary: without gradients
        (decoding) through the target backend's own norm and head where it has one
        (``Target.project``), else through transformers' head in the model's dtype. With a
        draft vocabulary: ``draft_logits`` in its tokens' columns, and −inf (decoding) or the
        dtype's lowest value (training: finite, so divergences stay defined) elsewhere."""
        served = as_target(target)
        if self.draft_tokens is None:
            if not torch.is_grad_enabled():
                projected = served.project(state)
                if projected is not None:
                    return projected
            model = served.model
            head = output_head(model)
            out: torch.Tensor = head(model.model.norm(state.to(head.weight.dtype)))
            return out
        compact = self.draft_logits(target, state)
        fill = -torch.inf if not torch.is_grad_enabled() else torch.finfo(compact.dtype).min
        full = compact.new_full((compact.shape[0], self.config.vocab_size), fill)
        return full.index_copy(1, self.draft_tokens, compact)

    def draft_logits(self, target: Target | PreTrainedModel, state: torch.Tensor) -> torch.Tensor:
        """(n, N) logits over the draft vocabulary (``draft_tokens`` order; N = V without one):
        the target's final norm, then its LM head's rows for those tokens (transformers' head,
        the model's dtype)."""
        model = as_target(target).model
        head = output_head(model)
        normed = model.model.norm(state.to(head.weight.dtype))
        if self.draft_tokens is None:
            out: torch.Tensor = head(normed)
            return out
        if torch.is_grad_enabled():
            rows = head.weight.index_select(0, self.draft_tokens)
        else:  # decoding: the rows once per head weight
            if self._rows is None or self._rows[0] is not head.weight:
                self._rows = (head.weight, head.weight.index_select(0, self.draft_tokens))
            rows = self._rows[1]
        return torch.nn.functional.linear(normed, rows)

    def save(self, directory: Path, dtype: torch.dtype = torch.float16) -> None:
        """Write ``eagle.safetensors`` (weights in ``dtype``) and ``eagle.json``."""
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {
            k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
            for k, v in self.state_dict().items()
        }
        save_file(tensors, str(directory / "eagle.safetensors"), metadata={"format": FORMAT})
        (directory / "eagle.json").write_text(json.dumps(asdict(self.config), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path, target: PreTrainedModel) -> EagleHead:
        """Load a head for ``target`` (on its device and dtype).

        Raises:
            ValueError: missing files, another format, or a head trained for another target.
        """
        return load_for_target(cls, EagleConfig, directory, "eagle", FORMAT, target)


def new_eagle(
    target: PreTrainedModel, objective: str = "", draft_tokens: torch.Tensor | None = None
) -> EagleHead:
    """A fresh head for ``target`` (module docstring's start), shaped like one of its layers,
    on its device and dtype; ``draft_tokens`` (N,) int64 distinct token ids: its draft
    vocabulary (None: the whole vocabulary).

    The draft tokens are kept sorted (``EagleDrafter.support`` relies on it).

    Raises:
        ValueError: draft tokens that repeat, fall outside the vocabulary or are all of it
            (give None for the whole vocabulary).
    """
    if draft_tokens is not None:
        vocab = int(target.config.vocab_size)
        if torch.unique(draft_tokens).numel() != draft_tokens.numel() or not bool(
            ((draft_tokens >= 0) & (draft_tokens < vocab)).all()
        ):
            raise ValueError(f"draft_tokens must be distinct token ids in [0, {vocab})")
        if draft_tokens.numel() == vocab:
            raise ValueError(
                f"draft_tokens must be fewer than the {vocab} tokens of the vocabulary "
                "(None drafts over all of them)"
            )
        draft_tokens = draft_tokens.sort().values
    c = target.config
    config = EagleConfig(
        hidden_size=c.hidden_size,
        vocab_size=c.vocab_size,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        intermediate_size=c.intermediate_size,
        target=target_fingerprint(target),
        objective=objective,
        draft_vocab=0 if draft_tokens is None else int(draft_tokens.numel()),
    )
    param = next(target.parameters())
    head = EagleHead(config).to(param.device, param.dtype)
    if head.draft_tokens is not None and draft_tokens is not None:
        head.draft_tokens.copy_(draft_tokens)
    return head


class EagleDrafter:
    """``eagle:PATH`` — the decoder's drafter from an eagle head (``uses_target_hidden``).

    The decoder hands it the target's hidden state at the token before each step's root
    (``see_target_hidden``); ``propose`` at level s runs the head once over the n nodes of
    depth s − 1 and keeps their states and path caches for level s + 1. Without a hidden state
    (a one-token prompt) it proposes nothing: the tree stays empty. A float32 head drafts
    through ``sampler.drafters.eagle_level.FastLevel`` (8-bit weights on the CPU), other
    dtypes through the head itself.
    """

    uses_target_hidden = True

    def __init__(self, head: EagleHead, target: Target | PreTrainedModel, name: str) -> None:
        self.head = head
        self.target = as_target(target)
        self.vocab_size = self.target.vocab_size
        self.name = name
        self.calls = 0
        self._hidden: HiddenRow | None = None
        self._level: dict[int, int] = {}  # node of the last drafted level -> its row
        self._states: torch.Tensor | None = None  # (n, d) of the last drafted level
        self._paths: PathCache | None = None
        self._primed: tuple[int, torch.Tensor] | None = None  # (level, its logits)
        tokens = head.draft_tokens
        self._sorted = tokens is None or bool((tokens[1:] > tokens[:-1]).all())
        self.fast: FastLevel | None = None
        if head.fuse.weight.dtype == torch.float32:
            device = head.fuse.weight.device
            self.fast = FastLevel(head, self.target.model, int8_available(device))

    def start(self, prompt: list[int]) -> None:
        self._hidden = None
        self._forget()

    def _forget(self) -> None:
        self._level, self._states, self._paths, self._primed = {}, None, None, None

    def see_target_hidden(self, hidden: torch.Tensor, row: int | None = None) -> None:
        """(d,) the target's final (normed) hidden state at the token before the next root,
        or row ``row`` of (q, d) ones (``HiddenRow``: indexed when a level reads it)."""
        self._hidden = HiddenRow(hidden, row)
        self._forget()

    @torch.inference_mode()
    def propose(self, tree: DraftTree, level: int, committed: list[int]) -> torch.Tensor:
        """(n, V) logits of Q(·|c) for the n nodes of depth ``level - 1`` (tree order): the
        target model's dtype, or the backend's head's (``Target.project``), float32 through the
        fast level; all −inf without a hidden state. Levels must come in order 1, 2, … within
        a step."""
        return self._expand(self._level_logits(tree, level))

    @torch.inference_mode()
    def support(
        self, tree: DraftTree, level: int, committed: list[int], processing: Processing
    ) -> Support:
        """``process(propose(...), processing)`` without the (n, V) row: with a draft
        vocabulary the processing runs over its N columns and the slots map back to token ids.
        The same support: the columns outside it are −inf, which top-k, top-p and the softmax
        never keep, and the draft tokens are sorted, so ties break in the same order."""
        compact = self._level_logits(tree, level).cpu()
        tokens = self.head.draft_tokens
        if compact.shape[1] == self.vocab_size or tokens is None:
            return process(compact, processing)
        if not self._sorted:  # ties would break in another order: process the full row
            return process(self._expand(compact), processing)
        support = process(compact, processing)
        return Support(tokens=tokens.cpu()[support.tokens], logp=support.logp)

    def _level_logits(self, tree: DraftTree, level: int) -> torch.Tensor:
        """Level ``level``'s logits, (n, N) over the draft vocabulary through the fast level,
        else (n, V) (``propose``)."""
        self.calls += 1
        nodes = tree.levels[level - 1]
        if self._primed is not None and self._primed[0] == level:
            logits, self._primed = self._primed[1], None
            return logits
        if self._hidden is None or not nodes:
            return torch.full((len(nodes), self.vocab_size), -torch.inf, dtype=torch.float32)
        state, embedding, past = self._inputs(tree, level)
        self._states, self._paths = self.advance(state, embedding, past)
        self._level = {node: row for row, node in enumerate(nodes)}
        return self.level_logits(self._states)

    def advance(
        self, state: torch.Tensor, embedding: torch.Tensor, past: PathCache | None
    ) -> tuple[torch.Tensor, PathCache]:
        """``EagleHead.advance`` through the fast level where there is one (``FastLevel``;
        paths deeper than its rotary table go through the head)."""
        if self.fast is not None and (past is None or past[0].shape[2] < MAX_DEPTH):
            return self.fast.advance(state, embedding, past)
        return self.head.advance(state, embedding, past)

    def level_logits(self, states: torch.Tensor) -> torch.Tensor:
        """The logits of (n, d) states: through the fast level with a draft vocabulary its
        (n, N) float32 columns (``_expand`` widens them), else ``EagleHead.logits``' (n, V)."""
        if self.fast is None:
            return self.head.logits(self.target, states)
        return self.fast.draft_logits(states)

    def _expand(self, logits: torch.Tensor) -> torch.Tensor:
        """(n, V) from ``level_logits``: the draft vocabulary's columns in place, −inf
        elsewhere."""
        tokens = self.head.draft_tokens
        if logits.shape[1] == self.vocab_size or tokens is None:
            return logits
        full = logits.new_full((logits.shape[0], self.vocab_size), -torch.inf)
        return full.index_copy(1, tokens.to(logits.device), logits)

    def _inputs(
        self, tree: DraftTree, level: int
    ) -> tuple[torch.Tensor, torch.Tensor, PathCache | None]:
        """``EagleHead.advance``'s inputs for the nodes of depth ``level - 1``: their parents'
        (n, d) states, their tokens' (n, d) embeddings, their parents' path caches."""
        nodes = tree.levels[level - 1]
        device = self.head.fuse.weight.device
        tokens = torch.tensor([tree.nodes[i].token for i in nodes], device=device)
        embedding = self.target.model.get_input_embeddings()(tokens)
        if level == 1:
            assert self._hidden is not None
            return self._hidden.get()[None].to(device), embedding, None
        assert self._states is not None and self._paths is not None, "levels in order"
        rows = torch.tensor([self._level[tree.nodes[i].parent] for i in nodes], device=device)
        past = (self._paths[0].index_select(0, rows), self._paths[1].index_select(0, rows))
        return self._states.index_select(0, rows), embedding, past

    def finish_step(self, tree: DraftTree, visited: list[int], committed: list[int]) -> None:
        self._forget()


@torch.inference_mode()
def prime_eagle(drafters: list[EagleDrafter], trees: list[DraftTree], level: int) -> None:
    """Level ``level`` of several requests' trees in ONE head call: every drafter that can
    draft there (a hidden state, nodes at depth ``level - 1``, its previous level drafted)
    gets the laws and states its own ``propose`` would compute, which its next ``propose``
    at this level returns; drafters sharing one ``head`` are batched together (their paths
    all have ``level`` entries: a rectangular batch). ``sampler.batch`` calls it per level.
    With 8-bit weights (``FastLevel``) the rows of one call share their activations' scale, so
    a law may differ a little from the one drafted alone; the emitted tokens never depend on
    the drafter's law (MPFR paper Thm. 5.1).

    Args:
        drafters: R drafters, one per request.
        trees: their R trees, grown to depth ``level - 1``.
        level: s >= 1.
    """
    groups: dict[int, list[tuple[EagleDrafter, DraftTree]]] = {}
    for drafter, tree in zip(drafters, trees, strict=True):
        ready = level == 1 or drafter._states is not None
        if drafter._hidden is not None and tree.level(level - 1) and ready:
            groups.setdefault(id(drafter.head), []).append((drafter, tree))
    for members in groups.values():
        if len(members) == 1:
            continue  # its own propose computes the same rows
        inputs = [d._inputs(t, level) for d, t in members]
        state = torch.cat([i[0] for i in inputs])
        embedding = torch.cat([i[1] for i in inputs])
        past = None
        if level > 1:
            keys = torch.cat([i[2][0] for i in inputs if i[2] is not None])
            values = torch.cat([i[2][1] for i in inputs if i[2] is not None])
            past = (keys, values)
        head = members[0][0]
        states, (keys, values) = head.advance(state, embedding, past)
        logits = head.level_logits(states)
        start = 0
        for drafter, tree in members:
            nodes = tree.levels[level - 1]
            rows = slice(start, start + len(nodes))
            drafter._states, drafter._paths = states[rows], (keys[rows], values[rows])
            drafter._level = {node: row for row, node in enumerate(nodes)}
            drafter._primed = (level, logits[rows])
            start += len(nodes)


def eagle_drafter(
    path: str, target: Target | PreTrainedModel, data_dir: Path | None = None
) -> EagleDrafter:
    """Load ``eagle:PATH`` for ``target``; an empty ``path`` means the head trained for it in
    ``data_dir`` (``<data dir>/drafters/<fingerprint>/eagle``, written by ``poissonmark
    distill --drafter eagle``: ``sampler.drafters.heads.find_trained``), else the shipped
    head (``SHIPPED_EAGLE``).

    Raises:
        ValueError: a backend that gives no hidden states (``Target.gives_hidden``), or
            ``EagleHead.load``'s errors.
    """
    served = as_target(target)
    if not served.gives_hidden:
        raise ValueError(
            f"eagle drafting needs the target's hidden states; backend {served.backend()} "
            "gives none"
        )
    model = served.model
    directory = (
        Path(path).expanduser() if path else find_trained(data_dir, model, "eagle", SHIPPED_EAGLE)
    )
    head = EagleHead.load(directory, model)
    return EagleDrafter(head, served, f"eagle:{path}" if path else "eagle")
