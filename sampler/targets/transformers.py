"""A causal LM with its KV cache, run over token trees (docs/design.md §3, steps 2 and 4).

Tree verification: one forward over q new tokens with a 4D additive mask (0 where a token may
attend, the dtype's most negative value elsewhere) and position ids = cached length + depth.
After a step only the realised path is kept (index select along the sequence axis); the model is
never re-run over accepted tokens.

Shapes: q new tokens, P cached tokens, V vocabulary.
"""

from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import CacheLayerMixin

from sampler.targets.base import Target, TargetLM
from sampler.targets.masks import chain_visible


class CachedLM:
    """A model plus a ``DynamicCache`` over a committed prefix and speculative tree slots.

    Attributes:
        cached: P, the number of positions in the cache.
        forward_calls: model forward passes so far (prefill included).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.target = as_target(model)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = DynamicCache(config=model.config)
        self.cached = 0
        self.forward_calls = 0
        self.keep_hidden = False  # when set, ``last_hidden`` holds the final hidden states
        self.last_hidden: torch.Tensor | None = None  # (q, d) of the latest forward

    @torch.inference_mode()
    def forward(
        self, tokens: list[int], depths: list[int], visible: torch.Tensor, base: int
    ) -> torch.Tensor:
        """Run q new tokens over the cache.

        Args:
            tokens: q token ids.
            depths: q position offsets; the position id of token i is ``base + depths[i]``.
            visible: (q, P + q) bool, which cached and new positions each new token attends to.
            base: position id of depth 0.
        Returns:
            (q, V) logits in the model dtype.
        """
        q = len(tokens)
        if visible.shape != (q, self.cached + q):
            raise ValueError(
                f"expected visible of shape ({q}, {self.cached + q}), got {tuple(visible.shape)}"
            )
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        pos = torch.tensor([[base + d for d in depths]], dtype=torch.long, device=self.device)
        mask = torch.zeros((1, 1, q, self.cached + q), dtype=self.dtype, device=self.device)
        mask.masked_fill_(~visible.to(self.device)[None, None], torch.finfo(self.dtype).min)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=self.keep_hidden,
        )
        if self.keep_hidden:
            self.last_hidden = out.hidden_states[-1][0]
        self.cached += q
        self.forward_calls += 1
        logits: torch.Tensor = out.logits[0]
        return logits

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Causal forward of a token chain after the cache; returns (q, V) logits."""
        q = len(tokens)
        return self.forward(tokens, list(range(q)), chain_visible(self.cached, q), self.cached)

    def keep(self, prefix: int, slots: list[int]) -> None:
        """Keep the first ``prefix`` cached positions and then the cached positions ``slots``.

        Args:
            prefix: positions [0, prefix) are kept as they are.
            slots: absolute cache positions (>= prefix, increasing) appended after the prefix.
        """
        if slots == list(range(prefix, prefix + len(slots))):
            keep_len = prefix + len(slots)
            if keep_len == self.cached:
                return
            index = None
        else:
            index = torch.tensor(list(range(prefix)) + slots, dtype=torch.long, device=self.device)
            keep_len = prefix + len(slots)
        for layer in self.cache.layers:
            if not isinstance(layer, CacheLayerMixin) or not layer.is_initialized:
                continue
            keys, values = layer.keys, layer.values
            if keys is None or values is None:
                continue
            if index is None:
                layer.keys, layer.values = keys[:, :, :keep_len], values[:, :, :keep_len]
            else:
                layer.keys, layer.values = (
                    keys.index_select(2, index),
                    values.index_select(2, index),
                )
        self.cached = keep_len


class TransformersTarget(Target):
    """transformers' own forward as a ``Target`` (``CachedLM`` caches; several sequences in
    one call through right-padded batch caches, ``forward_many``). Tree/batch-invariant only
    in float64 (on float32 a timing-driven tree could flip a near-tie between runs)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.vocab_size = int(model.config.vocab_size)
        self.invariant = next(model.parameters()).dtype == torch.float64

    def backend(self) -> str:
        return f"hf:{next(self.model.parameters()).dtype}"

    def new_cache(self) -> CachedLM:
        return CachedLM(self.model)

    def forward(
        self,
        caches: list[CachedLM],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
    ) -> list[torch.Tensor]:
        if len(caches) == 1:
            return [caches[0].forward(tokens[0], depths[0], visible[0], bases[0])]
        return _forward_many_hf(caches, tokens, depths, visible, bases)


_transformers_targets: weakref.WeakKeyDictionary[PreTrainedModel, TransformersTarget] = (
    weakref.WeakKeyDictionary()
)


def as_target(target: Target | PreTrainedModel) -> Target:
    """``target`` itself, or for a bare transformers model its ``TransformersTarget`` (one
    per model, so a forward-cost profile is measured once)."""
    if isinstance(target, Target):
        return target
    if not isinstance(target, PreTrainedModel):
        raise TypeError(f"expected a Target or a transformers model, got {type(target).__name__}")
    found = _transformers_targets.get(target)
    if found is None:
        found = TransformersTarget(target)
        _transformers_targets[target] = found
    return found


def open_cache(target: Target | PreTrainedModel) -> TargetLM:
    """An empty KV cache on ``target``'s backend (``Target.new_cache``; a bare transformers
    model: transformers' own)."""
    return as_target(target).new_cache()


