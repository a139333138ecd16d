"""KV caches on llama.cpp: one sequence's cache (``GgufCache``) inside a context that may hold
many (``KvStore``), for ``sampler.targets.llamacpp.GgufTarget``.

Drafter and batch invariance (MPFR Thm. 5.1) needs a sequence's logits to be the same bits
whatever shares its forward or its context. With flash attention over a Q8_0 KV cache,
llama.cpp's CPU kernel computes each query row on one thread, over the context's cells in
cell order, skipping the masked ones (``sampler.targets.llamacpp``'s docstring says why those
settings); so a row's bits depend on its own visible cells and their ORDER only. The store
keeps that order:

- **cells in position order**: llama.cpp puts new tokens into the first free cells from its
  head, and a freed cell moves the head back, so a freed cell between a sequence's cells would
  later hold a newer token before older ones. No cell is freed while it has live cells after
  it: rejected tree nodes, dropped positions and dead caches' cells go to the ``tomb``
  sequence, which no query reads.
- **compaction** (``KvStore.compact``): when the cells run out, or the tomb outgrows the live
  cells (every query scans the whole used range), each live sequence's cells are saved,
  the context cleared and the sequences restored one after another: the same K/V bytes,
  each sequence's cells again contiguous and in order. Nothing is recomputed.

Sequence ids and draft trees: a query row sees the cells that carry its FIRST sequence id at
a position <= its own. Each cache holds one id for life (its committed cells carry it) and,
for a draft tree of k leaves, borrows k - 1 more until ``keep``: leaf j is the cache's id j, a
node carries the ids of the leaves under it (first: one of them), so it sees exactly its
ancestors and itself; committed cells are copied to the borrowed ids first.

A store is private (one cache, ``GgufTarget.new_cache``) or shared (every sequence of the
continuous batch, ``GgufTarget.new_batch_cache``: one ``llama_decode`` steps them all). A
shared store that runs out of ids or cells moves a cache into a private store of its own
(its cells copied, not recomputed).

Shapes: q new tokens, P cached positions, V vocabulary, d hidden size.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import numpy as np
import torch

from sampler.targets.base import Target
from sampler.targets.llamacpp_tree import Plan, sequences, tree_parents

__all__ = ["MAX_LEAVES", "GgufCache", "KvStore"]

MAX_LEAVES = 64
"""Leaves of one draft tree (``sampler.methods.MAX_DRAFTS``)."""
COMPACT_TOMB = 1024
"""Tomb cells a store keeps before compacting while they are fewer than its live cells."""


class LlamaBackend(Target):
    """What a ``KvStore`` and its caches need of their target: the llama.cpp library, the
    context sizes, contexts to open and release, the lock every decode holds, and ``decode``.
    ``sampler.targets.llamacpp.GgufTarget`` is the one implementation; it is declared here so
    that the store never imports the target that imports it."""

    lib: Any
    context_cells: int
    shared_cells: int
    shared_seq_max: int
    decoding: threading.RLock

    def open_context(self, cells: int, seq_max: int, pooled: bool) -> Any:
        """A llama.cpp context of ``cells`` KV cells and ``seq_max`` sequence ids."""
        raise NotImplementedError

    def release_context(self, ctx: Any, pooled: bool) -> None:
        """Give back a context ``open_context`` returned."""
        raise NotImplementedError

    def decode(
        self,
        ctx: Any,
        rows: list[tuple[int, int, list[int]]],
        hidden: bool = False,
        outputs: list[bool] | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Decode ``rows`` (token, position, sequence ids) on ``ctx``: the logits, and the
        hidden states where ``hidden``, of the rows ``outputs`` marks (None: all)."""
        raise NotImplementedError


