"""A row-invariant CPU runner for targets with Llama layers (docs/design.md §3 Numerics).

Drafter invariance (MPFR paper Prop. 4.4 / Thm. 5.1) needs the target's logits at a context to
be the same whatever else shares the forward: one token, a 17-node draft tree, or eight
requests' trees batched. transformers' kernels give that only approximately in
float32 and not at all in bfloat16 (1 of 6 prompts identical). This runner computes
the same Llama forward with kernels whose row results do not depend on the batch:

- **linears**: bfloat16 weights packed once at load for oneDNN (``mkldnn._reorder_linear_weight``,
  AMX where the CPU has it), called on at most ``ROWS_PER_CALL`` rows at a time. On the Xeon
  measured here a row of such a call is bit-identical for every call size up to 32 for the
  real model's shapes (``probe_row_invariance`` checks the LM head at load and refuses the
  precision where it fails). Measured, not proven: a tiny model's 32x32 weight fails the probe
  (8 rows at offset 3), so the property depends on shapes and values (README, Known limits).
- **residual stream and norms** in float32 (elementwise; RMSNorm reduces each row alone);
- **attention** in float64 (RoPE, scores, softmax and the weighted sum), one fused call per
  layer over the whole batch (each sequence a slot of one padded KV pool): its reductions run
  over a length that changes with the batch; in float64 the difference is ~1e-16, far below the
  bfloat16 rounding that follows, so the next linear's input is the same bit for bit.

Logits come out of a bfloat16 LM head (as a transformers bfloat16 model gives them), returned
as float32. ``weights=torch.float64`` runs the same code with plain float64 linears: the
reference against transformers for the architecture tests.

Shapes: q new tokens of one sequence, Q new tokens of all sequences in a call, P cached
positions, d hidden size, h heads, g key/value heads, D head size, V vocabulary.
"""

from __future__ import annotations

import heapq
import math
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from sampler.targets.base import Target
from sampler.targets.families import check_llama_layers
from sampler.targets.masks import chain_visible

__all__ = [
    "InvariantCache",
    "InvariantLlama",
    "RowInvarianceError",
]

ROWS_PER_CALL = 32
"""Rows per packed-linear call: calls of 1..32 rows gave bit-identical rows on Intel Xeon
(AMX) here; 33 and more did not (``probe_row_invariance``)."""


class RowInvarianceError(RuntimeError):
    """This CPU's packed bfloat16 linear gives a row different results in calls of different
    sizes, so the bfloat16 runner cannot keep outputs identical; use float32."""


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) bfloat16 weight -> oneDNN's packed layout for calls of up to 16+ rows.

    Raises:
        RowInvarianceError: oneDNN has no bfloat16 linear on this CPU (it needs avx_ne_convert
            or avx512bw/vl/dq; an AVX2-only AMD EPYC has neither).
    """
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 16)
    except RuntimeError as exc:  # oneDNN refuses the bf16 path on this CPU
        raise RowInvarianceError(f"no packed bfloat16 linear on this CPU ({exc})") from exc
    return packed


def _packed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(n, K) bfloat16 @ packed (N, K) -> (n, N) bfloat16, in calls of <= ROWS_PER_CALL rows."""
    n = x.shape[0]
    if n <= ROWS_PER_CALL:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
        return out
    return torch.cat(
        [
            torch.ops.mkldnn._linear_pointwise(
                x[i : i + ROWS_PER_CALL], weight, None, "none", [], ""
            )
            for i in range(0, n, ROWS_PER_CALL)
        ]
    )


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor  # (d,) residual dtype
    qkv: torch.Tensor  # ((h + 2g)·D, d), packed or float64
    qkv_bias: torch.Tensor | None  # ((h + 2g)·D,) residual dtype (Qwen2), else None
    out: torch.Tensor  # (d, h·D)
    post_norm: torch.Tensor  # (d,) residual dtype
    gate_up: torch.Tensor  # (2·I, d)
    down: torch.Tensor  # (d, I)


