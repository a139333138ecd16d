"""Precision gguf: the real SmolLM2 GGUF through llama.cpp (``sampler.targets.llamacpp``).

The decoder's exactness (MPFR Thm. 5.1: the output does not depend on the drafter, B, L, the
tree or the batch) rests on one property of the backend: a context's logits are the same bits
whatever shares the forward. These tests check that property directly (chains, trees, other
sequences, a rebuilt cache) and then through the decoder (mpfr with either drafter and tree
``auto`` emits basic-uwm's tokens; batched requests their solo tokens). Equality is exact, so
no statistical allowance is needed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from keyed import KeyedSource, Secret
from sampler.completion import CompletionRequest, complete, complete_many, prompt_ids
from sampler.decoder import SamplerConfig
from sampler.models import DEFAULT_MODEL, load_model
from sampler.processing import Processing
from sampler.targets.llamacpp import (
    PATCHED_BUILD,
    ROW_KERNELS_BUILD,
    GgufCache,
    GgufTarget,
    RowInvarianceError,
    repacking_safe,
)
from sampler.targets.transformers import forward_many, open_cache

pytestmark = pytest.mark.realmodel


@pytest.fixture(scope="module")
def gguf_model(data_dir):  # type: ignore[no-untyped-def]
    return load_model(DEFAULT_MODEL, data_dir, device="cpu", precision="gguf")


@pytest.fixture(scope="module")
def target(gguf_model) -> GgufTarget:  # type: ignore[no-untyped-def]
    found = gguf_model.target
    assert isinstance(found, GgufTarget)
    return found


PREFIX = [(37 * i + 5) % 40000 + 100 for i in range(30)]
CHAIN = [(91 * i + 3) % 40000 + 100 for i in range(8)]


def _causal(q: int) -> torch.Tensor:
    return torch.tril(torch.ones((q, q), dtype=torch.bool))


def _tree_visible(base: int, ancestors: list[list[int]]) -> torch.Tensor:
    q = len(ancestors)
    visible = torch.ones((q, base + q), dtype=torch.bool)
    visible[:, base:] = False
    for i, seen in enumerate(ancestors):
        visible[i, base + i] = True
        for j in seen:
            visible[i, base + j] = True
    return visible


def test_auto_is_gguf_on_this_cpu(real_model) -> None:  # type: ignore[no-untyped-def]
    """llama-cpp-python is installed by scripts/setup.sh, so precision auto picks it."""
    assert real_model.precision == "gguf"
    assert isinstance(open_cache(real_model.target), GgufCache)


def test_a_chain_at_once_equals_token_by_token(target: GgufTarget) -> None:
    alone, joint = target.new_cache(), target.new_cache()
    alone.extend(PREFIX)
    joint.extend(PREFIX)
    one = torch.cat([alone.extend([t]) for t in CHAIN])
    assert torch.equal(joint.extend(CHAIN), one)
    assert alone.cached == joint.cached == len(PREFIX) + len(CHAIN)


def test_tree_nodes_and_kept_paths_equal_the_chain(target: GgufTarget) -> None:
    """A 7-node tree with the chain on its second branch: the chain's nodes get the chain's
    logits; after keeping that path (rejected cells go to the tomb) the next tokens too."""
    chain = target.new_cache()
    chain.extend(PREFIX)
    want = chain.extend(CHAIN)
    tree = target.new_cache()
    tree.extend(PREFIX)
    base = tree.cached
    other = (CHAIN[1] + 17) % 40000
    # 0 root; 1 other, 2 CHAIN[1]; 3 child of 1; 4 CHAIN[2] under 2; 5 other under 2; 6 CHAIN[3]
    tokens = [CHAIN[0], other, CHAIN[1], other, CHAIN[2], other, CHAIN[3]]
    ancestors = [[], [0], [0], [0, 1], [0, 2], [0, 2], [0, 2, 4]]
    depths = [len(a) for a in ancestors]
    logits = tree.forward(tokens, depths, _tree_visible(base, ancestors), base)
    assert torch.equal(logits[[0, 2, 4, 6]], want[:4])
    tree.keep(base, [base, base + 2, base + 4, base + 6])
    assert tree.cached == base + 4
    assert torch.equal(tree.extend(CHAIN[4:]), want[4:])


def test_other_sequences_in_one_call_change_nothing(target: GgufTarget) -> None:
    """``forward_many`` over three caches equals each one alone (one context each)."""
    caches = [target.new_cache() for _ in range(3)]
    solo = [target.new_cache() for _ in range(3)]
    for k, (a, b) in enumerate(zip(caches, solo, strict=True)):
        a.extend(PREFIX[k:])
        b.extend(PREFIX[k:])
    rows = [CHAIN[: 2 + k] for k in range(3)]
    visible = [
        torch.cat([torch.ones((len(r), c.cached), dtype=torch.bool), _causal(len(r))], dim=1)
        for r, c in zip(rows, caches, strict=True)
    ]
    together = forward_many(
        list(caches), rows, [list(range(len(r))) for r in rows], visible, [c.cached for c in caches]
    )
    for k, cache in enumerate(solo):
        assert torch.equal(together[k], cache.extend(rows[k]))


def test_a_full_context_is_rebuilt_without_changing_logits(target: GgufTarget) -> None:
    """With 64 cells the tomb fills after a few trees; the cache is rebuilt from the committed
    tokens (one causal chain) and the logits stay the chain's."""
    small = GgufTarget(target.path, threads=target.threads)
    small.context_cells = 64
    chain, tree = small.new_cache(), small.new_cache()
    chain.extend(PREFIX[:20])
    tree.extend(PREFIX[:20])
    rebuilds = 0
    for step, token in enumerate(CHAIN * 2):  # 20 + 16 x 4 cells > 64: at least one rebuild
        want = chain.extend([token])
        base, cells_before = tree.cached, tree.cells
        ancestors = [[], [0], [0], [0, 1]]
        logits = tree.forward(
            [token, 11, 12, 13], [0, 1, 1, 2], _tree_visible(base, ancestors), base
        )
        rebuilds += tree.cells < cells_before + 4
        assert torch.equal(logits[0], want[0]), f"step {step}"
        tree.keep(base, [base])
    assert rebuilds >= 1, "the tomb never filled the context: the test tests nothing"
    assert tree.tokens == chain.tokens


