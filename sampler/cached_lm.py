"""A causal LM with its KV cache, run over token trees (DESIGN §3, steps 2 and 4).

Tree verification: one forward over q new tokens with a 4D additive mask (0 where a token may
attend, the dtype's most negative value elsewhere) and position ids = cached length + depth.
After a step only the realised path is kept (index select along the sequence axis); the model is
never re-run over accepted tokens.

Shapes: q new tokens, P cached tokens, V vocabulary.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import CacheLayerMixin


class CachedLM:
    """A model plus a ``DynamicCache`` over a committed prefix and speculative tree slots.

    Attributes:
        cached: P, the number of positions in the cache.
        forward_calls: model forward passes so far (prefill included).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
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
        visible = torch.ones((q, self.cached + q), dtype=torch.bool)
        visible[:, self.cached :] = torch.tril(torch.ones((q, q), dtype=torch.bool))
        return self.forward(tokens, list(range(q)), visible, self.cached)

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