class InvariantLlama(Target):
    """The target's forward with row-invariant numerics (module docstring).

    Args:
        model: a transformers causal LM with Llama layers on the CPU (Llama, Mistral without a
            sliding window, Qwen2: ``sampler.targets.families``), whose weights are copied (the
            model itself is left as it is, for the drafters).
        weights: ``torch.bfloat16`` (packed oneDNN linears, the fast path) or ``torch.float64``
            (plain linears: the reference for tests).
    Raises:
        ValueError: another family or layer shape (``check_llama_layers``: the message
            names the model and the precision to use instead), a device other than the CPU,
            an unsupported ``weights`` dtype.
        RowInvarianceError: bfloat16 on a CPU whose packed linear is not row-invariant.
    """

    def __init__(self, model: PreTrainedModel, weights: torch.dtype = torch.bfloat16) -> None:
        config = model.config
        check_llama_layers(model, "the bfloat16 runner", "use precision gguf or float32")
        if next(model.parameters()).device.type != "cpu":
            raise ValueError("the row-invariant runner is a CPU backend")
        if weights not in (torch.bfloat16, torch.float64):
            raise ValueError(f"expected weights bfloat16 or float64, got {weights}")
        rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
        self.model = model
        self.invariant = True
        self.weights = weights
        # the residual stream's dtype: float32 beside bfloat16 linears, float64 in the reference
        self.work = torch.float32 if weights == torch.bfloat16 else torch.float64
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.intermediate = int(config.intermediate_size)
        self.eps = float(config.rms_norm_eps)
        self.vocab_size = int(config.vocab_size)
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        # transformers' RoPE: inverse frequencies, angles, cos and sin in float32
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        self.inv_freq = 1.0 / theta**steps  # (D/2,) float32
        state = {k: v.detach() for k, v in model.state_dict().items()}

        def linear(*names: str) -> torch.Tensor:
            weight = torch.cat([state[n] for n in names]).to(weights)
            return _pack(weight) if weights == torch.bfloat16 else weight.contiguous()

        def qkv_bias(p: str) -> torch.Tensor | None:
            names = [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
            if not any(n in state for n in names):
                return None
            return torch.cat([state[n] for n in names]).to(self.work)  # Qwen2: all three

        self.layers: list[_Layer] = []
        for i in range(int(config.num_hidden_layers)):
            p = f"model.layers.{i}."
            self.layers.append(
                _Layer(
                    input_norm=state[p + "input_layernorm.weight"].to(self.work),
                    qkv=linear(*(p + f"self_attn.{x}_proj.weight" for x in "qkv")),
                    qkv_bias=qkv_bias(p),
                    out=linear(p + "self_attn.o_proj.weight"),
                    post_norm=state[p + "post_attention_layernorm.weight"].to(self.work),
                    gate_up=linear(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    down=linear(p + "mlp.down_proj.weight"),
                )
            )
        self.embedding = state["model.embed_tokens.weight"].to(self.work)  # (V, d)
        self.norm = state["model.norm.weight"].to(self.work)
        head = "lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight"
        self.head = linear(head)
        self.pool = _KVPool(len(self.layers), self.kv_heads, self.head_dim)
        if weights == torch.bfloat16:
            probe_row_invariance(self.head)

    def backend(self) -> str:
        return f"runner:{self.weights}"

    def probe_every_shape(self) -> None:
        """``probe_row_invariance`` on one weight of each distinct linear shape (the first
        layer's and the LM head): the check ``auto`` precision makes before choosing bfloat16
        (the LM head alone, checked at construction, let a tiny model's 32x32 o_proj through).

        Raises:
            RowInvarianceError: some shape's calls change some row (float64 weights: never).
        """
        if self.weights != torch.bfloat16:
            return
        first = self.layers[0]
        seen: set[tuple[int, ...]] = set()
        for weight in (first.qkv, first.out, first.gate_up, first.down, self.head):
            if tuple(weight.shape) not in seen:
                seen.add(tuple(weight.shape))
                probe_row_invariance(weight)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """(n, K) float32 or float64 -> (n, N) in the residual dtype, through the weights'
        precision."""
        if self.weights == torch.bfloat16:
            return _packed_linear(x.to(torch.bfloat16), weight).float()
        return F.linear(x.double(), weight)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Llama RMSNorm of (n, d) rows in the residual dtype (transformers' order)."""
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    @torch.inference_mode()
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's final norm and LM head on (n, d) features (a drafter's, e.g. parallel
        heads; MDraft paper §3): (n, V) logits, float32 (float64 with float64 weights),
        through the packed head like the target's own logits (a row's bits do not depend on
        n up to ``ROWS_PER_CALL`` rows per call)."""
        if features.ndim != 2 or features.shape[1] != self.norm.shape[0]:
            raise ValueError(
                f"expected features of shape (n, {self.norm.shape[0]}), got {tuple(features.shape)}"
            )
        return self._linear(self._rms(features.to(self.work), self.norm), self.head)

    def new_cache(self) -> InvariantCache:
        """An empty KV cache for one sequence."""
        return InvariantCache(self)

    @torch.inference_mode()
    def forward(
        self,
        caches: list[InvariantCache],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
    ) -> list[torch.Tensor]:
        """One forward over R sequences' new tokens (a tree each), every row on its own cache.

        Args:
            caches: R caches of this runner.
            tokens: per sequence, q_r token ids.
            depths: per sequence, q_r position offsets (position id = base + depth).
            visible: per sequence, (q_r, P_r + q_r) bool: which cached and new positions each
                new token attends to.
            bases: per sequence, the position id of depth 0.
        Returns:
            R tensors of (q_r, V) logits, float32 (float64 with float64 weights).
        Raises:
            ValueError: a cache of another runner or a ``visible`` of the wrong shape.
        """
        counts = [len(t) for t in tokens]
        for r, cache in enumerate(caches):
            if cache.runner is not self:
                raise ValueError(f"row {r}: cache of another runner")
            if visible[r].shape != (counts[r], cache.cached + counts[r]):
                raise ValueError(
                    f"row {r}: expected visible of shape ({counts[r]}, "
                    f"{cache.cached + counts[r]}), got {tuple(visible[r].shape)}"
                )
        pool = self.pool
        pool.reserve(max(c.cached + q for c, q in zip(caches, counts, strict=True)))
        ids = torch.tensor([t for row in tokens for t in row], dtype=torch.long)
        positions = torch.tensor(
            [b + d for row, b in zip(depths, bases, strict=True) for d in row],
            dtype=torch.float32,
        )
        angles = positions[:, None] * self.inv_freq[None]  # (Q, D/2) float32
        cos, sin = angles.cos().double(), angles.sin().double()
        starts = [0]
        for q in counts:
            starts.append(starts[-1] + q)
        # the batch's slots [first, first + S) of the pool; rows scattered into (S, q_max)
        first = min(c.slot for c in caches)
        span = max(c.slot for c in caches) + 1 - first
        q_max = max(counts)
        kv_len = max(c.cached + q for c, q in zip(caches, counts, strict=True))
        row_slot = torch.tensor(
            [c.slot for c, q in zip(caches, counts, strict=True) for _ in range(q)]
        )
        row_index = torch.tensor([i for q in counts for i in range(q)])
        row_position = torch.tensor(
            [c.cached + i for c, q in zip(caches, counts, strict=True) for i in range(q)]
        )
        bias = _attention_bias(caches, counts, visible, first, span, q_max, kv_len)
        x = self.embedding[ids]  # (Q, d) residual dtype
        h, g, dh = self.heads, self.kv_heads, self.head_dim
        for index, layer in enumerate(self.layers):
            qkv = self._linear(self._rms(x, layer.input_norm), layer.qkv)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias  # elementwise: each row alone
            qkv = qkv.double()
            query = _rope(qkv[:, : h * dh].view(-1, h, dh), cos, sin)  # (Q, h, D)
            keys, values = pool.keys[index], pool.values[index]  # (slots, g, capacity, D)
            keys[row_slot, :, row_position] = _rope(
                qkv[:, h * dh : (h + g) * dh].view(-1, g, dh), cos, sin
            )
            values[row_slot, :, row_position] = qkv[:, (h + g) * dh :].view(-1, g, dh)
            padded = query.new_zeros((span, q_max, h, dh))
            padded[row_slot - first, row_index] = query
            mixed = F.scaled_dot_product_attention(
                padded.transpose(1, 2),
                keys[first : first + span, :, :kv_len],
                values[first : first + span, :, :kv_len],
                attn_mask=bias,
                enable_gqa=True,
            )  # (S, h, q_max, D)
            mixed = mixed.transpose(1, 2)[row_slot - first, row_index].reshape(-1, h * dh)
            x = x + self._linear(mixed, layer.out)
            gate_up = self._linear(self._rms(x, layer.post_norm), layer.gate_up)
            gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate :]
            x = x + self._linear(F.silu(gate) * up, layer.down)
        hidden = self._rms(x, self.norm)  # (Q, d) residual dtype
        logits = self._linear(hidden, self.head)  # (Q, V)
        out: list[torch.Tensor] = []
        for r, cache in enumerate(caches):
            lo, hi = starts[r], starts[r + 1]
            cache.cached += counts[r]
            cache.forward_calls += 1
            if cache.keep_hidden:
                cache.last_hidden = hidden[lo:hi]
            out.append(logits[lo:hi])
        return out


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (transformers' rotate_half convention) of (n, heads, D) float64 with
    (n, D/2) angles' cos and sin."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None], sin[:, None]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _attention_bias(
    caches: list[InvariantCache],
    counts: list[int],
    visible: list[torch.Tensor],
    first: int,
    span: int,
    q_max: int,
    kv_len: int,
) -> torch.Tensor:
    """The additive float64 mask of one batched attention call: (S, 1, q_max, kv_len), row
    r's ``visible`` at its slot's top left (0 where it attends, −inf elsewhere); padded queries
    and idle slots see position 0 only (their outputs are never read)."""
    bias = torch.full((span, 1, q_max, kv_len), -math.inf, dtype=torch.float64)
    bias[:, :, :, 0] = 0.0
    for cache, q, seen in zip(caches, counts, visible, strict=True):
        own = bias[cache.slot - first, 0]
        own[:q] = -math.inf
        own[:q, : cache.cached + q].masked_fill_(seen, 0.0)
    return bias


class _KVPool:
    """Keys (after RoPE) and values of every live sequence of one runner, float64,
    (layers, slots, g, capacity, D): a slot per sequence, so that one attention call per layer
    covers a whole batch. Slots and capacity grow by doubling; a cache frees its slot when it
    is dropped."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int) -> None:
        self._shape = (layers, kv_heads, head_dim)
        self._lock = threading.Lock()
        self._free: list[int] = [0]
        with torch.inference_mode():
            self.keys = torch.zeros((layers, 1, kv_heads, 64, head_dim), dtype=torch.float64)
            self.values = torch.zeros_like(self.keys)

    def acquire(self) -> int:
        with self._lock:
            if not self._free:
                slots = self.keys.shape[1]
                self._grow(slots * 2, self.keys.shape[3])
                self._free = list(range(slots, slots * 2))
            return heapq.heappop(self._free)

    def release(self, slot: int) -> None:
        with self._lock:
            heapq.heappush(self._free, slot)

    def reserve(self, length: int) -> None:
        """Make room for ``length`` positions in every slot."""
        capacity = self.keys.shape[3]
        if length <= capacity:
            return
        while capacity < length:
            capacity *= 2
        with self._lock:
            self._grow(self.keys.shape[1], capacity)

    def _grow(self, slots: int, capacity: int) -> None:
        layers, g, dh = self._shape
        with torch.inference_mode():
            keys = torch.zeros((layers, slots, g, capacity, dh), dtype=torch.float64)
            values = torch.zeros_like(keys)
            old_slots, old_capacity = self.keys.shape[1], self.keys.shape[3]
            keys[:, :old_slots, :, :old_capacity] = self.keys
            values[:, :old_slots, :, :old_capacity] = self.values
        self.keys, self.values = keys, values


class InvariantCache:
    """One sequence's KV cache on an ``InvariantLlama`` (``CachedLM``'s interface).

    Its keys and values live in a slot of the runner's pool (``_KVPool``), freed when the
    cache is dropped.

    Attributes:
        cached: P, the number of positions in the cache.
        forward_calls: forwards that included this sequence (prefill included).
        keep_hidden: when set, ``last_hidden`` holds the final (normed) hidden states.
        last_hidden: (q, d) residual dtype, of the latest forward.
    """

    def __init__(self, runner: InvariantLlama) -> None:
        self.runner = runner
        self.target = runner
        self.cached = 0
        self.forward_calls = 0
        self.keep_hidden = False
        self.last_hidden: torch.Tensor | None = None
        self.slot = runner.pool.acquire()

    def __del__(self) -> None:
        slot = getattr(self, "slot", None)
        if slot is not None:
            self.runner.pool.release(slot)

    def forward(
        self, tokens: list[int], depths: list[int], visible: torch.Tensor, base: int
    ) -> torch.Tensor:
        """``CachedLM.forward``: (q, V) logits of q new tokens over the cache (float32;
        float64 with float64 weights)."""
        return self.runner.forward([self], [tokens], [depths], [visible], [base])[0]

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Causal forward of a token chain after the cache; returns (q, V) logits."""
        q = len(tokens)
        return self.forward(tokens, list(range(q)), chain_visible(self.cached, q), self.cached)

    @torch.inference_mode()
    def keep(self, prefix: int, slots: list[int]) -> None:
        """Keep positions [0, prefix) and then the cached positions ``slots`` (increasing)."""
        if slots != list(range(prefix, prefix + len(slots))):
            index = torch.tensor(slots, dtype=torch.long)
            end = prefix + len(slots)
            pool = self.runner.pool
            pool.keys[:, self.slot, :, prefix:end] = pool.keys[:, self.slot, :, index]
            pool.values[:, self.slot, :, prefix:end] = pool.values[:, self.slot, :, index]
        self.cached = prefix + len(slots)


def probe_row_invariance(weight: torch.Tensor, rows: int = ROWS_PER_CALL) -> None:
    """Check that a packed bfloat16 linear gives every row the same bits in calls of 1 to
    ``rows`` rows, at any offset (fixed inputs: the check is deterministic).

    Args:
        weight: a packed (N, K) bfloat16 weight (``_pack``).
    Raises:
        RowInvarianceError: some call size changes some row.
    """
    k = int(weight.shape[1])
    generator = torch.Generator().manual_seed(0)  # probe data only, nothing keyed
    x = torch.randn((rows + 3, k), generator=generator).to(torch.bfloat16)
    alone = torch.cat([_packed_linear(x[i : i + 1], weight) for i in range(rows + 3)])
    for size in range(2, rows + 1):
        for offset in (0, 3):
            if not torch.equal(
                _packed_linear(x[offset : offset + size], weight), alone[offset : offset + size]
            ):
                raise RowInvarianceError(
                    f"packed bfloat16 linear is not row-invariant here (call of {size} rows at "
                    f"offset {offset}); use precision float32"
                )
