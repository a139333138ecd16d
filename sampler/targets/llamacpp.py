"""The target on llama.cpp: the GGUF file's own quantised weights (precision ``gguf``).

``GgufTarget`` runs the shipped GGUF (SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding/LM
head) through ``llama-cpp-python``'s low-level API behind the interface the decoder uses for
every target (``forward``/``extend``/``keep`` over a KV cache, ``sampler.targets.transformers``).
The keyed race, the draft tree and the detector stay ours; llama.cpp only gives logits.

Drafter invariance (MPFR Thm. 5.1: the output must not depend on B, L or the batch) needs a
context's logits to be the same bits whatever shares the forward. llama.cpp gives that here
only with these settings, each measured (``probe``, run at load, refuses the backend when it
fails):

- **flash attention with a Q8_0 KV cache**: with an F16/F32 cache the CPU kernel switches to
  a KV-split path for one-token batches (>= 512 cells) and a tiled path for >= 64 query rows,
  whose reductions differ (logits moved by up to 0.7 between a row alone and in a batch); with a
  quantised cache every batch takes the one per-cell path, which skips masked cells and
  accumulates the visible ones in cell order;
- **cells in position order** and **sequences that share a context**: a row's bits depend on
  its own visible cells and their order only, so a context may hold many sequences as long
  as no freed cell ever lands between a sequence's cells (``sampler.targets.llamacpp_kv``: the tomb
  sequence and compaction by copying cells).

Continuous batching: the caches of ``new_batch_cache`` share one context (``KvStore``), and
``forward`` over many of them is ONE ``llama_decode`` of all their rows, each row the bits it
gets alone (``probe`` checks it at load, ``tests/sampler/test_gguf_target.py`` through the
decoder). It pays where the CPU has batched kernels for the file's types: with
``scripts/setup.sh``'s row kernels (``ROW_KERNELS_BUILD``) 8 rows cost ~2.0 one-row forwards and
9 rows ~2.5 on an AVX-512 AMD EPYC (``bench/results/gguf_forward_costs_zen4_row_kernels.json``),
with AMX repacking on a Xeon (``scripts/llama-cpp-amx-rows.patch``: VNNI kernels for 2-32 rows)
2 rows ~1.2 and 9 rows ~2.0, not repacked 9 rows ~1.8
(``gguf_forward_costs_xeon_attention_scores.json``); a build without them
on AVX2 alone pays ~5.2 for 9 rows (AMD EPYC, ``gguf_forward_costs_amd.json``).

Tree attention maps to llama.cpp's sequence ids (``sampler.targets.llamacpp_kv``).

Shapes: q new tokens, P cached positions, V vocabulary.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sampler.targets.cpu_features import CoreShare
from sampler.targets.llamacpp_kv import MAX_LEAVES, GgufCache, KvStore, LlamaBackend
from sampler.targets.llamacpp_lib import (
    PATCHED_BUILD,
    ROW_KERNELS_BUILD,
    GgufUnavailable,
    _lib,
    available,
    cpu_threads,
    repacking_safe,
)
from sampler.targets.llamacpp_tree import Plan
from sampler.targets.profile import library_build

log = logging.getLogger("poissonmark.gguf")

__all__ = [
    "PATCHED_BUILD",
    "ROW_KERNELS_BUILD",
    "GgufCache",
    "GgufTarget",
    "GgufUnavailable",
    "RowInvarianceError",
    "available",
    "repacking_safe",
]

UBATCH = 512
"""Tokens per llama.cpp micro-batch (a longer forward runs as several, same results)."""
CONTEXT_CELLS = 8192
"""KV cells of a private context, and the most positions of one sequence (capped at the
model's training context): ~100 MB in Q8_0 for SmolLM2-135M."""
SHARED_CELLS = 8192
"""KV cells of the context the continuous batch shares (~100 MB in Q8_0; more than the model's
training context draws llama.cpp's overflow warning). A sequence that does not fit moves to a
context of its own."""
SHARED_SEQ_MAX = 256
"""Sequence ids of the shared context (llama.cpp's LLAMA_MAX_SEQ): one per live sequence,
one per extra leaf of a pending draft tree, and the tomb."""


class RowInvarianceError(RuntimeError):
    """llama.cpp gave a context different logits alone and inside a larger batch or tree on
    this machine, so precision ``gguf`` could not keep outputs drafter-invariant."""


class GgufTarget(LlamaBackend):
    """A GGUF model loaded once into llama.cpp; ``new_cache`` gives each sequence a context.

    Its ``model`` (``Target.model``: the transformers copy of the same weights, for the
    config and the drafters) is set by the loader (``sampler.models.gguf_target``).

    Attributes:
        path: the GGUF file.
        vocab_size: V, llama.cpp's vocabulary (logits width).
        context_cells: KV cells per sequence.
        weights: the file's dominant tensor type, e.g. ``"gguf:Q4_1"``, with ``"+repacked"``
            when ``repack`` (machine fingerprint: the step costs differ).
        threads: the most llama.cpp threads per forward.
        share: with no fixed ``threads``, the ``CoreShare`` that picks each decode's count
            (None: always ``threads``; also when ``probe`` finds the logits depend on it).
        repack: whether the weights were repacked into llama.cpp's extra CPU buffer types
            (AMX int8 tiles on a CPU with AMX: a one-token forward ~1.7x and a 5-token one
            ~2.2x faster on a 2-core Xeon, ``bench.gguf_forward_costs``).
    Raises (at construction):
        GgufUnavailable: no llama-cpp-python; FileNotFoundError: no such file.
    """

    def __init__(self, path: Path, threads: int | None = None, repack: bool | None = None) -> None:
        """``repack`` None: on exactly where it is safe (``repacking_safe``). Whether the rows
        stay batch-invariant with it is for ``probe`` to say (``sampler.models.gguf_target``
        falls back to ``repack=False`` when it fails)."""
        self.lib = _lib()
        # the build's kernels set every forward cost
        # (``sampler.targets.profile.machine_fingerprint``): the libraries llama_cpp loads
        libraries = os.environ.get("LLAMA_CPP_LIB_PATH") or Path(self.lib.__file__).parent / "lib"
        self.build = library_build(str(getattr(self.lib, "__version__", "?")), Path(libraries))
        if not path.is_file():
            raise FileNotFoundError(path)
        self.path = path
        self.threads = threads or cpu_threads()
        # a fixed count is kept; the default follows what other processes leave free
        self.share = None if threads else CoreShare(self.threads)
        self._pinned = 0  # a thread count the probe forces (0: none)
        self.repack = repacking_safe() if repack is None else repack
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        # Repacking into the extra buffer types crashes an unpatched build on an AMX CPU
        # (PATCHED_BUILD); on the AMD EPYC measured it changed nothing for this file (10.0 vs
        # 10.2 ms a forward in a one-off probe).
        params.use_extra_bufts = self.repack
        self.handle = self.lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.handle:
            raise GgufUnavailable(f"llama.cpp could not load {path.name}")
        self.vocab_size = int(
            self.lib.llama_vocab_n_tokens(self.lib.llama_model_get_vocab(self.handle))
        )
        trained = int(self.lib.llama_model_n_ctx_train(self.handle))
        self.context_cells = min(CONTEXT_CELLS, trained) if trained > 0 else CONTEXT_CELLS
        desc = ctypes.create_string_buffer(256)
        self.lib.llama_model_desc(self.handle, desc, len(desc))
        self.weights = "gguf:" + (desc.value.decode(errors="replace").split()[-1] or "?")
        if self.repack:
            self.weights += "+repacked"
        self._free: list[Any] = []  # idle private contexts, reused by new caches
        self._lock = threading.Lock()
        self.shared_cells = SHARED_CELLS
        self.shared_seq_max = SHARED_SEQ_MAX
        self._shared: KvStore | None = None
        self.hidden_size = int(self.lib.llama_model_n_embd(self.handle))
        self.invariant = True  # measured per machine by ``probe`` (sampler.models.gguf_target)
        # the detector's model tests: llama.cpp's decode calls share one lock with the
        # generation steps of the same model; 32 rows hold it ~0.2-0.3 s (2 CPU cores), not
        # the ~1 s of 128 rows with their logits
        self.rows_per_call = 32
        self._batch = self.lib.llama_batch_init(UBATCH, 0, MAX_LEAVES + 1)
        # one shared batch buffer; every context's memory is changed under it too (a shared
        # context's caches may live on several threads); reentrant: a store's decode may
        # move a cache into a new store and decode there
        self.decoding = threading.RLock()

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        shared = getattr(self, "_shared", None)
        if shared is not None and shared.ctx is not None:
            lib.llama_free(shared.ctx)
            shared.ctx = None
        for ctx in getattr(self, "_free", []):
            lib.llama_free(ctx)
        if getattr(self, "_batch", None) is not None:
            lib.llama_batch_free(self._batch)
        if getattr(self, "handle", None):
            lib.llama_model_free(self.handle)

    def open_context(self, cells: int, seq_max: int, pooled: bool) -> Any:
        """A llama.cpp context of ``cells`` KV cells and ``seq_max`` sequence ids; ``pooled``:
        a private one, taken from the idle ones when there is one."""
        if pooled:
            with self._lock:
                if self._free:
                    return self._free.pop()
        params = self.lib.llama_context_default_params()
        params.n_ctx = cells
        params.n_batch = self.micro_batch
        params.n_ubatch = self.micro_batch
        params.n_outputs_max = max(self.micro_batch, seq_max)  # asserted >= n_seq_max
        params.n_seq_max = seq_max
        params.n_threads = self.threads
        params.n_threads_batch = self.threads
        params.flash_attn_type = self.lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_k = self.lib.GGML_TYPE_Q8_0
        params.type_v = self.lib.GGML_TYPE_Q8_0
        params.kv_unified = True
        params.embeddings = True  # the final normed hidden states too (heads drafters)
        params.no_perf = True
        ctx = self.lib.llama_init_from_model(self.handle, params)
        if not ctx:
            raise GgufUnavailable("llama.cpp could not create a context")
        return ctx

    def release_context(self, ctx: Any, pooled: bool) -> None:
        """Give back a context of ``_context``: a pooled one is cleared and kept for reuse."""
        if not pooled:
            self.lib.llama_free(ctx)
            return
        self.lib.llama_memory_clear(self.lib.llama_get_memory(ctx), True)
        with self._lock:
            self._free.append(ctx)

    @property
    def micro_batch(self) -> int:
        """Tokens per llama.cpp decode call: ``UBATCH``, at most the context (llama.cpp
        aborts the process on a batch with more outputs than its context holds)."""
        return min(UBATCH, self.context_cells)

    def backend(self) -> str:
        return f"llama.cpp:{self.weights}:threads={self.threads}"

    def new_cache(self) -> GgufCache:
        """An empty KV cache for one sequence, in a llama.cpp context of its own."""
        return GgufCache(self, KvStore(self, shared=False))

    def new_batch_cache(self) -> GgufCache:
        """An empty KV cache for a sequence that steps beside others: in the context the
        continuous batch shares, so that ``forward`` decodes them all in one call."""
        with self.decoding:
            if self._shared is None:
                self._shared = KvStore(self, shared=True)
            return GgufCache(self, self._shared)

    def forward(
        self,
        caches: list[GgufCache],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
    ) -> list[torch.Tensor]:
        """``GgufCache.forward`` for R sequences: the caches of one shared context in ONE
        llama.cpp decode, each other cache alone. Each row gets the bits it gets alone.

        Returns:
            R tensors of (q_r, V) float32 logits.
        Raises:
            ValueError: as ``GgufCache.forward``, checked for every cache before any decode.
        """
        plans = [
            cache.plan(t, d, v, b)
            for cache, t, d, v, b in zip(caches, tokens, depths, visible, bases, strict=True)
        ]
        stores: dict[int, list[int]] = {}
        for k, cache in enumerate(caches):
            stores.setdefault(id(cache.store), []).append(k)
        out: list[torch.Tensor | None] = [None] * len(caches)
        for members in stores.values():
            store = caches[members[0]].store
            done = store.run([(caches[k], plans[k]) for k in members])
            for k, (logits, _) in zip(members, done, strict=True):
                out[k] = logits
        return [logits for logits in out if logits is not None]

    def prefill(self, caches: list[GgufCache], chains: list[list[int]]) -> None:
        """``Target.prefill``: each chain a causal forward into its empty cache, the caches of
        one context in ONE llama.cpp decode that computes no output (no LM head, no logits'
        copy: llama.cpp's embeddings are switched off for it, as they force every output).
        A cache that keeps hidden states gets its last token's in a second decode of those
        last tokens. The cells are the bits one full forward writes (every row's kernels and
        attention are the same alone or beside others: ``probe``)."""
        bodies = [
            chain[:-1] if c.keep_hidden else chain for c, chain in zip(caches, chains, strict=True)
        ]
        some = [k for k, body in enumerate(bodies) if body]
        if some:
            plans = [caches[k].plan_chain(bodies[k]) for k in some]
            self._run_plans([caches[k] for k in some], plans, False)
        last = [k for k, cache in enumerate(caches) if cache.keep_hidden and chains[k]]
        if last:
            plans = [caches[k].plan_chain(chains[k][-1:]) for k in last]
            self._run_plans([caches[k] for k in last], plans, True)

    def _run_plans(self, caches: list[GgufCache], plans: list[Plan], outputs: bool) -> None:
        """Decode ``plans`` on their stores, the caches of one store together; without
        ``outputs`` llama.cpp computes none (``KvStore.run``)."""
        stores: dict[int, list[int]] = {}
        for k, cache in enumerate(caches):
            stores.setdefault(id(cache.store), []).append(k)
        for members in stores.values():
            caches[members[0]].store.run([(caches[k], plans[k]) for k in members], outputs)

    def decode(
        self,
        ctx: Any,
        rows: list[tuple[int, int, list[int]]],
        hidden: bool = False,
        outputs: list[bool] | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Decode ``rows`` (token, position, sequence ids; the first id is the one the token's
        attention reads) in micro-batches of ``micro_batch``.

        Args:
            outputs: per row, whether llama.cpp computes its output (None: every row); the
                others only write their cells (a prefill's chain).
        Returns:
            (n, V) float32 logits and, with ``hidden``, the (n, d) float32 final normed hidden
            states (llama.cpp's ``result_norm``), else None, for the n output rows in order.

        Raises:
            RuntimeError: llama.cpp's decode failed (no KV slot, or an error code).
        """
        marks = outputs if outputs is not None else [True] * len(rows)
        count = sum(marks)
        out = np.empty((count, self.vocab_size), dtype=np.float32)
        states = np.empty((count, self.hidden_size), dtype=np.float32) if hidden else None
        with self.decoding:
            threads = self._pinned or (self.share.threads() if self.share else self.threads)
            self.lib.llama_set_n_threads(ctx, threads, threads)
            step, done = self.micro_batch, 0
            for start in range(0, len(rows), step):
                part = marks[start : start + step]
                self._decode_part(ctx, rows[start : start + step], part, done, out, states)
                done += sum(part)
        return out, states

    def _decode_part(
        self,
        ctx: Any,
        part: list[tuple[int, int, list[int]]],
        marks: list[bool],
        start: int,
        out: np.ndarray,
        states: np.ndarray | None,
    ) -> None:
        lib, batch, vocab = self.lib, self._batch, self.vocab_size
        batch.n_tokens = len(part)
        for i, (token, pos, seqs) in enumerate(part):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(seqs)
            ids = batch.seq_id[i]
            for j, seq in enumerate(seqs):
                ids[j] = seq
            batch.logits[i] = 1 if marks[i] else 0
        code = lib.llama_decode(ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama.cpp decode failed (code {code})")
        rows = sum(marks)
        if rows == 0:
            return
        # one memmove each into the C-contiguous outputs: np.ctypeslib.as_array builds a new
        # ctypes array type per call, 77 µs a token right after a forward (AMD EPYC, one-off)
        # against ~30 µs for the copy itself
        logits = lib.llama_get_logits(ctx)
        if not logits:
            raise RuntimeError("llama.cpp returned no logits")
        ctypes.memmove(out[start:].ctypes.data, logits, rows * vocab * 4)
        if states is not None:
            embd = lib.llama_get_embeddings(ctx)
            if not embd:
                raise RuntimeError("llama.cpp returned no hidden states")
            ctypes.memmove(states[start:].ctypes.data, embd, rows * self.hidden_size * 4)

    def probe(self) -> None:
        """Check the invariances the decoder relies on, on this machine, with fixed tokens
        (nothing keyed): a chain decoded at once equals it decoded token by token, a tree
        node equals the same context as a chain, a context after a kept tree path equals
        the chain's; in a shared context, two sequences stepped in one decode, their cells
        interleaved, beside a dead sequence's cells and across a compaction, equal each
        alone. Where the thread count follows the machine's load (``share``), a chain on one
        thread must equal it on all, or the count is fixed. ~0.5 s.

        Raises:
            RowInvarianceError: some row differs.
        """
        vocab = self.vocab_size
        prefix = [(31 * i + 7) % vocab for i in range(40)]
        chain = [(53 * i + 11) % vocab for i in range(6)]
        alone, joint, tree = self.new_cache(), self.new_cache(), self.new_cache()
        for cache in (alone, joint, tree):
            cache.extend(prefix)
        one = torch.cat([alone.extend([t]) for t in chain])
        together = joint.extend(chain)
        if not torch.equal(one, together):
            raise RowInvarianceError(
                "llama.cpp: a chain decoded at once differs from token by token"
            )
        # root chain[0]; children chain[1] (kept) and another token; grandchild chain[2]
        other = (chain[1] + 1) % vocab
        base = tree.cached
        visible = torch.ones((5, base + 5), dtype=torch.bool)
        visible[:, base:] = torch.tensor(
            [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 0, 0, 1]],
            dtype=torch.bool,
        )
        logits = tree.forward(
            [chain[0], other, chain[1], chain[2], other], [0, 1, 1, 2, 2], visible, base
        )
        if not torch.equal(logits[[0, 2, 3]], one[:3]):
            raise RowInvarianceError("llama.cpp: a draft-tree node differs from its chain")
        tree.keep(base, [base, base + 2, base + 3])
        after = tree.extend(chain[3:])
        if not torch.equal(after, one[3:]):
            raise RowInvarianceError("llama.cpp: a context after a kept tree path differs")
        if self.share is not None and self.threads > 1:
            self._pinned = 1
            try:
                single = self.new_cache()
                single.extend(prefix)
                by_one = single.extend(chain)
            finally:
                self._pinned = 0
            if not torch.equal(by_one, one):
                log.warning(
                    "llama.cpp: logits depend on the thread count; threads fixed at %d",
                    self.threads,
                )
                self.share = None
        solo = self.new_cache()
        solo.extend(prefix[5:])
        apart = torch.cat([solo.extend([t]) for t in chain])
        store = KvStore(self, shared=True, cells=256)
        dead = GgufCache(self, store)
        dead.extend(prefix[:10])
        first, second = GgufCache(self, store), GgufCache(self, store)
        first.extend(prefix)
        second.extend(prefix[5:])
        del dead
        rows = []
        for step, token in enumerate(chain):
            if step == len(chain) // 2:
                store.compact()
            rows.append(
                store.run(
                    [(first, first.plan_chain([token])), (second, second.plan_chain([token]))]
                )
            )
        if store.compactions != 1 or not all(
            torch.equal(a[0], one[i]) and torch.equal(b[0], apart[i])
            for i, ((a, _), (b, _)) in enumerate(rows)
        ):
            raise RowInvarianceError("llama.cpp: a sequence in a shared context differs from alone")
