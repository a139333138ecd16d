"""A static-layout target for models with Llama layers: the accelerator backend (CUDA graphs)
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
  boundary (as ``sampler.targets.cpu_bf16`` does on the CPU; measured, not proven: the tests compare
  bits). Attention is a small share of this model's FLOPs.
- **block counts in powers of two.** A group's window is its block count rounded up to a
  power of two (at most the capacity's blocks): the extra blocks add exact zeros as above, so
  the bits are those of the exact count, and a 4,096-token prompt needs 6 window shapes
  (1, 2, 4, 8, 16, 32 blocks) instead of 32.
- **CUDA graphs.** On CUDA each group forward (one per window) is captured once, all of them
  by ``capture_windows`` (``bench.speed_gpu`` calls it before its clocks start; else each on
  first use), on one side stream in thread-local capture mode, and replayed: the inputs are
  built in page-locked host buffers and copied into the static ones (of the mask only the
  window the group reads), and the real rows' logits of every group of a forward leave the
  device in one copy (bfloat16, widened on the host: exact).

The logits come back on the CPU, so processing, keyed clocks, the race and the tree walk run
on the host's compiled path (``sampler.processing``, ``sampler.race``), as for llama.cpp.
``weights=torch.float64`` runs the same code in float64 throughout: the reference against
transformers for the tests (logits within 1e-12).

The layer math of a group forward is ``sampler.targets.static_layers``; this module owns the target:
the slots of the static KV cache, the scheduling of a forward into groups and passes, the
CUDA graphs and the copies in and out.

Shapes: G group slots, R rows per slot, M = G·R rows per group forward, W attention window
(a multiple of ``ATTENTION_BLOCK``), P cached positions, q new tokens of one sequence,
d hidden size, h heads, g key/value heads, D head size, V vocabulary; logits out (q, V)
float32 (float64 with float64 weights) on the CPU, visibility masks (q, P + q) bool.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Any

import torch
from transformers import PreTrainedModel

from sampler.targets.families import check_llama_layers
from sampler.targets.masks import chain_visible
from sampler.targets.static_kv import SlotTarget, StaticCache
from sampler.targets.static_layers import ATTENTION_BLOCK, GroupInputs, StaticWeights, group_forward

__all__ = ["ATTENTION_BLOCK", "StaticCache", "StaticLlama"]


class StaticLlama(SlotTarget):
    """The target's forward in one static row layout (module docstring).

    Args:
        model: a transformers causal LM with Llama layers (Llama, Mistral without a sliding
            window, Qwen2: ``sampler.targets.families``); its weights are copied to ``device``
            (the model is left as it is, for the drafters).
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
        buckets: round block counts up to powers of two (module docstring; off: the exact
            count, the same bits with more window shapes).
    Raises:
        ValueError: another family or layer shape (``check_llama_layers``: the message names
            the model and the backend to use instead), a weights dtype not listed, sizes < 1,
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
        buckets: bool = True,
    ) -> None:
        config = model.config
        check_llama_layers(
            model, "the static target", "transformers' own forward serves it (precision float32)"
        )
        rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
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
        self.group_slots, self.rows, self.capacity, self.slots = group_slots, rows, capacity, slots
        self.graphs = graphs
        self.buckets = buckets
        self.hidden_size = int(config.hidden_size)
        self.vocab_size = int(config.vocab_size)
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        self.model_weights = StaticWeights.load(model, dev, weights, theta)
        # the KV cache: a slot per sequence and one more for a group's empty places; R scratch
        # columns after the capacity take the padding rows' keys (never inside a window)
        kv = self.model_weights
        shape = (len(kv.layers), slots + 1, kv.kv_heads, capacity + rows, kv.head_dim)
        with torch.inference_mode():
            self.keys = torch.zeros(shape, dtype=self.work, device=dev)
            self.values = torch.zeros_like(self.keys)
        self.spare = slots  # the empty places' slot
        self._free = list(range(slots))
        # re-entrant: a cache the collector drops inside acquire_slot releases its slot there
        self._lock = threading.RLock()
        self.forward_lock = threading.Lock()  # one group forward at a time (static buffers)
        self.inputs = GroupInputs.zeros(group_slots, rows, capacity, dev)
        # the host side of the inputs, filled in place each group and copied in one
        # asynchronous copy per buffer (page-locked on CUDA); the mask's window only
        self.staging = GroupInputs.zeros(
            group_slots, rows, capacity, torch.device("cpu"), pin=dev.type == "cuda"
        )
        self._padding_columns = (capacity + torch.arange(rows)).repeat(group_slots)
        self._staged: Any = None  # CUDA: an event after the last copies out of ``staging``
        self.host_copies = 0  # device-to-host copies of logits so far: one per forward
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool: Any = None
        self._capture_stream: Any = None  # one side stream for every capture (CUDA only)
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

    def _group_forward(self, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``group_forward`` over this target's weights, input buffers and KV cache."""
        return group_forward(self.model_weights, self.inputs, self.keys, self.values, blocks)

    def windows(self) -> list[int]:
        """The block counts a group forward can run with: powers of two up to the capacity's
        blocks, and the capacity's blocks (every count without ``buckets``)."""
        most = self.capacity // ATTENTION_BLOCK
        if not self.buckets:
            return list(range(1, most + 1))
        return sorted({min(1 << k, most) for k in range(most.bit_length() + 1)})

    def capture_windows(self) -> float:
        """Capture the CUDA graph of every window (``windows``) up front, so that none is
        captured in the middle of a timed or served forward; a no-op without graphs.

        Returns:
            seconds spent capturing.
        """
        began = time.perf_counter()
        if self.graphs:
            with self.forward_lock, torch.inference_mode():
                for blocks in self.windows():
                    if blocks not in self._graphs:
                        self._graphs[blocks] = self._capture(blocks)
        return time.perf_counter() - began

    def _run_group(self, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``group_forward`` eagerly, or the replay of its CUDA graph (captured on first
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
        saved = [t.clone() for t in self.inputs.buffers()]
        self._idle_inputs()
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(self.runs_on)  # type: ignore[no-untyped-call]
        stream = self._capture_stream
        stream.wait_stream(torch.cuda.current_stream(self.runs_on))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._group_forward(blocks)
        torch.cuda.current_stream(self.runs_on).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA work (the host side of other requests) during
        # the capture does not invalidate it, as the default "global" mode would
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits, hidden = self._group_forward(blocks)
        self._pool = graph.pool()
        for buffer, value in zip(self.inputs.buffers(), saved, strict=True):
            buffer.copy_(value)
        return graph, logits, hidden

    def _idle_inputs(self) -> None:
        """Every place of the group empty: the spare slot, scratch columns, position 0."""
        r, inputs = self.rows, self.inputs
        inputs.ids.zero_()
        inputs.positions.zero_()
        inputs.group.fill_(self.spare)
        inputs.row_slots.fill_(self.spare)
        inputs.columns.copy_(
            (self.capacity + torch.arange(r, device=self.runs_on)).repeat(self.group_slots)
        )
        inputs.mask.zero_()
        inputs.mask[:, :, 0] = True

    # ------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(
        self,
        caches: list[StaticCache],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
        *,
        logits: bool = True,
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
            logits: False: none leaves the device (``prefill``); the tensors returned are
                then (0, V).
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
        logits_out = [torch.empty((q * logits, self.vocab_size), dtype=out_dtype) for q in counts]
        hidden: list[list[torch.Tensor]] = [[] for _ in caches]
        passes = max(counts, default=0)
        pending: list[tuple[torch.Tensor, list[tuple[int, int, int]]]] = []
        with self.forward_lock:
            for first in range(0, passes, self.rows):
                members = [s for s in range(len(caches)) if counts[s] > first]
                for g0 in range(0, len(members), self.group_slots):
                    group = members[g0 : g0 + self.group_slots]
                    blocks = self._blocks_needed(group, first, starts, counts)
                    self._load_group(
                        group, first, blocks, caches, starts, tokens, depths, visible, bases
                    )
                    out, last = self._run_group(blocks)
                    rows = self._gather(out, last, group, first, counts, hidden, caches, logits)
                    pending.append(rows)
            if logits and pending:
                self._to_host(pending, logits_out)
        for s, cache in enumerate(caches):
            cache.cached = starts[s] + counts[s]
            cache.forward_calls += 1
            if cache.keep_hidden and hidden[s]:
                cache.last_hidden = torch.cat(hidden[s])
        return logits_out

    def _blocks_needed(
        self, group: list[int], first: int, starts: list[int], counts: list[int]
    ) -> int:
        end = max(starts[s] + min(counts[s], first + self.rows) for s in group)
        exact = max(1, -(-end // ATTENTION_BLOCK))
        if not self.buckets:
            return exact
        return min(1 << (exact - 1).bit_length(), self.capacity // ATTENTION_BLOCK)

    def _load_group(
        self,
        group: list[int],
        first: int,
        blocks: int,
        caches: list[StaticCache],
        starts: list[int],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
    ) -> None:
        """Fill the static input buffers with pass rows [first, first + R) of ``group``: built
        in ``staging`` on the host, then one copy per buffer; of the mask only the ``blocks``
        window that the group forward reads (columns past it are never read)."""
        r = self.rows
        width = blocks * ATTENTION_BLOCK
        host = self.staging
        if self._staged is not None:  # the last group's copies out of the staging have run
            self._staged.synchronize()
        ids, positions = host.ids.view(-1, r), host.positions.view(-1, r)
        columns, row_slots = host.columns.view(-1, r), host.row_slots.view(-1, r)
        ids.zero_()
        positions.zero_()
        host.columns.copy_(self._padding_columns)  # padding rows: scratch columns
        row_slots.fill_(self.spare)
        host.group.fill_(self.spare)
        mask = host.mask.view(-1)[: self.group_slots * r * width].view(-1, r, width)
        mask.zero_()
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
            host.group[place] = caches[s].slot
            row_slots[place] = caches[s].slot
            ids[place, :n] = torch.tensor(tokens[s][first : first + n], dtype=torch.long)
            positions[place, :n] = torch.tensor(
                [bases[s] + d for d in depths[s][first : first + n]], dtype=torch.float32
            )
            columns[place, :n] = p + first + torch.arange(n)
            mask[place, :n] = False
            mask[place, :n, : p + first + n] = seen[:, : p + first + n]
        inputs = self.inputs
        for buffer, staged in zip(inputs.buffers()[:-1], host.buffers()[:-1], strict=True):
            buffer.copy_(staged, non_blocking=True)
        inputs.mask[:, :, :width].copy_(mask, non_blocking=True)
        if self.runs_on.type == "cuda":
            self._staged = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._staged.record()

    def _gather(
        self,
        out: torch.Tensor,
        last: torch.Tensor,
        group: list[int],
        first: int,
        counts: list[int],
        hidden: list[list[torch.Tensor]],
        caches: list[StaticCache],
        logits: bool = True,
    ) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
        """The real rows' logits of one group forward, gathered on the device (out of the
        static buffers the next replay overwrites; none without ``logits``), with (sequence,
        first pass row, rows) per sequence; hidden states kept on the device."""
        r = self.rows
        index: list[int] = []
        spans: list[tuple[int, int, int]] = []
        for place, s in enumerate(group):
            n = min(counts[s] - first, r)
            spans.append((s, first, n))
            index.extend(range(place * r, place * r + n))
        where = torch.tensor(index, dtype=torch.long).to(self.runs_on, non_blocking=True)
        rows = out.index_select(0, where) if logits else out[:0]
        if any(caches[s].keep_hidden for s in group):
            kept, at = last.index_select(0, where), 0
            for s, _, n in spans:
                if caches[s].keep_hidden:
                    hidden[s].append(kept[at : at + n])
                at += n
        return rows, spans

    def _to_host(
        self,
        pending: list[tuple[torch.Tensor, list[tuple[int, int, int]]]],
        logits: list[torch.Tensor],
    ) -> None:
        """Every group's gathered logits to the host in one copy (bfloat16 widened there:
        exact), then into each sequence's (q, V) rows."""
        gathered = [rows for rows, _ in pending]
        both = gathered[0] if len(gathered) == 1 else torch.cat(gathered)
        host = both.to("cpu").to(logits[0].dtype)  # the one device-to-host copy
        self.host_copies += 1
        at = 0
        for _, spans in pending:
            for s, first, n in spans:
                logits[s][first : first + n] = host[at : at + n]
                at += n

    def prefill(self, caches: list[Any], chains: list[list[int]]) -> None:
        """``Target.prefill``, no logits leaving the device (4,096 tokens: ~400 MB)."""
        visible = [chain_visible(0, len(chain)) for chain in chains]
        depths = [list(range(len(chain))) for chain in chains]
        self.forward(caches, chains, depths, visible, [0] * len(chains), logits=False)

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