class KvStore:
    """One llama.cpp context and the caches whose cells it holds (module docstring).

    Attributes:
        target: the ``LlamaBackend`` (``GgufTarget``).
        ctx, mem: the llama.cpp context and its memory.
        cells: the context's KV cells.
        shared: whether several caches live here (else exactly one).
        tomb: the sequence id no query reads.
        used: occupied cells (live, pending and tomb) since the last compaction.
        compactions: how many times the cells were compacted.
    """

    def __init__(self, target: LlamaBackend, shared: bool, cells: int | None = None) -> None:
        """``cells`` None: the target's ``shared_cells`` or ``context_cells``."""
        self.target = target
        self.shared = shared
        self.cells = cells or (target.shared_cells if shared else target.context_cells)
        seq_max = target.shared_seq_max if shared else MAX_LEAVES + 1
        self.pooled = not shared and self.cells == target.context_cells
        self.ctx = target.open_context(self.cells, seq_max, pooled=self.pooled)
        self.mem = target.lib.llama_get_memory(self.ctx)
        self.tomb = seq_max - 1
        self._ids = list(range(seq_max - 2, -1, -1))  # free ids; pop() gives the lowest
        self.used = 0
        self.compactions = 0
        self.caches: weakref.WeakSet[GgufCache] = weakref.WeakSet()
        self._dead: list[list[int]] = []  # ids of caches that died, tombed at the next use

    def __del__(self) -> None:
        target = getattr(self, "target", None)
        ctx = getattr(self, "ctx", None)
        if target is not None and ctx is not None:
            self.ctx = None  # the target frees a shared context it outlives only once
            target.release_context(ctx, pooled=self.pooled)

    # ids -------------------------------------------------------------------------------

    def free_ids(self) -> int:
        return len(self._ids)

    def take_id(self) -> int:
        return self._ids.pop()

    def give_ids(self, ids: list[int]) -> None:
        self._ids.extend(ids)
        self._ids.sort(reverse=True)

    def bury(self, ids: list[int]) -> None:
        """Called from a dying cache (any thread, no lock): its ids are tombed at the next use."""
        self._dead.append(ids)

    def settle(self) -> None:
        """Move dead caches' cells to the tomb and free their ids (under the decode lock)."""
        lib = self.target.lib
        while self._dead:
            ids = self._dead.pop()
            for seq in ids:
                lib.llama_memory_seq_cp(self.mem, seq, self.tomb, -1, -1)
                lib.llama_memory_seq_rm(self.mem, seq, -1, -1)
            self.give_ids(ids)

    # cells ------------------------------------------------------------------------------

    def live(self) -> int:
        """Committed cells of the live caches."""
        return sum(cache.cached for cache in self.caches)

    def wants_compaction(self, need: int) -> bool:
        """Whether ``need`` more cells call for a compaction first: they do not fit, or the
        tomb is over ``COMPACT_TOMB`` cells and over the live ones."""
        tomb = self.used - self.live()
        return self.used + need > self.cells or (tomb > COMPACT_TOMB and tomb > self.live())

    def compact(self) -> None:
        """Save every live cache's cells, clear the context, restore them one cache after
        another (module docstring). Every cache must have kept its latest tree.

        Raises:
            RuntimeError: llama.cpp could not save or restore a sequence.
        """
        self.settle()
        caches = [cache for cache in self.caches if cache.cached]
        saved = [(cache, self.save(cache.ids[0])) for cache in caches]
        self.target.lib.llama_memory_clear(self.mem, True)
        for cache, state in saved:
            self.restore(state, cache.ids[0])
        self.used = sum(cache.cached for cache in caches)
        self.compactions += 1

    def save(self, seq: int) -> Any:
        """Sequence ``seq``'s cells (positions, K and V bytes) as a ctypes buffer."""
        lib = self.target.lib
        size = lib.llama_state_seq_get_size(self.ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        if lib.llama_state_seq_get_data(self.ctx, buffer, size, seq) != size:
            raise RuntimeError(f"llama.cpp could not save sequence {seq}")
        return buffer

    def restore(self, state: Any, seq: int) -> None:
        """Put ``save``'s cells back as sequence ``seq`` (into the next free cells, in order)."""
        if self.target.lib.llama_state_seq_set_data(self.ctx, state, len(state), seq) == 0:
            raise RuntimeError(f"llama.cpp could not restore sequence {seq}")

    # decoding ---------------------------------------------------------------------------

    def run(
        self, members: list[tuple[GgufCache, Plan]], outputs: bool = True
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Decode the planned forwards of ``members`` (caches of this store) in one llama.cpp
        call (micro-batched) and record them; caches that do not fit (ids or cells) move to a
        private store first and decode there.

        Args:
            outputs: False: llama.cpp computes no output (a prefill's chains; its embeddings,
                which force every row to be one, are off for the call): the cells are the
                same bits.
        Returns:
            Per member, (q, V) float32 logits ((0, V) without ``outputs``) and, when its
            ``keep_hidden`` is set (and ``outputs``), its (q, d) float32 final normed hidden
            states, else None.
        """
        target = self.target
        with target.decoding:
            self.settle()
            need = sum(len(plan.tokens) for _, plan in members)
            if self.wants_compaction(need) and not any(c._pending_tree() for c in self.caches):
                self.compact()
            here: list[tuple[GgufCache, Plan]] = []
            out: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
            for k, (cache, plan) in enumerate(members):
                extra = plan.leaves - len(cache.ids)
                if self.shared and (
                    extra > self.free_ids() or self.used + len(plan.tokens) > self.cells
                ):
                    cache._move_to(KvStore(target, shared=False))
                    out[k] = cache.store.run([(cache, plan)], outputs)[0]
                    continue
                for _ in range(extra):
                    cache._lend(self.take_id())
                self.used += len(plan.tokens)
                here.append((cache, plan))
            if self.used > self.cells:
                raise RuntimeError("llama.cpp context is full")  # a private store: never
            rows = [row for cache, plan in here for row in cache._rows(plan)]
            hidden = any(cache.keep_hidden for cache, _ in here)
            marks = None if outputs else [False] * len(rows)
            if not outputs:  # llama.cpp's embeddings make every row an output
                target.lib.llama_set_embeddings(self.ctx, False)
            try:
                logits, states = target.decode(self.ctx, rows, hidden and outputs, marks)
            finally:
                if not outputs:
                    target.lib.llama_set_embeddings(self.ctx, True)
            start = 0
            for k, (cache, plan) in enumerate(members):
                if k in out:
                    continue
                q = len(plan.tokens) if outputs else 0
                block = torch.from_numpy(logits[start : start + q])
                state = None
                if states is not None and cache.keep_hidden:
                    state = torch.from_numpy(states[start : start + q])
                cache._record(plan, state)
                out[k] = (block, state)
                start += q
            return [out[k] for k in range(len(members))]


class GgufCache:
    """One sequence's KV cache on a ``GgufTarget`` (``CachedLM``'s interface).

    Attributes:
        store: the ``KvStore`` that holds its cells.
        ids: its sequence ids in the store (ids[0] for life; the rest lent until ``keep``).
        cached: P, the number of committed positions in the cache.
        forward_calls: forwards so far (prefill included).
        tokens: the P committed token ids.
        keep_hidden: when set, ``last_hidden`` holds the latest forward's (q, d) float32
            final normed hidden states (what transformers' last hidden state is).
    """

    def __init__(self, target: LlamaBackend, store: KvStore) -> None:
        self.target = target
        self.runner = target
        self.store = store
        with target.decoding:
            store.settle()
            self.ids = [store.take_id()]
        store.caches.add(self)
        self.cached = 0
        self.forward_calls = 0
        self.tokens: list[int] = []
        self.keep_hidden = False
        self.last_hidden: torch.Tensor | None = None
        self._pending: Plan | None = None

    def __del__(self) -> None:
        store = getattr(self, "store", None)
        if store is not None and store.shared:
            store.bury(list(self.ids))

    @property
    def cells(self) -> int:
        """Occupied cells of its store (live, pending and tomb)."""
        return self.store.used

    def forward(
        self, tokens: list[int], depths: list[int], visible: torch.Tensor, base: int
    ) -> torch.Tensor:
        """Run q new tokens, a draft tree (node order: parents first) over the cache.

        Args:
            tokens: q token ids.
            depths: q depths; token i sits at position ``base + depths[i]``.
            visible: (q, P + q) bool: every token sees all P cached positions, and among the
                new ones exactly its ancestors and itself (a tree rooted at token 0).
            base: must equal P.
        Returns:
            (q, V) float32 logits.
        Raises:
            ValueError: another mask shape, a mask that is not such a tree, more than
                ``MAX_LEAVES`` leaves, or more tokens than the context.
        """
        return self._forward(self.plan(tokens, depths, visible, base))

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Causal forward of a token chain after the cache, all of it kept; (q, V) logits.

        ``forward`` over the chain's mask, without building or checking one: a decoding step
        whose tree is a chain comes here (``sampler.loop.verify_tree``), where the mask and
        tree checks cost ~0.1 ms a token after a llama.cpp forward (one-off timing). Same rows,
        same bits.
        """
        return self._forward(self.plan_chain(tokens))

    def _forward(self, plan: Plan) -> torch.Tensor:
        if not plan.tokens:
            return torch.empty((0, self.target.vocab_size))
        return self.store.run([(self, plan)])[0][0]

    def plan(self, tokens: list[int], depths: list[int], visible: torch.Tensor, base: int) -> Plan:
        """Check a ``forward``'s arguments; its tree (``forward`` raises what this raises)."""
        q, p = len(tokens), self.cached
        self._check_kept()
        if base != p or visible.shape != (q, p + q) or len(depths) != q:
            raise ValueError(
                f"expected base {p} and visible of shape ({q}, {p + q}), got base {base} and "
                f"{tuple(visible.shape)}"
            )
        if q == 0:
            return Plan(p, [], [], [], [], [], True)
        if not bool(visible[:, :p].all()):
            raise ValueError("every new token must see the whole cache")
        parents = tree_parents(visible[:, p:].numpy(), depths)
        leaf_of, seqs_of = sequences(parents)
        if len(set(leaf_of)) > MAX_LEAVES:
            raise ValueError(f"a draft tree has at most {MAX_LEAVES} leaves")
        self._check_room(q)
        chain = all(parent == i - 1 for i, parent in enumerate(parents))
        if chain:
            return self.plan_chain(tokens)
        return Plan(p, list(tokens), list(depths), parents, leaf_of, seqs_of, False)

    def plan_chain(self, tokens: list[int]) -> Plan:
        """A causal chain after the cache (``extend``)."""
        q, p = len(tokens), self.cached
        self._check_kept()
        self._check_room(q)
        return Plan(
            p, list(tokens), list(range(q)), list(range(-1, q - 1)), [0] * q, [[0]] * q, True
        )

    def _check_kept(self) -> None:
        if self._pending_tree():
            raise ValueError("keep() the previous draft tree's path before the next forward")

    def _check_room(self, q: int) -> None:
        if self.cached + q > self.target.context_cells:
            raise ValueError(
                f"{self.cached + q} positions exceed the context of {self.target.context_cells}"
            )

    def _pending_tree(self) -> bool:
        return self._pending is not None and not self._pending.chain

    def _lend(self, seq: int) -> None:
        """Take one more sequence id: the committed cells carry it too."""
        self.target.lib.llama_memory_seq_cp(self.store.mem, self.ids[0], seq, -1, -1)
        self.ids.append(seq)

    def _rows(self, plan: Plan) -> list[tuple[int, int, list[int]]]:
        """(token, position, sequence ids) per new token of ``plan``."""
        ids = self.ids
        if plan.chain:
            return [(token, plan.base + i, [ids[0]]) for i, token in enumerate(plan.tokens)]
        return [
            (token, plan.base + depth, [ids[leaf] for leaf in seqs])
            for token, depth, seqs in zip(plan.tokens, plan.depths, plan.seqs_of, strict=True)
        ]

    def _record(self, plan: Plan, hidden: torch.Tensor | None) -> None:
        self.forward_calls += 1
        self.cached = plan.base + len(plan.tokens)
        if plan.chain:
            self.tokens.extend(plan.tokens)
        self._pending = plan
        if hidden is not None:
            self.last_hidden = hidden

    def keep(self, prefix: int, slots: list[int]) -> None:
        """Keep positions [0, prefix) and then the cached positions ``slots`` (increasing).

        After a draft tree (slot ``P + i`` = its token i) ``prefix`` must be that P and
        ``slots`` a path from its root; otherwise ``slots`` must continue the prefix
        (``prefix, prefix + 1, ...``): the positions after them are dropped.

        Raises:
            ValueError: other slots.
        """
        with self.target.decoding:
            self._keep(prefix, slots)

    def _keep(self, prefix: int, slots: list[int]) -> None:
        pending, self._pending = self._pending, None
        if pending is None or pending.chain:
            end = prefix + len(slots)
            if slots != list(range(prefix, end)) or end > self.cached:
                raise ValueError(f"keep({prefix}, {slots}): slots must continue the prefix")
            self._drop_after(end)
            return
        base = pending.base
        nodes = [slot - base for slot in slots]
        if prefix != base or any(
            not 0 <= node < len(pending.tokens)
            or pending.parents[node] != (nodes[k - 1] if k else -1)
            for k, node in enumerate(nodes)
        ):
            self._pending = pending
            raise ValueError(f"keep({prefix}, {slots}) is not a root path of the latest tree")
        lib, mem, tomb, depth = self.target.lib, self.store.mem, self.store.tomb, len(nodes)
        own, lent = self.ids[0], self.ids[1:]
        kept = self.ids[pending.leaf_of[nodes[-1]]] if nodes else own
        # every tree cell joins the tomb (stays occupied: see the module docstring), then the
        # cache's own id keeps only the path and the lent ids go back
        for seq in self.ids:
            lib.llama_memory_seq_cp(mem, seq, tomb, base, -1)
        if kept != own:
            lib.llama_memory_seq_rm(mem, own, base, -1)
            if depth:
                lib.llama_memory_seq_cp(mem, kept, own, base, base + depth)
        else:
            lib.llama_memory_seq_rm(mem, own, base + depth, -1)
        for seq in lent:
            lib.llama_memory_seq_rm(mem, seq, -1, -1)
        self.ids = [own]
        self.store.give_ids(lent)
        self.tokens[base:] = [pending.tokens[node] for node in nodes]
        self.cached = base + depth

    def _drop_after(self, end: int) -> None:
        """Drop the committed positions from ``end`` on (to the tomb)."""
        if end == self.cached:
            return
        lib, mem, own = self.target.lib, self.store.mem, self.ids[0]
        lib.llama_memory_seq_cp(mem, own, self.store.tomb, end, -1)
        lib.llama_memory_seq_rm(mem, own, end, -1)
        del self.tokens[end:]
        self.cached = end

    def _move_to(self, store: KvStore) -> None:
        """Copy the committed cells into ``store`` (a fresh one) and tomb them here; the
        latest tree must be kept."""
        old, own = self.store, self.ids[0]
        seq = store.take_id()
        if self.cached:
            store.restore(old.save(own), seq)
        store.used = self.cached
        store.caches.add(self)
        old.caches.discard(self)
        lib = self.target.lib
        lib.llama_memory_seq_cp(old.mem, own, old.tomb, -1, -1)
        lib.llama_memory_seq_rm(old.mem, own, -1, -1)
        old.give_ids([own])
        self.store, self.ids = store, [seq]
