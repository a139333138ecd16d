"""The target on llama.cpp: the GGUF file's own quantised weights (precision ``gguf``).

``GgufTarget`` runs the shipped GGUF (SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding/LM
head) through ``llama-cpp-python``'s low-level API behind the interface the decoder uses for
every target (``forward``/``extend``/``keep`` over a KV cache, ``sampler.cached_lm``). The keyed
race, the draft tree and the detector stay ours; llama.cpp only gives logits.

Drafter invariance (MPFR Thm. 5.1: the output must not depend on B, L or the batch) needs a
context's logits to be the same bits whatever shares the forward. llama.cpp gives that here
only with these settings, each measured (``probe``, run at load, refuses the backend when it
fails):

- **flash attention with a Q8_0 KV cache**: with an F16/F32 cache the CPU kernel switches to
  a KV-split path for one-token batches (>= 512 cells) and a tiled path for >= 64 query rows,
  whose reductions differ (logits moved by up to 0.7 between a row alone and in a batch); with a
  quantised cache every batch takes the one per-cell path, which skips masked cells and
  accumulates the visible ones in cell order;
- **cells in position order**: the per-cell accumulation depends on the order of the visible
  cells, so a sequence's new cells must come after all its old ones. llama.cpp fills freed
  cells first; rejected tree nodes are therefore never freed but handed to a tomb sequence no
  query reads (``TOMB``), and when the context fills the cache is rebuilt from the committed
  tokens as one causal chain (a chain evaluated at once equals it evaluated token by token);
- **one context per sequence** (its own KV cache): cells freed by other requests would
  otherwise be reused out of order. Batching across requests gains nothing here anyway: on
  the 2-core EPYC measured a q-token forward costs ~q times a one-token one (Q4_1 has no
  batched kernel on x86), ``bench/results/speed_cpu_gguf.json``.

Tree attention maps to llama.cpp's sequence ids: a query token sees the cells that carry its
FIRST sequence id and a position <= its own. Each leaf of the draft tree is a sequence; a node
carries the leaves under it (first: one of them) so it sees exactly its ancestors and itself;
committed cells carry every sequence in use.

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

from sampler.target import Target

log = logging.getLogger("poissonmark.gguf")

__all__ = [
    "GgufCache",
    "GgufTarget",
    "GgufUnavailable",
    "RowInvarianceError",
    "available",
    "repacking_safe",
]

MAX_LEAVES = 64
"""Leaves of one draft tree = sequence ids in use per context (``sampler.methods.MAX_DRAFTS``)."""
TOMB = MAX_LEAVES
"""The sequence id that holds rejected tree nodes' cells: occupied, read by no query."""
UBATCH = 512
"""Tokens per llama.cpp micro-batch (a longer forward runs as several, same results)."""
CONTEXT_CELLS = 8192
"""KV cells per sequence's context (capped at the model's training context): ~100 MB in Q8_0
for SmolLM2-135M."""

_backend_lock = threading.Lock()
_backend_ready = False


class GgufUnavailable(RuntimeError):
    """``llama-cpp-python`` is not installed (``pip install 'poissonmark[gguf]'``, built by
    ``scripts/setup.sh``) or the model has no GGUF file."""


class RowInvarianceError(RuntimeError):
    """llama.cpp gave a context different logits alone and inside a larger batch or tree on
    this machine, so precision ``gguf`` could not keep outputs drafter-invariant."""


def available() -> bool:
    """Whether ``llama_cpp`` imports (without loading a model)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


PATCHED_BUILD = "+poissonmark.amx2"
"""The local version label ``scripts/setup.sh`` gives its llama-cpp-python build, which carries
``scripts/llama-cpp-amx-tilecfg.patch``: without it, with GCC 12, ggml's AMX kernels load a
garbage tile configuration and the process dies (SIGSEGV/SIGILL) on the first batch of >= 2
tokens, which no probe can catch; the earlier ``amx1`` patch loaded it once per
thread, and died after another AMX user (torch's oneDNN bfloat16 matmul) released the tiles."""


def repacking_safe() -> bool:
    """Whether llama.cpp's weight repacking into its extra CPU buffer types (AMX tiles where the
    CPU has them) can be switched on: the installed llama-cpp-python is ``scripts/setup.sh``'s
    patched build (``PATCHED_BUILD`` in its version). False when llama_cpp does not import."""
    try:
        import llama_cpp
    except ImportError:
        return False
    return PATCHED_BUILD in str(getattr(llama_cpp, "__version__", ""))


def _lib() -> Any:
    global _backend_ready
    try:
        import llama_cpp
    except ImportError as exc:
        raise GgufUnavailable(
            "precision gguf needs llama-cpp-python (scripts/setup.sh builds it for this CPU)"
        ) from exc
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p())
            _backend_ready = True
    return llama_cpp