TREE = [[], [0], [0], [0], [0, 1], [0, 1], [0, 2], [0, 1, 4]]
"""An 8-node tree: the kept path 0-1-4-7 and four nodes for the tomb."""


def _inputs(kind: int, token: int, base: int) -> tuple[list[int], list[int], torch.Tensor]:
    """Forward ``kind``'s tokens, depths and visibility after ``base`` cached positions: 0 one
    token, 1 the 8-node ``TREE``, 2 a 2-token chain."""
    if kind == 1:
        return (
            [token, 11, 12, 13, 14, 15, 16, 17],
            [len(a) for a in TREE],
            _tree_visible(base, TREE),
        )
    q = 1 if kind == 0 else 2
    visible = torch.cat([torch.ones((q, base), dtype=torch.bool), _causal(q)], 1)
    return [token, token + 1][:q], list(range(q)), visible


def test_sequences_in_a_shared_context_equal_each_alone(target: GgufTarget) -> None:
    """Sequences in one shared context (``new_batch_cache``), stepped together by ``forward``
    (one llama.cpp decode): one-token steps, trees and chains, one sequence dying mid-way
    (its cells to the tomb), new ones joining, compactions in a context of 448 cells. Every
    row equals its twin's in a private context, bit for bit."""
    small = GgufTarget(target.path, threads=target.threads)
    small.shared_cells = 448
    twins: list[tuple[GgufCache, GgufCache]] = []

    def join(k: int) -> None:
        alone, shared = small.new_cache(), small.new_batch_cache()
        for cache in (alone, shared):
            cache.extend(PREFIX[k:] + CHAIN[:k])
        twins.append((alone, shared))

    for k in range(4):
        join(k)
    store = twins[0][1].store
    for step in range(30):
        if step == 9:
            del twins[1]  # dies with its cells in the middle of the others'
        if step in (15, 25):
            join(5 + step % 3)
        inputs = [
            _inputs((step + k) % 3, CHAIN[(step + k) % len(CHAIN)], shared.cached)
            for k, (_, shared) in enumerate(twins)
        ]
        want = [
            alone.forward(t, d, v, alone.cached)
            for (alone, _), (t, d, v) in zip(twins, inputs, strict=True)
        ]
        got = small.forward(
            [s for _, s in twins],
            [t for t, _, _ in inputs],
            [d for _, d, _ in inputs],
            [v for _, _, v in inputs],
            [s.cached for _, s in twins],
        )
        for k, ((alone, shared), logits) in enumerate(zip(twins, got, strict=True)):
            assert torch.equal(logits, want[k]), f"step {step}, sequence {k}"
            if len(inputs[k][0]) == len(TREE):
                base = shared.cached - len(TREE)
                for cache in (alone, shared):
                    cache.keep(base, [base, base + 1, base + 4, base + 7])
        assert all(a.tokens == s.tokens for a, s in twins)
        assert all(s.store is store for _, s in twins), f"step {step}: a sequence moved out"
    assert store.compactions >= 2, "the context never filled: the test tests nothing"


