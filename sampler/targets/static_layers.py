"""The static target's layer math: one group forward of a model with Llama layers over the
fixed row layout of ``sampler.targets.static`` (its module docstring says why every shape is
fixed and attention runs in float64).

``StaticWeights`` holds the model's weights as the forward reads them (the linears of a layer
fused: q|k|v and gate|up), ``GroupInputs`` the static input buffers a group forward reads in
place (CUDA graphs replay them), and ``group_forward`` is the forward itself: embedding, per
layer RMSNorm -> fused qkv -> RoPE -> the rows' keys and values into their cache slots ->
attention over the group's slots in blocks of ``ATTENTION_BLOCK`` positions (online softmax) ->
output projection -> RMSNorm -> SwiGLU MLP, then the final norm and the LM head.

Shapes: G group slots, R rows per slot, M = G·R rows, W attention window (``blocks`` ×
``ATTENTION_BLOCK``), C cache capacity (positions per slot, plus R scratch columns), S slots of
the cache (one more for a group's empty places), n layers, d hidden size, h heads, g key/value
heads, D head size, I MLP size, V vocabulary. Linear weights in the weights dtype (bfloat16,
float32 or float64); norms, embedding, residual stream and cached keys/values in the work
dtype (float32, or float64 with float64 weights); attention in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

ATTENTION_BLOCK = 128
"""KV positions per attention block: every block is one batched matmul of the same shape."""


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights as the group forward reads them."""

    input_norm: torch.Tensor  # (d,) work dtype
    qkv: torch.Tensor  # ((h + 2g)·D, d) weights dtype
    qkv_bias: torch.Tensor | None  # ((h + 2g)·D,) work dtype (Qwen2), else None
    out: torch.Tensor  # (d, h·D)
    post_norm: torch.Tensor  # (d,)
    gate_up: torch.Tensor  # (2·I, d)
    down: torch.Tensor  # (d, I)