def _quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == 3:  # GGML_LOG_LEVEL_ERROR (0 none, 1 info, 2 warn, 4 debug, 5 cont)
        log.error("llama.cpp: %s", text.decode(errors="replace").rstrip())


def _make_quiet() -> Any:
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.llama_log_callback(_quiet)


_QUIET = _make_quiet()  # kept alive for the process: llama.cpp holds the pointer


def cpu_threads() -> int:
    """Threads for llama.cpp: the CPUs this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


class GgufTarget(Target):
    """A GGUF model loaded once into llama.cpp; ``new_cache`` gives each sequence a context.

    Its ``model`` (``Target.model``: the transformers copy of the same weights, for the
    config and the drafters) is set by the loader (``sampler.models.gguf_target``).

    Attributes:
        path: the GGUF file.
        vocab_size: V, llama.cpp's vocabulary (logits width).
        context_cells: KV cells per sequence.
        weights: the file's dominant tensor type, e.g. ``"gguf:Q4_1"``, with ``"+repacked"``
            when ``repack`` (machine fingerprint: the step costs differ).
        threads: llama.cpp threads per forward.
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
        if not path.is_file():
            raise FileNotFoundError(path)
        self.path = path
        self.threads = threads or cpu_threads()
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
        self._free: list[Any] = []  # idle contexts, reused by new caches
        self._lock = threading.Lock()
        self.hidden_size = int(self.lib.llama_model_n_embd(self.handle))
        self.invariant = True  # measured per machine by ``probe`` (sampler.models.gguf_target)
        # the detector's model tests: llama.cpp's decode calls share one lock with the
        # generation steps of the same model; 32 rows hold it ~0.2-0.3 s (2 CPU cores), not
        # the ~1 s of 128 rows with their logits
        self.rows_per_call = 32
        self._batch = self.lib.llama_batch_init(UBATCH, 0, MAX_LEAVES + 1)
        self._decoding = threading.Lock()  # one shared batch buffer

    def __del__(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        for ctx in getattr(self, "_free", []):
            lib.llama_free(ctx)
        if getattr(self, "_batch", None) is not None:
            lib.llama_batch_free(self._batch)
        if getattr(self, "handle", None):
            lib.llama_model_free(self.handle)

    def _context(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
        params = self.lib.llama_context_default_params()
        params.n_ctx = self.context_cells
        params.n_batch = self.micro_batch
        params.n_ubatch = self.micro_batch
        params.n_outputs_max = max(self.micro_batch, MAX_LEAVES + 1)  # asserted >= n_seq_max
        params.n_seq_max = MAX_LEAVES + 1
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

    def _release(self, ctx: Any) -> None:
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
        """An empty KV cache (its own llama.cpp context) for one sequence."""
        return GgufCache(self)

    def forward(
        self,
        caches: list[GgufCache],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
    ) -> list[torch.Tensor]:
        """``GgufCache.forward`` for R sequences, one after another (one context each; a
        q-token forward costs ~q one-token ones here, so one call would gain nothing).

        Returns:
            R tensors of (q_r, V) float32 logits.
        """
        return [
            cache.forward(t, d, v, b)
            for cache, t, d, v, b in zip(caches, tokens, depths, visible, bases, strict=True)
        ]

    def decode(
        self, ctx: Any, rows: list[tuple[int, int, list[int]]], hidden: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Decode ``rows`` (token, position, sequence ids; the first id is the one the token's
        attention reads) in micro-batches of ``micro_batch``.

        Returns:
            (len(rows), V) float32 logits and, with ``hidden``, the (len(rows), d) float32
            final normed hidden states (llama.cpp's ``result_norm``), else None.

        Raises:
            RuntimeError: llama.cpp's decode failed (no KV slot, or an error code).
        """
        vocab = self.vocab_size
        out = np.empty((len(rows), vocab), dtype=np.float32)
        states = np.empty((len(rows), self.hidden_size), dtype=np.float32) if hidden else None
        with self._decoding:
            step = self.micro_batch
            for start in range(0, len(rows), step):
                self._decode_part(ctx, rows[start : start + step], start, out, states)
        return out, states

    def _decode_part(
        self,
        ctx: Any,
        part: list[tuple[int, int, list[int]]],
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
            batch.logits[i] = 1
        code = lib.llama_decode(ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama.cpp decode failed (code {code})")
        # one memmove each into the C-contiguous outputs: np.ctypeslib.as_array builds a new
        # ctypes array type per call, 77 µs a token right after a forward (AMD EPYC, one-off)
        # against ~30 µs for the copy itself
        rows, logits = len(part), lib.llama_get_logits(ctx)
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
        the chain's. ~0.5 s.

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


class GgufCache:
    """One sequence's KV cache on a ``GgufTarget`` (``CachedLM``'s interface).

    Attributes:
        cached: P, the number of committed positions in the cache.
        forward_calls: forwards so far (prefill included).
        tokens: the P committed token ids (to rebuild the cache when it fills).
        keep_hidden: when set, ``last_hidden`` holds the latest forward's (q, d) float32
            final normed hidden states (what transformers' last hidden state is).
    """

    def __init__(self, target: GgufTarget) -> None:
        self.target = target
        self.runner = target
        self.ctx = target._context()
        self.mem = target.lib.llama_get_memory(self.ctx)
        self.cached = 0
        self.forward_calls = 0
        self.tokens: list[int] = []
        self.keep_hidden = False
        self.last_hidden: torch.Tensor | None = None
        self.sequences = 1  # sequence ids 0..sequences-1 are on every committed cell
        self.cells = 0  # occupied cells: committed + pending tree + tomb
        self._pending: _Pending | None = None

    def __del__(self) -> None:
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            self.target._release(ctx)

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
        q, p = len(tokens), self.cached
        if self._pending is not None and not self._pending.chain:
            raise ValueError("keep() the previous draft tree's path before the next forward")
        if base != p or visible.shape != (q, p + q) or len(depths) != q:
            raise ValueError(
                f"expected base {p} and visible of shape ({q}, {p + q}), got base {base} and "
                f"{tuple(visible.shape)}"
            )
        if q == 0:
            return torch.empty((0, self.target.vocab_size))
        if not bool(visible[:, :p].all()):
            raise ValueError("every new token must see the whole cache")
        parents = _tree_parents(visible[:, p:].numpy(), depths)
        leaf_of, seqs_of = _sequences(parents)
        if len(set(leaf_of)) > MAX_LEAVES:
            raise ValueError(f"a draft tree has at most {MAX_LEAVES} leaves")
        if p + q > self.target.context_cells:
            raise ValueError(f"{p + q} positions exceed the context of {self.target.context_cells}")
        self._grow_sequences(max(leaf_of) + 1)
        chain = all(parent == i - 1 for i, parent in enumerate(parents))
        every = list(range(self.sequences))
        rows = [
            (token, base + depth, every if chain else seqs_of[i])
            for i, (token, depth) in enumerate(zip(tokens, depths, strict=True))
        ]
        return self._run(rows, _Pending(base, list(tokens), parents, leaf_of, chain))

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Causal forward of a token chain after the cache, all of it kept; (q, V) logits.

        ``forward`` over the chain's mask, without building or checking one: a decoding step
        of one token comes here (``sampler.loop.verify_tree``), where the mask and tree checks
        cost ~0.1 ms a token after a llama.cpp forward (one-off timing). Same rows, same bits.
        """
        q, p = len(tokens), self.cached
        if self._pending is not None and not self._pending.chain:
            raise ValueError("keep() the previous draft tree's path before the next forward")
        if q == 0:
            return torch.empty((0, self.target.vocab_size))
        if p + q > self.target.context_cells:
            raise ValueError(f"{p + q} positions exceed the context of {self.target.context_cells}")
        every = list(range(self.sequences))
        rows = [(token, p + i, every) for i, token in enumerate(tokens)]
        parents = list(range(-1, q - 1))
        return self._run(rows, _Pending(p, list(tokens), parents, [0] * q, True))

    def _run(self, rows: list[tuple[int, int, list[int]]], pending: _Pending) -> torch.Tensor:
        """Decode ``rows`` (the new tokens of ``pending``) and record them; (q, V) logits."""
        q = len(rows)
        if self.cells + q > self.target.context_cells:
            self._rebuild()
        logits, hidden = self.target.decode(self.ctx, rows, self.keep_hidden)
        if hidden is not None:
            self.last_hidden = torch.from_numpy(hidden)
        self.cells += q
        self.forward_calls += 1
        self.cached = pending.base + q
        if pending.chain:
            self.tokens.extend(pending.tokens)
        self._pending = pending
        return torch.from_numpy(logits)

    def keep(self, prefix: int, slots: list[int]) -> None:
        """Keep positions [0, prefix) and then the cached positions ``slots`` (increasing).

        After a draft tree (slot ``P + i`` = its token i) ``prefix`` must be that P and
        ``slots`` a path from its root; otherwise ``slots`` must continue the prefix
        (``prefix, prefix + 1, ...``): the positions after them are dropped.

        Raises:
            ValueError: other slots.
        """
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
            raise ValueError(f"keep({prefix}, {slots}) is not a root path of the latest tree")
        lib, mem, depth = self.target.lib, self.mem, len(nodes)
        # every tree cell joins the tomb (stays occupied: llama.cpp refills freed cells
        # first, which would put later tokens before the kept ones), then the live
        # sequences keep only the path
        for seq in range(self.sequences):
            lib.llama_memory_seq_cp(mem, seq, TOMB, base, -1)
        kept = pending.leaf_of[nodes[-1]] if nodes else 0
        for seq in range(self.sequences):
            lib.llama_memory_seq_rm(mem, seq, base + (depth if seq == kept else 0), -1)
        if depth:
            for seq in range(self.sequences):
                if seq != kept:
                    lib.llama_memory_seq_cp(mem, kept, seq, base, base + depth)
        self.tokens[base:] = [pending.tokens[node] for node in nodes]
        self.cached = base + depth

    def _drop_after(self, end: int) -> None:
        """Drop the committed positions from ``end`` on. Their cells are the last ones the
        sequence's live cells use (cells follow positions), so freeing them keeps the order."""
        if end == self.cached:
            return
        for seq in range(self.sequences):
            self.target.lib.llama_memory_seq_rm(self.mem, seq, end, -1)
        self.cells -= self.cached - end
        del self.tokens[end:]
        self.cached = end

    def _grow_sequences(self, needed: int) -> None:
        """Put sequence ids up to ``needed`` on every committed cell (they all carry 0)."""
        for seq in range(self.sequences, needed):
            self.target.lib.llama_memory_seq_cp(self.mem, 0, seq, -1, -1)
        self.sequences = max(self.sequences, needed)

    def _rebuild(self) -> None:
        """Clear the context and decode the committed tokens again as one causal chain:
        the tomb's cells are freed and the logits of later steps are unchanged (a chain at
        once equals it token by token, ``GgufTarget.probe``)."""
        self.target.lib.llama_memory_clear(self.mem, True)
        every = list(range(self.sequences))
        if self.tokens:
            self.target.decode(self.ctx, [(t, i, every) for i, t in enumerate(self.tokens)])[0]
        self.cells = len(self.tokens)
        self.cached = len(self.tokens)


class _Pending:
    """The latest forward's tree, until ``keep``."""

    def __init__(
        self, base: int, tokens: list[int], parents: list[int], leaf_of: list[int], chain: bool
    ) -> None:
        self.base, self.tokens, self.parents, self.leaf_of, self.chain = (
            base, tokens, parents, leaf_of, chain,
        )  # fmt: skip


def _tree_parents(new: np.ndarray, depths: list[int]) -> list[int]:
    """Parents (-1 for the root) of q new tokens whose (q, q) visibility ``new`` must be
    "ancestor or self" of a tree rooted at token 0 with parents before children.

    Raises:
        ValueError: ``new`` or ``depths`` is not such a tree.
    """
    q = len(depths)
    parents = [-1] * q
    if depths[0] != 0 or not new[0, 0] or new[0, 1:].any():
        raise ValueError("token 0 must be the tree's root (depth 0, seeing only itself)")
    for i in range(1, q):
        row = new[i]
        seen = np.flatnonzero(row[:i])
        if not row[i] or row[i + 1 :].any() or not len(seen):
            raise ValueError(f"token {i} must see itself and its ancestors, none after it")
        parent = int(seen[-1])
        if (
            depths[i] != depths[parent] + 1
            or not np.array_equal(row[:parent], new[parent, :parent])
            or len(seen) != depths[i]
        ):
            raise ValueError(f"token {i}'s visibility is not its ancestors' plus itself")
        parents[i] = parent
    return parents


def _sequences(parents: list[int]) -> tuple[list[int], list[list[int]]]:
    """Sequence ids of a tree: leaf k (in node order) is sequence k; each node gets one leaf
    under it first (the one its attention reads) and then every other leaf under it."""
    q = len(parents)
    children = [0] * q
    for parent in parents[1:]:
        children[parent] += 1
    leaves = [i for i in range(q) if children[i] == 0]
    under: list[list[int]] = [[] for _ in range(q)]
    for seq, leaf in enumerate(leaves):
        node = leaf
        while node != -1:
            under[node].append(seq)
            node = parents[node]
    leaf_of = [seqs[0] for seqs in under]
    return leaf_of, under