def test_a_shared_context_moves_out_a_sequence_it_cannot_hold(target: GgufTarget) -> None:
    """With 4 sequence ids (3 for caches: the tomb takes one) a tree of 3 leaves beside
    another sequence cannot borrow its ids: that cache moves to a context of its own (its
    cells copied) and keeps its bits; so does one longer than the shared context's cells."""
    small = GgufTarget(target.path, threads=target.threads)
    small.shared_seq_max, small.shared_cells = 4, 256
    alone = [small.new_cache() for _ in range(3)]
    shared = [small.new_batch_cache() for _ in range(3)]
    for k, (a, s) in enumerate(zip(alone, shared, strict=True)):
        a.extend(PREFIX[k:])
        s.extend(PREFIX[k:])
    store = shared[0].store
    ancestors = [[], [0], [0], [0]]  # a root and three children: three leaves
    base = shared[0].cached
    want = alone[0].forward([CHAIN[0], 1, 2, 3], [0, 1, 1, 1], _tree_visible(base, ancestors), base)
    chain = [alone[k].extend(CHAIN[:2]) for k in (1, 2)]
    got = small.forward(
        shared,
        [[CHAIN[0], 1, 2, 3], CHAIN[:2], CHAIN[:2]],
        [[0, 1, 1, 1], [0, 1], [0, 1]],
        [_tree_visible(base, ancestors)]
        + [
            torch.cat([torch.ones((2, s.cached), dtype=torch.bool), _causal(2)], 1)
            for s in shared[1:]
        ],
        [s.cached for s in shared],
    )
    assert shared[0].store is not store and shared[1].store is store
    assert torch.equal(got[0], want)
    assert all(torch.equal(got[k], chain[k - 1]) for k in (1, 2))
    shared[0].keep(base, [base, base + 2])
    alone[0].keep(base, [base, base + 2])
    assert torch.equal(shared[0].extend(CHAIN[3:5]), alone[0].extend(CHAIN[3:5]))
    long = [t % 1000 + 100 for t in range(300)]  # more than the shared context's 256 cells
    a, s = small.new_cache(), small.new_batch_cache()
    assert torch.equal(s.extend(long), a.extend(long))
    assert s.store is not store


def test_logits_do_not_depend_on_the_thread_count(target: GgufTarget) -> None:
    """The thread count follows the machine's load (``CoreShare``): a chain and a tree on one
    thread and on two give the same bits (ggml splits each operation's output rows over the
    threads; a row is summed by one thread)."""
    ancestors = [[], [0], [0], [0, 1]]
    results = []
    for threads in (1, 2):
        target._pinned = threads
        try:
            cache = target.new_cache()
            chain = cache.extend(PREFIX + CHAIN)
            base = cache.cached
            tree = cache.forward(CHAIN[:4], [0, 1, 1, 2], _tree_visible(base, ancestors), base)
            results.append((chain, tree))
        finally:
            target._pinned = 0
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_invalid_masks_and_paths_are_refused(target: GgufTarget) -> None:
    cache = target.new_cache()
    cache.extend(PREFIX[:5])
    base = cache.cached
    with pytest.raises(ValueError, match="base"):
        cache.forward([1], [0], torch.ones((1, base + 1), dtype=torch.bool), base - 1)
    not_a_tree = _tree_visible(base, [[], [0], [1]])  # token 2 sees 1 but not the root
    with pytest.raises(ValueError, match="ancestors"):
        cache.forward([1, 2, 3], [0, 1, 2], not_a_tree, base)
    cache.forward([1, 2, 3], [0, 1, 1], _tree_visible(base, [[], [0], [0]]), base)
    with pytest.raises(ValueError, match="previous draft tree"):
        cache.forward([1], [0], torch.ones((1, base + 4), dtype=torch.bool), base + 3)
    with pytest.raises(ValueError, match="root path"):
        cache.keep(base, [base + 1, base + 2])  # siblings are not a path


