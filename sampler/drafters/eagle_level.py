"""One eagle draft level in a few fused calls: the decoding fast path of
``sampler.drafters.eagle.EagleHead``.

``EagleHead.advance`` + ``EagleHead.logits`` run transformers' ``LlamaDecoderLayer`` and the
float32 LM-head rows of the draft vocabulary: on 2 CPU cores ~6 ms a level for 16,384 draft
rows, most of it reading ~55 MB of float32 weights (those rows alone 38 MB) and a layer's
Python. ``FastLevel`` computes the same function with

- the projections fused (q|k|v into one matrix, gate|up into one) and the target's final-norm
  gain folded into the head rows (rms(s)·g·Wᵀ = rms(s)·(W·diag g)ᵀ);
- on the CPU, each matrix as 8-bit integers with a scale per output row, multiplied by torch's
  dynamic-quantised linear (fbgemm / x86 engine: activations quantised per call): ~4× fewer
  bytes, so the head's rows stay in the caches;
- attention over the path written out (one query per context, its path's s keys); at a root
  (depth 0) the path is the node itself: the softmax over one key is exactly 1, so the level
  takes only the key and value projections and passes the values through.

The drafter's law moves a little, which can only move acceptance: drafts are MPFR samples of
whatever law the drafter gives, so the emitted tokens never depend on it (MPFR paper Thm. 5.1;
DESIGN §3, Decoder). On the shipped head, 20 held-out prompts in the real decoder
(``bench/results/drafters_fast_level.md``): AATPS 2.16 against 2.19 through the float layers
at B = L = 4, 1.446 against 1.440 at B = L = 1, a first level of one node 1.96 ms against 7.71
ms inside the decode loop. Where 8-bit kernels are unavailable (no x86/fbgemm engine, another
device) the same fused path runs in float32 (equal to the head's to ~1e-5).

Shapes: n contexts of a level, d hidden size, N draft vocabulary (V without one), H query heads,
H_kv key/value heads, D head dimension, s path length.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from sampler.drafters.heads import output_head
from sampler.targets.cpu_features import cpu_flags

Linear = Callable[[torch.Tensor], torch.Tensor]
PathCache = tuple[torch.Tensor, torch.Tensor]


class LayerShape(Protocol):
    @property
    def heads(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...


class EagleParts(Protocol):
    """What ``FastLevel`` reads of an ``sampler.drafters.eagle.EagleHead``."""

    @property
    def config(self) -> LayerShape: ...

    fuse: nn.Linear
    layer: LlamaDecoderLayer
    rotary: LlamaRotaryEmbedding
    draft_tokens: torch.Tensor | None


MAX_DEPTH = 64
"""Rotary positions tabulated (a draft tree deeper than this falls back to the head)."""


def int8_available(device: torch.device) -> bool:
    """Whether torch's dynamic-quantised linear (8-bit weights, fbgemm / x86 engine) runs on
    ``device``: the CPU with one of those engines."""
    return device.type == "cpu" and torch.backends.quantized.engine in ("x86", "fbgemm")


def exact_int8_sums(flags: frozenset[str] | None = None) -> bool:
    """Whether fbgemm's 8-bit kernels on this CPU sum unsigned × signed byte products exactly
    at full activation range: with AVX-512 VNNI (``vpdpbusd`` adds them in int32). Without it
    they pair products in int16 (``vpmaddubsw``), which saturates once two products of
    activations up to 255 exceed 32,767; ``flags``: the CPU's (default: this one's)."""
    return "avx512_vnni" in (cpu_flags() if flags is None else flags)


def _linear(weight: torch.Tensor, int8: bool) -> Linear:
    """x ↦ x·weightᵀ for (out, in) ``weight``: float32, or 8-bit weights with a scale per
    output row (symmetric, zero point 0) against activations quantised per call, over their
    full 8-bit range where the kernel's sums are exact (``exact_int8_sums``: finer
    activations), else over 7 bits (``reduce_range``: no int16 pair of products saturates).
    Either way only the drafter's law moves, never the emitted tokens; without VNNI the full
    range's saturated sums moved the level's law away from the float head's by more than
    ``tests/sampler/test_eagle_level.py`` allows, 7 bits well within it."""
    weight = weight.detach().float().contiguous()
    if not int8:
        w = weight
        return lambda x: torch.nn.functional.linear(x, w)
    scale = (weight.abs().amax(1) / 127.0).clamp_min(1e-12).double()
    with warnings.catch_warnings():  # torch marks quantised tensors for a future removal
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(
            weight, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8
        )
        packed = torch.ops.quantized.linear_prepack(q, None)
    dynamic = torch.ops.quantized.linear_dynamic.default
    reduce_range = not exact_int8_sums()
    return lambda x: dynamic(x, packed, reduce_range)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(…, D) → (−x₂, x₁) of its halves: the rotary embedding's pairing (Llama's)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def _rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


class FastLevel:
    """``EagleHead.advance`` and ``EagleHead.draft_logits`` fused (module docstring), for
    decoding only (no gradients).

    Args:
        head: the ``EagleHead`` (float weights; read once, not kept in sync afterwards).
        model: the target's transformers model (its final norm and LM head).
        int8: 8-bit weights (``int8_available``); False: the head's float weights, fused.
    """

    def __init__(self, head: EagleParts, model: PreTrainedModel, int8: bool) -> None:
        layer = head.layer
        attn, mlp = layer.self_attn, layer.mlp
        self.int8 = int8
        self.heads = int(head.config.heads)
        self.kv_heads = int(head.config.kv_heads)
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)
        self.layer_eps = float(layer.input_layernorm.variance_epsilon)
        self.device = head.fuse.weight.device
        self.fuse = _linear(head.fuse.weight, int8)
        self.qkv = _linear(
            torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), int8
        )
        self.kv = _linear(torch.cat([attn.k_proj.weight, attn.v_proj.weight]), int8)
        self.o = _linear(attn.o_proj.weight, int8)
        self.gate_up = _linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), int8)
        self.down = _linear(mlp.down_proj.weight, int8)
        self.intermediate = int(mlp.gate_proj.weight.shape[0])
        self.input_norm = layer.input_layernorm.weight.detach().float()
        self.post_norm = layer.post_attention_layernorm.weight.detach().float()
        final = model.model.norm
        self.final_eps = float(getattr(final, "variance_epsilon", getattr(final, "eps", 1e-5)))
        rows = output_head(model).weight.detach()
        if head.draft_tokens is not None:
            rows = rows.index_select(0, head.draft_tokens.to(rows.device))
        self.head = _linear(rows.float() * final.weight.detach().float()[None], int8)
        positions = torch.arange(MAX_DEPTH, device=self.device)[None]
        probe = torch.zeros(1, 1, device=self.device)
        cos, sin = head.rotary(probe, positions)  # (1, MAX_DEPTH, D)
        self.cos, self.sin = cos[0].float(), sin[0].float()
        # the rotary embedding at depth 0 is the identity (cos 1, sin 0) for Llama's tables;
        # a scaled table (an attention factor) is not, and takes the general path
        self.root_identity = bool((self.cos[0] == 1).all() and (self.sin[0] == 0).all())

    @torch.inference_mode()
    def advance(
        self, state: torch.Tensor, token_embedding: torch.Tensor, past: PathCache | None
    ) -> tuple[torch.Tensor, PathCache]:
        """``EagleHead.advance``: (n, d) float32 states and the path caches of s entries
        ((n, H_kv, s, D) keys and values, float32), from (n, d) parent states, (n, d) token
        embeddings and the parents' caches of s − 1 entries (None at the root).

        Raises:
            ValueError: a path deeper than ``MAX_DEPTH``."""
        n = state.shape[0]
        depth = 0 if past is None else past[0].shape[2]
        if depth >= MAX_DEPTH:
            raise ValueError(f"eagle fast path: depth {depth} >= {MAX_DEPTH}")
        x = self.fuse(
            torch.cat([_rms(state.float(), 1e-6), _rms(token_embedding.float(), 1e-6)], -1)
        )
        h = _rms(x, self.layer_eps) * self.input_norm
        hd, hq, hkv = self.head_dim, self.heads, self.kv_heads
        if past is None and self.root_identity:
            # a root's path is itself: the softmax over its one key is exactly 1, so each
            # query head reads its key/value head's value as it is, and no query is needed
            kv = self.kv(h)
            k = kv[:, : hkv * hd].reshape(n, hkv, 1, hd)
            v = kv[:, hkv * hd :].reshape(n, hkv, 1, hd)
            attended = v.expand(n, hkv, hq // hkv, hd)
        else:
            qkv = self.qkv(h)
            q = qkv[:, : hq * hd].view(n, hq, 1, hd)
            k = qkv[:, hq * hd : (hq + hkv) * hd].view(n, hkv, 1, hd)
            v = qkv[:, (hq + hkv) * hd :].reshape(n, hkv, 1, hd)
            cos, sin = self.cos[depth], self.sin[depth]  # (D,): every context at this depth
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if past is not None:
                k = torch.cat([past[0], k], 2)
                v = torch.cat([past[1], v], 2)
            # query head j reads key/value head j // (H / H_kv) (transformers' repeat_kv)
            grouped = q.view(n, hkv, hq // hkv, hd)
            scores = torch.matmul(grouped, k.transpose(2, 3)) * self.scaling  # (n, H_kv, G, s)
            attended = torch.matmul(scores.softmax(-1), v)  # (n, H_kv, H/H_kv, D)
        x = x + self.o(attended.reshape(n, hq * hd))
        gate_up = self.gate_up(_rms(x, self.layer_eps) * self.post_norm)
        gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate :]
        x = x + self.down(torch.nn.functional.silu(gate) * up)
        return x, (k, v)

    @torch.inference_mode()
    def draft_logits(self, state: torch.Tensor) -> torch.Tensor:
        """(n, N) float32 logits over the draft vocabulary (``EagleHead.draft_logits``) of (n, d)
        states: the target's final norm (its gain folded into the rows), then the rows."""
        return self.head(_rms(state.float(), self.final_eps))
