"""A static-layout target for Llama-architecture models: the accelerator backend (CUDA graphs)
that also runs, eagerly, on the CPU.

Drafter and batch invariance (Watermarkable Multi-Draft Speculative Sampling via Poisson Processes,
arXiv:2609.21858, Prop. 4.4 / Thm. 5.1: the output is
the autoregressive keyed sample whatever the drafts) need the target's logits at a context to
be the same bits whether that context is stepped alone, verified inside a draft tree, or
batched with other requests. On a GPU the kernels a library picks change with the shapes of a
call (one row alone and the same row inside 64 rows differed by 0.0625 in a logit on an
H200), so this target never lets a shape change:

- **one row layout.** Every forward runs in *groups* of exactly ``group_slots`` sequences ×
  ``rows`` new tokens each: G·R rows through every linear, norm and the LM head, whatever the
  number of real rows (padding rows are computed and thrown away). A sequence with more than R
  new tokens runs in passes of R (later passes read the earlier ones from the cache); more
  sequences than G run as more groups. Every linear is therefore one GEMM of one shape, and a
  row's bits depend only on that row (a GEMM does not reduce across rows).
- **attention with a fixed split, in float64.** Each sequence has a slot of a static KV
  cache (``capacity`` positions, preallocated; keys after RoPE and values stored in the work
  dtype, each rounded the same wherever it sits, and read back in float64). Attention
  reads the group's slots in blocks of ``ATTENTION_BLOCK`` positions, each block the same
  batched matmul shape, combined in block order with a running maximum (online softmax).
  Blocks past a row's last visible position contribute exact zeros (scale ``exp(0) = 1``,
  sum ``+ 0``), so the number of blocks a group needs — set by its longest sequence — does
  not change any row. What a shape cannot fix is where a key sits: a tree puts a path's
  tokens at other cache columns than one-token steps do, and a sum's rounding depends on the
  positions of its terms. In float64 that difference is ~1e-16 relative, and the result is
  rounded to the next linear's input dtype (bfloat16 or float32) before anything else reads
  it, so the bits that follow are the same unless a value lies within ~1e-16 of a rounding
  boundary (as ``sampler.invariant`` does on the CPU; measured, not proven: the tests compare
  bits). Attention is a small share of this model's FLOPs.
- **CUDA graphs.** On CUDA each group forward (one per block count) is captured once and
  replayed: the inputs are copied into static buffers, the logits of the real rows leave the
  device in one copy (bfloat16, widened on the host: exact).

The logits come back on the CPU, so processing, keyed clocks, the race and the tree walk run
on the host's compiled path (``sampler.processing``, ``sampler.race``), as for llama.cpp.
``weights=torch.float64`` runs the same code in float64 throughout: the reference against
transformers for the tests (logits within 1e-12).

Shapes: G group slots, R rows per slot, M = G·R rows per group forward, W attention window
(a multiple of ``ATTENTION_BLOCK``), P cached positions, q new tokens of one sequence,
d hidden size, h heads, g key/value heads, D head size, V vocabulary.
"""

from __future__ import annotations

import heapq
import math
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from sampler.static_cache import StaticCache
from sampler.target import Target

__all__ = ["ATTENTION_BLOCK", "StaticCache", "StaticLlama"]

ATTENTION_BLOCK = 128
"""KV positions per attention block: every block is one batched matmul of the same shape."""


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor  # (d,) work dtype
    qkv: torch.Tensor  # ((h + 2g)·D, d) weights dtype
    out: torch.Tensor  # (d, h·D)
    post_norm: torch.Tensor  # (d,)
    gate_up: torch.Tensor  # (2·I, d)
    down: torch.Tensor  # (d, I)