def _requests(model, data_files, count: int, tokens: int):  # type: ignore[no-untyped-def]
    lines = (data_files / "prompts-eli5.jsonl").read_text().splitlines()[:count]
    return [
        (prompt_ids(model, messages=json.loads(line)["messages"]),
         KeyedSource(Secret(bytes([i + 3]) * 32), 4, True, 17 * i))
        for i, line in enumerate(lines)
    ]  # fmt: skip


def test_mpfr_equals_basic_uwm_on_gguf(gguf_model, data_files) -> None:  # type: ignore[no-untyped-def]
    """Thm. 5.1 on llama.cpp: mpfr with ngram (fixed B4 L4), heads (tree auto) and pfr emit
    basic-uwm's tokens on every prompt, and heads drafts were accepted (trees shared forwards)."""
    accepted = 0
    for ids, source in _requests(gguf_model, data_files, 3, 40):
        want = complete(gguf_model, ids, SamplerConfig("basic-uwm", max_new_tokens=40), source)
        for config, drafter in (
            (SamplerConfig("mpfr", 4, 4, 40), "ngram"),
            (SamplerConfig("mpfr", 4, 4, 40, tree="auto"), "heads"),
            (SamplerConfig("mpfr", 3, 2, 40), "heads"),
        ):
            got = complete(gguf_model, ids, config, source, drafter)
            assert got.result.token_ids == want.result.token_ids, (config, drafter)
            if config.tree == "fixed" and drafter == "heads":
                accepted += sum(got.result.stats.accepted_per_level)
    assert accepted > 0


def test_batched_equals_solo_on_gguf(gguf_model, data_files) -> None:  # type: ignore[no-untyped-def]
    """Five mixed requests, three at a time: each gets exactly its solo tokens."""
    configs = [
        (SamplerConfig("mpfr", 4, 4, 24), "ngram"),
        (SamplerConfig("basic-uwm", max_new_tokens=19), None),
        (SamplerConfig("pfr", 1, 3, 24, Processing(0.8, 50, 0.95)), "heads"),
        (SamplerConfig("mpfr", 2, 2, 15, Processing(1.0, 0, 0.9), tree="auto"), "heads"),
        (SamplerConfig("ar", max_new_tokens=24), None),
    ]
    requests = [
        CompletionRequest(ids, config, source, drafter)
        for (ids, source), (config, drafter) in zip(
            _requests(gguf_model, data_files, 5, 24), configs, strict=True
        )
    ]
    batched = complete_many(gguf_model, requests, max_batch=3)
    for b, r in zip(batched, requests, strict=True):
        solo = complete(gguf_model, r.ids, r.config, r.source, r.drafter)
        assert b.result.token_ids == solo.result.token_ids, r.config


def test_eagle_on_gguf_equals_basic_uwm_solo_and_batched(gguf_model, data_files) -> None:  # type: ignore[no-untyped-def]
    """The shipped eagle head reads llama.cpp's hidden states: mpfr with it drafts trees and
    emits basic-uwm's tokens, alone and two requests at a time (one head call per level for
    both), and it accepts drafts."""
    configs = [SamplerConfig("mpfr", 4, 3, 12), SamplerConfig("mpfr", 2, 4, 12)]
    requests = [
        CompletionRequest(ids, config, source, "eagle")
        for (ids, source), config in zip(
            _requests(gguf_model, data_files, 2, 12), configs, strict=True
        )
    ]
    batched = complete_many(gguf_model, requests, max_batch=2)
    for b, r in zip(batched, requests, strict=True):
        want = complete(gguf_model, r.ids, SamplerConfig("basic-uwm", max_new_tokens=12), r.source)
        solo = complete(gguf_model, r.ids, r.config, r.source, "eagle")
        assert solo.result.token_ids == want.result.token_ids, r.config
        assert b.result.token_ids == want.result.token_ids, r.config
        assert min(solo.result.stats.drafted_per_level[:2]) > 0  # the head read hidden states
        assert solo.result.stats.accepted_per_level[0] > 0