@dataclass(frozen=True)
class StaticWeights:
    """A model's Llama layers' weights on the target's device (``load``).

    Attributes:
        layers: n decoder layers. embedding: (V, d) work dtype. norm: (d,) work dtype.
        head: (V, d) weights dtype (the LM head, or the tied embedding).
        inv_freq: (D/2,) float32 RoPE inverse frequencies (transformers' default RoPE).
        heads, kv_heads, head_dim, intermediate: h, g, D, I. eps: RMSNorm epsilon.
        weights: the linears' dtype. work: the residual stream's. attention: float64.
    """

    layers: tuple[LayerWeights, ...]
    embedding: torch.Tensor
    norm: torch.Tensor
    head: torch.Tensor
    inv_freq: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    weights: torch.dtype
    work: torch.dtype
    attention: torch.dtype = torch.float64

    @classmethod
    def load(
        cls, model: PreTrainedModel, device: torch.device, weights: torch.dtype, theta: float
    ) -> StaticWeights:
        """Copy ``model``'s weights to ``device``: linears in ``weights``, the rest in the work
        dtype (float64 with float64 weights, else float32); ``theta``: the RoPE base. The
        model is left as it is."""
        config = model.config
        work = torch.float64 if weights == torch.float64 else torch.float32
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        # transformers' RoPE: inverse frequencies and angles in float32
        steps = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        inv_freq = (1.0 / theta**steps).to(device)  # (D/2,) float32
        state = {k: v.detach() for k, v in model.state_dict().items()}

        def linear(*names: str) -> torch.Tensor:
            return torch.cat([state[n] for n in names]).to(device, weights).contiguous()

        def vector(name: str) -> torch.Tensor:
            out: torch.Tensor = state[name].to(device, work).contiguous()
            return out

        def qkv_bias(p: str) -> torch.Tensor | None:
            names = [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
            if not any(n in state for n in names):
                return None
            return torch.cat([state[n] for n in names]).to(device, work).contiguous()  # Qwen2

        layers = []
        for i in range(int(config.num_hidden_layers)):
            p = f"model.layers.{i}."
            layers.append(
                LayerWeights(
                    input_norm=vector(p + "input_layernorm.weight"),
                    qkv=linear(*(p + f"self_attn.{x}_proj.weight" for x in "qkv")),
                    qkv_bias=qkv_bias(p),
                    out=linear(p + "self_attn.o_proj.weight"),
                    post_norm=vector(p + "post_attention_layernorm.weight"),
                    gate_up=linear(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    down=linear(p + "mlp.down_proj.weight"),
                )
            )
        head = "lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight"
        return cls(
            layers=tuple(layers),
            embedding=vector("model.embed_tokens.weight"),
            norm=vector("model.norm.weight"),
            head=linear(head),
            inv_freq=inv_freq,
            heads=heads,
            kv_heads=int(config.num_key_value_heads),
            head_dim=head_dim,
            intermediate=int(config.intermediate_size),
            eps=float(config.rms_norm_eps),
            weights=weights,
            work=work,
        )


@dataclass(frozen=True)
class GroupInputs:
    """The static input buffers of a group forward, on the target's device; filled in place
    before each forward (a captured CUDA graph reads these very tensors).

    Attributes:
        ids: (M,) int64 token ids. positions: (M,) float32 position ids.
        columns: (M,) int64 the cache column each row's key and value go to.
        row_slots: (M,) int64 each row's cache slot. group: (G,) int64 each place's slot.
        mask: (G, R, C) bool, which cache columns each row attends to.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    columns: torch.Tensor
    row_slots: torch.Tensor
    group: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def zeros(
        cls, group_slots: int, rows: int, capacity: int, device: torch.device, pin: bool = False
    ) -> GroupInputs:
        """Zeroed buffers on ``device``; ``pin``: in page-locked host memory (``device`` the
        CPU), the staging side of asynchronous copies to a CUDA device."""
        m = group_slots * rows

        def zeros(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin)

        with torch.inference_mode():
            return cls(
                ids=zeros(m, dtype=torch.long),
                positions=zeros(m, dtype=torch.float32),
                columns=zeros(m, dtype=torch.long),
                row_slots=zeros(m, dtype=torch.long),
                group=zeros(group_slots, dtype=torch.long),
                mask=zeros(group_slots, rows, capacity, dtype=torch.bool),
            )

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """Every buffer, in field order."""
        return (self.ids, self.positions, self.columns, self.row_slots, self.group, self.mask)


def _linear(w: StaticWeights, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(M, K) work dtype -> (M, N) work dtype through the weights' dtype."""
    out: torch.Tensor = F.linear(x.to(w.weights), weight)
    return out.to(w.work)


def _rms(w: StaticWeights, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Llama RMSNorm of (M, d) rows as transformers computes it: in float32 whatever the
    model's dtype (so float64 weights reproduce a float64 transformers model), the result
    back in the work dtype, then the weight."""
    wide = x.to(torch.float32)
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + w.eps)
    return weight * wide.to(w.work)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate_half) of (M, heads, D) with (M, D/2) cos and sin."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None], sin[:, None]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def group_forward(
    w: StaticWeights,
    inputs: GroupInputs,
    keys: torch.Tensor,
    values: torch.Tensor,
    blocks: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One group forward over ``inputs`` with a window of ``blocks`` attention blocks.

    Args:
        w: the weights. inputs: the filled input buffers (G places × R rows).
        keys, values: (n, S + 1, g, C + R, D) work dtype, the static KV cache; the rows' keys
            (after RoPE) and values are written into their slots' columns.
        blocks: attention blocks of the window (W = blocks · ``ATTENTION_BLOCK``).
    Returns:
        (M, V) logits (bfloat16 with bfloat16 weights, else the work dtype) and (M, d) final
        hidden states (work dtype).
    """
    g_slots, r = inputs.mask.shape[0], inputs.mask.shape[1]
    m = g_slots * r
    h, g, dh = w.heads, w.kv_heads, w.head_dim
    per = h // g
    window = blocks * ATTENTION_BLOCK
    device = inputs.ids.device
    angles = inputs.positions[:, None] * w.inv_freq[None]  # (M, D/2) float32
    exact = w.attention
    cos, sin = angles.cos().to(exact), angles.sin().to(exact)
    mask = inputs.mask[:, :, :window]  # (G, R, W)
    zero = torch.zeros((), dtype=exact, device=device)
    minus = torch.full((), -math.inf, dtype=exact, device=device)
    bias = torch.where(mask, zero, minus)[:, None, None]  # (G, 1, 1, R, W)
    scale = 1.0 / math.sqrt(dh)
    x = w.embedding[inputs.ids]  # (M, d)
    for index, layer in enumerate(w.layers):
        qkv = _linear(w, _rms(w, x, layer.input_norm), layer.qkv)
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias  # elementwise: each row alone
        qkv = qkv.to(exact)
        query = _rope(qkv[:, : h * dh].view(m, h, dh), cos, sin)
        key = _rope(qkv[:, h * dh : (h + g) * dh].view(m, g, dh), cos, sin)
        value = qkv[:, (h + g) * dh :].view(m, g, dh)
        layer_keys, layer_values = keys[index], values[index]  # (S + 1, g, C + R, D)
        layer_keys[inputs.row_slots, :, inputs.columns] = key.to(w.work)
        layer_values[inputs.row_slots, :, inputs.columns] = value.to(w.work)
        # (G, g, per, R, D): query head j reads key/value head j // per
        q = query.view(g_slots, r, g, per, dh).permute(0, 2, 3, 1, 4) * scale
        best = torch.full((g_slots, g, per, r, 1), -math.inf, dtype=exact, device=device)
        total = torch.zeros((g_slots, g, per, r, 1), dtype=exact, device=device)
        acc = torch.zeros((g_slots, g, per, r, dh), dtype=exact, device=device)
        for b in range(blocks):
            lo, hi = b * ATTENTION_BLOCK, (b + 1) * ATTENTION_BLOCK
            # the group's slots, one block at a time in the exact dtype: (G, g, 1, B, D) each,
            # never the whole window at once (W/B times the memory)
            k_b = layer_keys[:, :, lo:hi].index_select(0, inputs.group).to(exact)[:, :, None]
            v_b = layer_values[:, :, lo:hi].index_select(0, inputs.group).to(exact)[:, :, None]
            scores = q @ k_b.transpose(-1, -2) + bias[..., lo:hi]  # (G, g, per, R, B)
            top = torch.maximum(best, scores.amax(-1, keepdim=True))
            shift = torch.where(torch.isinf(top), zero, top)
            carry = torch.exp(best - shift)
            weights = torch.exp(scores - shift)
            total = total * carry + weights.sum(-1, keepdim=True)
            acc = acc * carry + weights @ v_b
            best = top
        mixed = (acc / total).permute(0, 3, 1, 2, 4).reshape(m, h * dh).to(w.work)
        x = x + _linear(w, mixed, layer.out)
        gate_up = _linear(w, _rms(w, x, layer.post_norm), layer.gate_up)
        gate, up = gate_up[:, : w.intermediate], gate_up[:, w.intermediate :]
        x = x + _linear(w, F.silu(gate) * up, layer.down)
    hidden = _rms(w, x, w.norm)  # (M, d)
    logits = F.linear(hidden.to(w.weights), w.head)  # (M, V)
    return logits, hidden