class StaticLlama(Target):
    """The target's forward in one static row layout (module docstring).

    Args:
        model: a transformers Llama-architecture causal LM (``model_type`` llama, default
            RoPE); its weights are copied to ``device`` (the model is left as it is, for the
            drafters).
        device: where the target runs (default: the model's device).
        weights: linear weights dtype: ``torch.bfloat16`` (default on CUDA; float32 residual
            stream and attention), ``torch.float32`` or ``torch.float64`` (default on the CPU;
            float64 throughout).
        group_slots: G, sequences per group forward.
        rows: R, new tokens per sequence per group forward.
        capacity: cached positions per sequence (a multiple of ``ATTENTION_BLOCK``; the
            default holds the service's longest prompt, 4,096 tokens, its longest answer, 512,
            and a draft tree).
        slots: sequences that can hold a cache at once (the service batches up to 32).
        graphs: capture CUDA graphs (default: on CUDA).
    Raises:
        ValueError: another architecture or RoPE type, a weights dtype not listed, sizes < 1,
            a capacity not a multiple of ``ATTENTION_BLOCK``, graphs off CUDA.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        device: torch.device | str | None = None,
        weights: torch.dtype | None = None,
        group_slots: int = 4,
        rows: int = 32,
        capacity: int = 4864,
        slots: int = 48,
        graphs: bool | None = None,
    ) -> None:
        config = model.config
        if getattr(config, "model_type", None) != "llama":
            raise ValueError(f"expected a llama model, got {getattr(config, 'model_type', None)}")
        rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"unsupported RoPE type {rope.get('rope_type')!r}")
        dev = torch.device(device) if device is not None else next(model.parameters()).device
        if weights is None:
            weights = torch.bfloat16 if dev.type == "cuda" else torch.float64
        if weights not in (torch.bfloat16, torch.float32, torch.float64):
            raise ValueError(f"expected weights bfloat16, float32 or float64, got {weights}")
        if min(group_slots, rows, slots) < 1:
            raise ValueError("group_slots, rows and slots must be >= 1")
        if capacity < ATTENTION_BLOCK or capacity % ATTENTION_BLOCK:
            raise ValueError(f"capacity must be a positive multiple of {ATTENTION_BLOCK}")
        graphs = dev.type == "cuda" if graphs is None else graphs
        if graphs and dev.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.model = model
        self.invariant = True
        self.runs_on = dev
        self.weights = weights
        self.work = torch.float64 if weights == torch.float64 else torch.float32
        self.attention = torch.float64  # module docstring: position-independent to ~1e-16
        self.group_slots, self.rows, self.capacity, self.slots = group_slots, rows, capacity, slots
        self.graphs = graphs
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.intermediate = int(config.intermediate_size)
        self.hidden_size = int(config.hidden_size)
        self.eps = float(config.rms_norm_eps)
        self.vocab_size = int(config.vocab_size)
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        # transformers' RoPE: inverse frequencies and angles in float32
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        self.inv_freq = (1.0 / theta**steps).to(dev)  # (D/2,) float32
        state = {k: v.detach() for k, v in model.state_dict().items()}

        def linear(*names: str) -> torch.Tensor:
            return torch.cat([state[n] for n in names]).to(dev, weights).contiguous()

        def vector(name: str) -> torch.Tensor:
            out: torch.Tensor = state[name].to(dev, self.work).contiguous()
            return out

        self.layers: list[_Layer] = []
        for i in range(int(config.num_hidden_layers)):
            p = f"model.layers.{i}."
            self.layers.append(
                _Layer(
                    input_norm=vector(p + "input_layernorm.weight"),
                    qkv=linear(*(p + f"self_attn.{x}_proj.weight" for x in "qkv")),
                    out=linear(p + "self_attn.o_proj.weight"),
                    post_norm=vector(p + "post_attention_layernorm.weight"),
                    gate_up=linear(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    down=linear(p + "mlp.down_proj.weight"),
                )
            )
        self.embedding = vector("model.embed_tokens.weight")  # (V, d)
        self.norm = vector("model.norm.weight")
        head = "lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight"
        self.head = linear(head)
        # the KV cache: a slot per sequence and one more for a group's empty places; R scratch
        # columns after the capacity take the padding rows' keys (never inside a window)
        shape = (len(self.layers), slots + 1, self.kv_heads, capacity + rows, self.head_dim)
        with torch.inference_mode():
            self.keys = torch.zeros(shape, dtype=self.work, device=dev)
            self.values = torch.zeros_like(self.keys)
        self.spare = slots  # the empty places' slot
        self._free = list(range(slots))
        # re-entrant: a cache the collector drops inside acquire_slot releases its slot there
        self._lock = threading.RLock()
        self.forward_lock = threading.Lock()  # one group forward at a time (static buffers)
        m = group_slots * rows
        with torch.inference_mode():
            self._ids = torch.zeros(m, dtype=torch.long, device=dev)
            self._positions = torch.zeros(m, dtype=torch.float32, device=dev)
            self._columns = torch.zeros(m, dtype=torch.long, device=dev)
            self._row_slots = torch.zeros(m, dtype=torch.long, device=dev)
            self._group = torch.zeros(group_slots, dtype=torch.long, device=dev)
            self._mask = torch.zeros((group_slots, rows, capacity), dtype=torch.bool, device=dev)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool: Any = None
        self.group_forwards = 0  # group forwards run so far (each one graph replay on CUDA)

    # ------------------------------------------------------------------ identity
    def backend(self) -> str:
        return ":".join(f"{k}={v}" for k, v in sorted(self.fingerprint().items()))

    def fingerprint(self) -> dict[str, str]:
        """What this target's bits depend on: the layout, dtypes, device and its name."""
        name = torch.cuda.get_device_name(self.runs_on) if self.runs_on.type == "cuda" else "cpu"
        return {
            "backend": "static",
            "weights": str(self.weights).removeprefix("torch."),
            "layout": f"G{self.group_slots}xR{self.rows}/block{ATTENTION_BLOCK}",
            "capacity": str(self.capacity),
            "device": f"{self.runs_on.type}:{name}",
            "graphs": str(self.graphs),
            "torch": torch.__version__,
        }

    # ------------------------------------------------------------------ slots
    def new_cache(self) -> StaticCache:
        """An empty KV cache for one sequence (a slot of the static cache).

        Raises:
            RuntimeError: every slot is in use.
        """
        return StaticCache(self)

    def acquire_slot(self) -> int:
        """A free slot of the static cache (``StaticCache`` takes one per sequence).

        Raises:
            RuntimeError: every slot is in use.
        """
        with self._lock:
            if not self._free:
                raise RuntimeError(f"all {self.slots} slots of the static target are in use")
            return heapq.heappop(self._free)

    def release_slot(self, slot: int) -> None:
        """Give ``slot`` back (a dropped ``StaticCache``)."""
        with self._lock:
            heapq.heappush(self._free, slot)

    # ------------------------------------------------------------------ math
    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """(M, K) work dtype -> (M, N) work dtype through the weights' dtype."""
        out: torch.Tensor = F.linear(x.to(self.weights), weight)
        return out.to(self.work)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Llama RMSNorm of (M, d) rows as transformers computes it: in float32 whatever the
        model's dtype (so float64 weights reproduce a float64 transformers model), the result
        back in the work dtype, then the weight."""
        wide = x.to(torch.float32)
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * wide.to(self.work)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding (rotate_half) of (M, heads, D) with (M, D/2) cos and sin."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None], sin[:, None]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    def _group_forward(self, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One group forward over the static input buffers with a window of ``blocks``
        attention blocks: (M, V) logits (bfloat16 with bfloat16 weights, else the work
        dtype) and (M, d) final hidden states (work dtype). Writes the rows' keys and values
        into their slots' columns."""
        g_slots, r, m = self.group_slots, self.rows, self.group_slots * self.rows
        h, g, dh = self.heads, self.kv_heads, self.head_dim
        per = h // g
        window = blocks * ATTENTION_BLOCK
        angles = self._positions[:, None] * self.inv_freq[None]  # (M, D/2) float32
        exact = self.attention
        cos, sin = angles.cos().to(exact), angles.sin().to(exact)
        mask = self._mask[:, :, :window]  # (G, R, W)
        zero = torch.zeros((), dtype=exact, device=self.runs_on)
        minus = torch.full((), -math.inf, dtype=exact, device=self.runs_on)
        bias = torch.where(mask, zero, minus)[:, None, None]  # (G, 1, 1, R, W)
        scale = 1.0 / math.sqrt(dh)
        x = self.embedding[self._ids]  # (M, d)
        for index, layer in enumerate(self.layers):
            qkv = self._linear(self._rms(x, layer.input_norm), layer.qkv).to(exact)
            query = self._rope(qkv[:, : h * dh].view(m, h, dh), cos, sin)
            key = self._rope(qkv[:, h * dh : (h + g) * dh].view(m, g, dh), cos, sin)
            value = qkv[:, (h + g) * dh :].view(m, g, dh)
            keys, values = self.keys[index], self.values[index]  # (slots + 1, g, C + R, D)
            keys[self._row_slots, :, self._columns] = key.to(self.work)
            values[self._row_slots, :, self._columns] = value.to(self.work)
            # (G, g, per, R, D): query head j reads key/value head j // per
            q = query.view(g_slots, r, g, per, dh).permute(0, 2, 3, 1, 4) * scale
            own_keys = keys[:, :, :window].index_select(0, self._group).to(exact)  # (G, g, W, D)
            own_values = values[:, :, :window].index_select(0, self._group).to(exact)
            best = torch.full((g_slots, g, per, r, 1), -math.inf, dtype=exact, device=self.runs_on)
            total = torch.zeros((g_slots, g, per, r, 1), dtype=exact, device=self.runs_on)
            acc = torch.zeros((g_slots, g, per, r, dh), dtype=exact, device=self.runs_on)
            for b in range(blocks):
                lo, hi = b * ATTENTION_BLOCK, (b + 1) * ATTENTION_BLOCK
                k_b = own_keys[:, :, None, lo:hi]  # (G, g, 1, B, D)
                v_b = own_values[:, :, None, lo:hi]
                scores = q @ k_b.transpose(-1, -2) + bias[..., lo:hi]  # (G, g, per, R, B)
                top = torch.maximum(best, scores.amax(-1, keepdim=True))
                shift = torch.where(torch.isinf(top), zero, top)
                carry = torch.exp(best - shift)
                weights = torch.exp(scores - shift)
                total = total * carry + weights.sum(-1, keepdim=True)
                acc = acc * carry + weights @ v_b
                best = top
            mixed = (acc / total).permute(0, 3, 1, 2, 4).reshape(m, h * dh).to(self.work)
            x = x + self._linear(mixed, layer.out)
            gate_up = self._linear(self._rms(x, layer.post_norm), layer.gate_up)
            gate, up = gate_up[:, : self.intermediate], gate_up[:, self.intermediate :]
            x = x + self._linear(F.silu(gate) * up, layer.down)
        hidden = self._rms(x, self.norm)  # (M, d)
        logits = F.linear(hidden.to(self.weights), self.head)  # (M, V)
        return logits, hidden

    def _run_group(self, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``_group_forward`` eagerly, or the replay of its CUDA graph (captured on first
        use of this block count): the (M, V) logits and (M, d) hidden states, in static
        buffers on CUDA (read before the next group forward)."""
        self.group_forwards += 1
        if not self.graphs:
            return self._group_forward(blocks)
        captured = self._graphs.get(blocks)
        if captured is None:
            captured = self._capture(blocks)
            self._graphs[blocks] = captured
        graph, logits, hidden = captured
        graph.replay()
        return logits, hidden

    def _capture(self, blocks: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        """Capture ``_group_forward(blocks)`` as a CUDA graph; the buffers are saved and set
        so that warm-up and capture write only the spare slot's scratch columns."""
        saved = [
            t.clone()
            for t in (self._ids, self._positions, self._columns, self._row_slots, self._group)
        ]
        saved_mask = self._mask.clone()
        self._idle_inputs()
        stream = torch.cuda.Stream(self.runs_on)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self.runs_on))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._group_forward(blocks)
        torch.cuda.current_stream(self.runs_on).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits, hidden = self._group_forward(blocks)
        self._pool = graph.pool()
        for buffer, value in zip(
            (self._ids, self._positions, self._columns, self._row_slots, self._group),
            saved,
            strict=True,
        ):
            buffer.copy_(value)
        self._mask.copy_(saved_mask)
        return graph, logits, hidden

    def _idle_inputs(self) -> None:
        """Every place of the group empty: the spare slot, scratch columns, position 0."""
        r = self.rows
        self._ids.zero_()
        self._positions.zero_()
        self._group.fill_(self.spare)
        self._row_slots.fill_(self.spare)
        self._columns.copy_(
            (self.capacity + torch.arange(r, device=self.runs_on)).repeat(self.group_slots)
        )
        self._mask.zero_()
        self._mask[:, :, 0] = True

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(
        self,
        caches: list[StaticCache],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
    ) -> list[torch.Tensor]:
        """One forward over S sequences' new tokens (a tree or chain each), every row on its
        own cache, in passes of R rows and groups of G sequences (module docstring).

        Args:
            caches: S caches of this target, distinct.
            tokens: per sequence, q_s token ids.
            depths: per sequence, q_s position offsets (position id = base + depth).
            visible: per sequence, (q_s, P_s + q_s) bool: which cached and new positions each
                new token attends to; a new token may not see a later pass's tokens.
            bases: per sequence, the position id of depth 0.
        Returns:
            S tensors of (q_s, V) logits on the CPU, float32 (float64 with float64 weights).
        Raises:
            ValueError: a cache of another target, a repeated cache, a ``visible`` of the
                wrong shape or seeing ahead of its pass, a token outside the vocabulary, or
                P_s + q_s over the capacity.
        """
        counts = [len(t) for t in tokens]
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("each sequence may appear once in a forward")
        for s, cache in enumerate(caches):
            if cache.target is not self:
                raise ValueError(f"row {s}: cache of another target")
            if visible[s].shape != (counts[s], cache.cached + counts[s]):
                raise ValueError(
                    f"row {s}: expected visible of shape ({counts[s]}, "
                    f"{cache.cached + counts[s]}), got {tuple(visible[s].shape)}"
                )
            if cache.cached + counts[s] > self.capacity:
                raise ValueError(
                    f"row {s}: {cache.cached + counts[s]} positions exceed the static "
                    f"target's capacity of {self.capacity}"
                )
            if any(not 0 <= t < self.vocab_size for t in tokens[s]):
                raise ValueError(f"row {s}: expected token ids in [0, {self.vocab_size})")
        starts = [c.cached for c in caches]  # P_s before this forward
        out_dtype = torch.float64 if self.work == torch.float64 else torch.float32
        logits = [torch.empty((q, self.vocab_size), dtype=out_dtype) for q in counts]
        hidden: list[list[torch.Tensor]] = [[] for _ in caches]
        passes = max(counts, default=0)
        with self.forward_lock:
            for first in range(0, passes, self.rows):
                members = [s for s in range(len(caches)) if counts[s] > first]
                for g0 in range(0, len(members), self.group_slots):
                    group = members[g0 : g0 + self.group_slots]
                    self._load_group(group, first, caches, starts, tokens, depths, visible, bases)
                    blocks = self._blocks_needed(group, first, starts, counts)
                    out, last = self._run_group(blocks)
                    self._collect(out, last, group, first, counts, logits, hidden, caches)
        for s, cache in enumerate(caches):
            cache.cached = starts[s] + counts[s]
            cache.forward_calls += 1
            if cache.keep_hidden and hidden[s]:
                cache.last_hidden = torch.cat(hidden[s])
        return logits

    def _blocks_needed(
        self, group: list[int], first: int, starts: list[int], counts: list[int]
    ) -> int:
        end = max(starts[s] + min(counts[s], first + self.rows) for s in group)
        return max(1, -(-end // ATTENTION_BLOCK))

    def _load_group(
        self,
        group: list[int],
        first: int,
        caches: list[StaticCache],
        starts: list[int],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
    ) -> None:
        """Fill the static input buffers with pass rows [first, first + R) of ``group``."""
        g_slots, r, cap = self.group_slots, self.rows, self.capacity
        ids = torch.zeros((g_slots, r), dtype=torch.long)
        positions = torch.zeros((g_slots, r), dtype=torch.float32)
        columns = (cap + torch.arange(r)).repeat(g_slots, 1)  # padding rows: scratch
        row_slots = torch.full((g_slots, r), self.spare, dtype=torch.long)
        slots = torch.full((g_slots,), self.spare, dtype=torch.long)
        mask = torch.zeros((g_slots, r, cap), dtype=torch.bool)
        mask[:, :, 0] = True  # padding rows see position 0 only (their output is dropped)
        for place, s in enumerate(group):
            n = min(len(tokens[s]) - first, r)
            p = starts[s]
            seen = visible[s][first : first + n]  # (n, P + q)
            if bool(seen[:, p + first + n :].any()):
                raise ValueError(
                    f"row {s}: a token attends to a later token of its forward; order the "
                    "tokens so that each sees only earlier ones"
                )
            slots[place] = caches[s].slot
            row_slots[place] = caches[s].slot
            ids[place, :n] = torch.tensor(tokens[s][first : first + n], dtype=torch.long)
            positions[place, :n] = torch.tensor(
                [bases[s] + d for d in depths[s][first : first + n]], dtype=torch.float32
            )
            columns[place, :n] = p + first + torch.arange(n)
            mask[place, :n] = False
            mask[place, :n, : p + first + n] = seen[:, : p + first + n]
        dev = self.runs_on
        self._ids.copy_(ids.view(-1).to(dev, non_blocking=True))
        self._positions.copy_(positions.view(-1).to(dev, non_blocking=True))
        self._columns.copy_(columns.view(-1).to(dev, non_blocking=True))
        self._row_slots.copy_(row_slots.view(-1).to(dev, non_blocking=True))
        self._group.copy_(slots.to(dev, non_blocking=True))
        self._mask.copy_(mask.to(dev, non_blocking=True))

    def _collect(
        self,
        out: torch.Tensor,
        last: torch.Tensor,
        group: list[int],
        first: int,
        counts: list[int],
        logits: list[torch.Tensor],
        hidden: list[list[torch.Tensor]],
        caches: list[StaticCache],
    ) -> None:
        """Copy the real rows' logits to the host (one copy) and keep hidden states."""
        r = self.rows
        index: list[int] = []
        spans: list[tuple[int, int, int]] = []
        for place, s in enumerate(group):
            n = min(counts[s] - first, r)
            spans.append((s, len(index), n))
            index.extend(range(place * r, place * r + n))
        where = torch.tensor(index, dtype=torch.long).to(self.runs_on, non_blocking=True)
        rows = out.index_select(0, where).to("cpu")  # the one device-to-host copy
        rows = rows.to(logits[0].dtype)
        kept = last.index_select(0, where) if any(caches[s].keep_hidden for s in group) else None
        for s, at, n in spans:
            logits[s][first : first + n] = rows[at : at + n]
            if kept is not None and caches[s].keep_hidden:
                hidden[s].append(kept[at : at + n])

    @torch.inference_mode()
    def keep(self, cache: StaticCache, prefix: int, slots: list[int]) -> None:
        """Keep a cache's positions [0, prefix) and then its positions ``slots`` (increasing,
        each >= prefix): a gather within the sequence's slot, on the device."""
        end = prefix + len(slots)
        if slots != list(range(prefix, end)):
            index = torch.tensor(slots, dtype=torch.long).to(self.runs_on)
            with self.forward_lock:
                moved = self.keys[:, cache.slot].index_select(2, index)
                self.keys[:, cache.slot, :, prefix:end] = moved
                moved = self.values[:, cache.slot].index_select(2, index)
                self.values[:, cache.slot, :, prefix:end] = moved
        cache.cached = end