def test_a_converted_copy_finds_its_gguf(data_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A local directory converted from an alias (its ``.complete`` names the GGUF) gets
    precision gguf too; a directory without one does not."""
    from sampler.models import gguf_source
    from sampler.targets.model_files import materialise

    converted = materialise(DEFAULT_MODEL, data_dir)
    found = gguf_source(str(converted), converted)
    assert found is not None and found.suffix == ".gguf"
    assert gguf_source(str(tmp_path), tmp_path) is None
    loaded = load_model(str(converted), data_dir, device="cpu")
    assert loaded.precision == "gguf"


def test_a_forward_longer_than_a_micro_batch_is_copied_in_place(gguf_model, monkeypatch) -> None:
    """With micro-batches of 8 tokens a 30-token chain runs as four llama.cpp decodes whose
    logits land at rows 0, 8, 16, 24 of the output: equal to the chain token by token."""
    from sampler.targets import llamacpp

    monkeypatch.setattr(llamacpp, "UBATCH", 8)
    small = GgufTarget(gguf_model.target.path)  # type: ignore[attr-defined]
    assert small.micro_batch == 8
    joint, alone = small.new_cache(), small.new_cache()
    together = joint.extend(PREFIX)
    one = torch.cat([alone.extend([t]) for t in PREFIX])
    assert together.shape == (len(PREFIX), small.vocab_size)
    assert torch.equal(together, one)


def test_position_laws_read_the_generation_backend(
    gguf_model, target: GgufTarget, data_dir
) -> None:  # type: ignore[no-untyped-def]
    """The detector's model tests read the law the keyed race sampled from: on precision
    gguf, ``position_laws`` processes llama.cpp's logits (the same bits as a decoding step's
    forward over the same context), not a float32 transformers copy's."""
    from sampler.entropy import position_laws
    from sampler.processing import process

    processing = Processing(0.7, 0, 0.95)
    laws = position_laws(gguf_model.target, CHAIN, processing, prefix=PREFIX, chunk=3)
    cache = target.new_cache()
    logits = cache.extend(PREFIX + CHAIN[:-1])[len(PREFIX) - 1 :].double()  # (T, V) -> CHAIN[t]
    support = process(logits, processing)
    own = torch.tensor(CHAIN)[:, None]
    hit = support.tokens == own
    expected = torch.where(hit, support.logp, torch.full_like(support.logp, -torch.inf))
    assert torch.equal(laws.token_logp, expected.max(dim=-1).values)
    assert torch.equal(laws.raw_rank, (logits > logits.gather(1, own)).sum(-1))
    # the transformers float32 law differs: the backends' logits are not the same numbers
    plain = load_model(DEFAULT_MODEL, data_dir, device="cpu", precision="float32")
    other = position_laws(plain.model, CHAIN, processing, prefix=PREFIX)
    assert not torch.equal(other.token_logp, laws.token_logp)


def test_the_patched_build_repacks_and_stays_row_invariant(target: GgufTarget) -> None:
    """scripts/setup.sh's build carries the AMX tile-config patch (``PATCHED_BUILD``), so the
    served target repacks its weights (AMX int8 tiles on a CPU with AMX), and a batch of 17
    tokens, which took the crashing AMX path before the patch, decodes to the same bits as
    the chain token by token. Without the patch nothing repacks."""
    import llama_cpp

    assert PATCHED_BUILD in llama_cpp.__version__, "not scripts/setup.sh's build"
    assert repacking_safe() and target.repack
    assert target.weights.endswith("+repacked") == target.repack
    chain = [(91 * i + 3) % 40000 + 100 for i in range(17)]
    alone, joint = target.new_cache(), target.new_cache()
    for cache in (alone, joint):
        cache.extend(PREFIX)
    one = torch.cat([alone.extend([t]) for t in chain])
    assert torch.equal(joint.extend(chain), one)