@torch.inference_mode()
def forward_many(
    lms: list[TargetLM],
    tokens: list[list[int]],
    depths: list[list[int]],
    visible: list[torch.Tensor],
    bases: list[int],
) -> list[torch.Tensor]:
    """``CachedLM.forward`` for R sequences of one target in ONE call of its backend
    (``Target.forward``; transformers: ``_forward_many_hf``).

    Args:
        lms: R >= 1 caches of the same target.
        tokens, depths, visible, bases: per row, as ``CachedLM.forward`` takes them.
    Returns:
        R tensors of (q_r, V) logits.
    Raises:
        ValueError: rows on different backends or models, or a row's ``visible`` of the
            wrong shape.
    """
    if len(lms) == 1:
        return [lms[0].forward(tokens[0], depths[0], visible[0], bases[0])]
    if len({type(lm) for lm in lms}) != 1:
        raise ValueError("forward_many: every row must run on the same backend")
    target = lms[0].target
    if any(lm.target is not target for lm in lms):
        raise ValueError("forward_many: every row must run the same model")
    return target.forward(lms, tokens, depths, visible, bases)


def _layers(lm: CachedLM) -> list[CacheLayerMixin]:
    return _layers_of(lm.cache)


def _forward_many_hf(
    lms: list[CachedLM],
    tokens: list[list[int]],
    depths: list[list[int]],
    visible: list[torch.Tensor],
    bases: list[int],
) -> list[torch.Tensor]:
    """transformers' forward over R sequences in one batched model call.

    Row r's cache (P_r positions) is copied into a right-padded (R, H, P_max, D) cache per
    layer, its q_r new tokens into a right-padded (R, q_max) batch; the 4D additive mask is
    row r's ``visible`` placed at its cached columns [0, P_r) and new columns
    [P_max, P_max + q_r) (padding is never visible; a padded query sees only itself), the
    position ids are row r's own. After the call each row's cache holds its P_r + q_r
    positions, exactly as after ``lms[r].forward(...)``."""
    first = lms[0]
    if any(lm.model is not first.model for lm in lms):
        raise ValueError("forward_many: every row must run the same model")
    rows, device, dtype = len(lms), first.device, first.dtype
    cached = [lm.cached for lm in lms]
    counts = [len(t) for t in tokens]
    for r in range(rows):
        if visible[r].shape != (counts[r], cached[r] + counts[r]):
            raise ValueError(
                f"row {r}: expected visible of shape ({counts[r]}, {cached[r] + counts[r]}), "
                f"got {tuple(visible[r].shape)}"
            )
    p_max, q_max = max(cached), max(counts)
    ids = torch.zeros((rows, q_max), dtype=torch.long)
    pos = torch.zeros((rows, q_max), dtype=torch.long)
    allowed = torch.zeros((rows, q_max, p_max + q_max), dtype=torch.bool)
    allowed[:, :, p_max:] = torch.eye(q_max, dtype=torch.bool)  # padded queries: themselves
    for r in range(rows):
        p, q = cached[r], counts[r]
        ids[r, :q] = torch.tensor(tokens[r], dtype=torch.long)
        pos[r, :q] = torch.tensor([bases[r] + d for d in depths[r]], dtype=torch.long)
        pos[r, q:] = bases[r]
        allowed[r, :q, :p] = visible[r][:, :p]
        allowed[r, :q, p_max : p_max + q] = visible[r][:, p:]
    mask = torch.zeros((rows, 1, q_max, p_max + q_max), dtype=dtype, device=device)
    mask.masked_fill_(~allowed.to(device)[:, None], torch.finfo(dtype).min)
    batch = DynamicCache(config=first.model.config)
    if p_max > 0:
        template = next(lm for lm in lms if lm.cached == p_max)
        for index, layer in enumerate(_layers(template)):
            assert layer.keys is not None and layer.values is not None
            shape = (rows, layer.keys.shape[1], p_max, layer.keys.shape[3])
            keys = layer.keys.new_zeros(shape)
            values = layer.values.new_zeros((*shape[:3], layer.values.shape[3]))
            for r, lm in enumerate(lms):
                if cached[r]:
                    own = _layers(lm)[index]
                    assert own.keys is not None and own.values is not None
                    keys[r, :, : cached[r]] = own.keys[0]
                    values[r, :, : cached[r]] = own.values[0]
            out_layer = _layers_of(batch)[index]
            out_layer.lazy_initialization(keys, values)
            out_layer.keys, out_layer.values = keys, values
    keep_hidden = any(lm.keep_hidden for lm in lms)
    out = first.model(
        input_ids=ids.to(device),
        attention_mask=mask,
        position_ids=pos.to(device),
        cache=batch,
        use_cache=True,
        output_hidden_states=keep_hidden,
    )
    for index, layer in enumerate(_layers_of(batch)):
        assert layer.keys is not None and layer.values is not None
        for r, lm in enumerate(lms):
            p, q = cached[r], counts[r]
            if p == p_max:
                keys, values = (
                    layer.keys[r : r + 1, :, : p + q],
                    layer.values[r : r + 1, :, : p + q],
                )
            else:
                columns = torch.cat([torch.arange(p), torch.arange(p_max, p_max + q)]).to(device)
                keys = layer.keys[r : r + 1].index_select(2, columns)
                values = layer.values[r : r + 1].index_select(2, columns)
            own = _layers(lm)[index]
            if not own.is_initialized:
                own.lazy_initialization(keys, values)
            own.keys, own.values = keys, values
    logits: list[torch.Tensor] = []
    for r, lm in enumerate(lms):
        if lm.keep_hidden:
            lm.last_hidden = out.hidden_states[-1][r, : counts[r]]
        lm.cached += counts[r]
        lm.forward_calls += 1
        logits.append(out.logits[r, : counts[r]])
    return logits


def _layers_of(cache: DynamicCache) -> list[CacheLayerMixin]:
    return [layer for layer in cache.layers if isinstance(layer, CacheLayerMixin)]