def test_the_built_llama_cpp_batches_rows_in_one_kernel(target: GgufTarget) -> None:
    """scripts/setup.sh's build carries the row kernels (``ROW_KERNELS_BUILD``): the loaded CPU
    backend lists the Q4_1 and Q8_0 (LM head) matrix kernels and the Q8_0 attention among its
    features, and nine sequences' one-token steps decoded together in one shared context (one
    nine-row product per layer, each row's attention beside eight other sequences' cells) equal
    each sequence stepped alone in a context of its own (one-row products) bit for bit: the
    kernels are taken for one row as for nine, with the same per-element arithmetic."""
    import llama_cpp

    from sampler.targets.cpu_features import cpu_flags

    assert ROW_KERNELS_BUILD in llama_cpp.__version__, "not scripts/setup.sh's build"
    features = llama_cpp.llama_print_system_info().decode()
    assert "Q8_0_FLASH_ATTN = 1" in features
    if not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("the matrix kernels are built for AVX2 + FMA CPUs")
    assert "Q4_1_GEMM = 1" in features
    assert "Q8_0_GEMM = 1" in features
    alone = [target.new_cache() for _ in range(9)]
    batch = [target.new_batch_cache() for _ in range(9)]
    for k, (a, b) in enumerate(zip(alone, batch, strict=True)):
        for cache in (a, b):
            cache.extend(PREFIX[k:])
    for step in range(3):
        tokens = [[CHAIN[(step + k) % len(CHAIN)]] for k in range(9)]
        want = [a.extend(t) for a, t in zip(alone, tokens, strict=True)]
        got = target.forward(
            batch,
            tokens,
            [[0]] * 9,
            [torch.ones((1, b.cached + 1), dtype=torch.bool) for b in batch],
            [b.cached for b in batch],
        )
        for k in range(9):
            assert torch.equal(got[k], want[k]), f"step {step}, sequence {k}"


def _assert_chains_equal_token_by_token(
    target: GgufTarget, chain: list[int], sizes: tuple[int, ...]
) -> None:
    """Each prefix chain[:q] (q in ``sizes``) decoded at once after ``PREFIX`` gives the bits of
    the same tokens decoded one at a time."""
    alone = target.new_cache()
    alone.extend(PREFIX)
    one = torch.cat([alone.extend([t]) for t in chain])
    for q in sizes:
        joint = target.new_cache()
        joint.extend(PREFIX)
        assert torch.equal(joint.extend(chain[:q]), one[:q]), f"{q} rows"


def test_rows_equal_one_row_at_every_pass_boundary(target: GgufTarget) -> None:
    """The row kernels (``scripts/llama-cpp-row-kernels.patch``) take a product in passes by
    column count: up to 12 (Q4_1) or 9 (Q8_0) columns a pass with 32 vector registers; with 16
    (AVX2) up to 4 columns with the sums in registers and, beyond that, passes of up to 16 with
    the sums in memory. A chain of every length at those boundaries decodes to the bits of the
    same chain token by token."""
    from sampler.targets.cpu_features import cpu_flags

    if not {"avx2", "fma"} <= cpu_flags():
        pytest.skip("the matrix kernels are built for AVX2 + FMA CPUs")
    chain = [(89 * i + 29) % 40000 + 100 for i in range(33)]
    _assert_chains_equal_token_by_token(target, chain, (2, 4, 5, 9, 10, 12, 13, 16, 17, 32, 33))


def test_repacked_rows_equal_one_row_at_every_kernel_boundary(target: GgufTarget) -> None:
    """On a CPU with AMX, the build's repacked weights take three kernels by row count
    (``scripts/llama-cpp-amx-rows.patch``): one row the one-row VNNI kernel, 2 to 32 rows the
    multi-row VNNI kernel in passes of up to 8 rows, more rows the AMX tiles. A chain of every
    length at those boundaries decodes to the bits of the same chain token by token."""
    import llama_cpp

    from sampler.targets.cpu_features import cpu_flags

    if not {"amx_int8", "avx512_vnni"} <= cpu_flags():
        pytest.skip("no AMX int8 on this CPU: nothing is repacked into AMX tiles")
    assert "AMX_VNNI_ROWS = 1" in llama_cpp.llama_print_system_info().decode()
    assert target.repack
    chain = [(97 * i + 13) % 40000 + 100 for i in range(33)]
    _assert_chains_equal_token_by_token(target, chain, (2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33))


def test_a_forward_profile_belongs_to_one_llama_cpp_build(target: GgufTarget, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Tree ``auto`` prices trees from a forward profile cached per machine fingerprint; another
    llama.cpp build (other kernels: other forward costs) must not reuse it, also one that keeps
    the version label: the build names the version and a digest of the loaded libraries, and a
    copy of those libraries with one byte changed is another build."""
    import llama_cpp

    from sampler.targets.profile import library_build, machine_fingerprint

    libraries = Path(llama_cpp.__file__).parent / "lib"
    assert target.build == library_build(llama_cpp.__version__, libraries)
    assert target.build.startswith(llama_cpp.__version__ + ":")
    copy = tmp_path / "lib"
    shutil.copytree(libraries, copy)
    assert library_build(llama_cpp.__version__, copy) == target.build
    changed = next(p for p in sorted(copy.iterdir()) if ".so" in p.name)
    changed.write_bytes(changed.read_bytes() + b"\0")
    assert library_build(llama_cpp.__version__, copy) != target.build
    here = machine_fingerprint(target)
    assert here["build"] == target.build
    built = target.build
    try:
        target.build = built + ".other"
        assert machine_fingerprint(target) != here
    finally:
        target.build = built


def test_repacking_is_switched_off_when_the_probe_fails(gguf_model, data_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``sampler.models.gguf_target`` keeps a repacked target only if the row-invariance
    probe passes on it; else it reloads without repacking (and probes that). The probe is
    made to fail for repacked targets only: the unit under test is the fallback."""
    from sampler import models

    if not repacking_safe():
        pytest.skip("llama-cpp-python is not scripts/setup.sh's patched build: nothing repacks")
    real = GgufTarget.probe
    probed: list[bool] = []

    def failing_when_repacked(self: GgufTarget) -> None:
        probed.append(self.repack)
        if self.repack:
            raise RowInvarianceError("a repacked row differs (simulated)")
        real(self)

    monkeypatch.setattr(GgufTarget, "probe", failing_when_repacked)
    found = models.gguf_target(DEFAULT_MODEL, data_dir, gguf_model.model)  # an alias: its file
    assert not found.repack and not found.weights.endswith("+repacked")
    assert probed == [True, False]  # the fallback is probed too


INTERLEAVED = """
import torch, torch.nn.functional as F
from sampler.targets.llamacpp import GgufTarget
from sampler.targets.model_files import gguf_path
from sampler.models import DEFAULT_MODEL
target = GgufTarget(gguf_path(DEFAULT_MODEL))
cache = target.new_cache()
cache.extend([(31 * i + 7) % 40000 for i in range(9)])  # AMX tiles configured on this thread
x, w = torch.randn(64, 576, dtype=torch.bfloat16), torch.randn(1536, 576, dtype=torch.bfloat16)
F.linear(x, w)  # oneDNN's bfloat16 matmul: AMX on this CPU, releases the tiles after
cache.extend([(53 * i + 11) % 40000 for i in range(9)])
assert target.repack
print("survived")
"""


def test_repacked_batches_survive_another_amx_user_on_the_thread() -> None:
    """torch's bfloat16 matmul (oneDNN, AMX on a CPU with it) between two repacked llama.cpp
    batches on one thread: with the tile configuration loaded once per thread the second
    batch died of SIGILL (oneDNN ends with tilerelease), which the session-20 fresh-clone
    suite hit. Run in a child process so a regression fails this test, not the whole run."""
    import subprocess
    import sys

    from sampler.targets.cpu_features import cpu_flags

    if "amx_int8" not in cpu_flags():
        pytest.skip("no AMX on this CPU: repacked batches use no tiles")

    run = subprocess.run(
        [sys.executable, "-c", INTERLEAVED], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "survived" in run.stdout


@pytest.mark.parametrize("hidden", [False, True], ids=["logits_only", "keep_hidden"])
def test_a_prefill_without_outputs_leaves_the_cells_of_a_full_forward(
    target: GgufTarget, hidden: bool
) -> None:
    """``GgufTarget.prefill`` decodes a prompt with no output rows (embeddings off for the
    call) and, for a cache that keeps hidden states, its last token in a second decode for its
    hidden state: alone and three caches of the shared context together (one chain of a single
    token), the next step's logits and the last hidden state are the bits a full ``extend`` of
    the same chain leaves."""
    chain = [(17 * j + 3) % 900 + 20 for j in range(90)]
    full = [target.new_cache() for _ in range(4)]
    fast = [target.new_cache(), *(target.new_batch_cache() for _ in range(3))]
    chains = [chain[:70], chain[:40], chain[25:90], chain[5:6]]  # the last: a 2-token prompt's
    for cache in full + fast:
        cache.keep_hidden = hidden
    for cache, tokens in zip(full, chains, strict=True):
        cache.extend(tokens)
    target.prefill(fast[:1], chains[:1])
    target.prefill(fast[1:], chains[1:])
    for a, b, tokens in zip(full, fast, chains, strict=True):
        assert b.cached == a.cached == len(tokens) and b.tokens == tokens
        if hidden:
            assert a.last_hidden is not None and b.last_hidden is not None
            assert torch.equal(a.last_hidden[-1], b.last_hidden[-1])
        assert torch.equal(a.extend([11]), b.extend([11]))
