"""The static-layout target (``sampler.targets.static``), on the CPU: the same code that runs
captured in CUDA graphs on a GPU, here eagerly.

- float64 weights: its Llama forward equals transformers' float64 (tree mask, GQA, RoPE, tied
  or untied head, several attention blocks, passes of R rows) within 1e-12;
- float32 weights: a context's logits are the same bits whether its token is stepped alone,
  inside a draft tree, in a later pass, or beside other sequences of other lengths; hence MPFR
  equals BASIC-UWM (Thm. 5.1) and a batched request equals the request served alone.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from keyed import KeyedSource, Secret
from sampler.autotree import tree_invariant
from sampler.targets.profile import machine_fingerprint
from sampler.targets.static import ATTENTION_BLOCK, StaticCache, StaticLlama
from sampler.targets.transformers import CachedLM, forward_many, open_cache
from tests.sampler.backend_contract import (
    SPECULATIVE_CONFIGS,
    assert_batched_equals_solo,
    assert_speculative_equals_basic_uwm,
)
from tests.sampler.conftest import VOCAB, tiny_llama
from tests.tiny_models import tied_llama

EXACT = 1e-12


def _tied_llama() -> LlamaForCausalLM:
    return tied_llama(VOCAB, attn_implementation="sdpa")


def _tree_inputs(cached: int) -> tuple[list[int], list[int], torch.Tensor]:
    """A 7-node tree (more than one pass of R = 4 rows): root, two children, a grandchild
    under each, and two great-grandchildren under the first."""
    tokens = [7, 3, 9, 12, 4, 30, 31]
    depths = [0, 1, 1, 2, 2, 3, 3]
    parents = [-1, 0, 0, 1, 2, 3, 3]
    visible = torch.zeros((7, cached + 7), dtype=torch.bool)
    visible[:, :cached] = True
    for i in range(7):
        j = i
        while j >= 0:
            visible[i, cached + j] = True
            j = parents[j]
    return tokens, depths, visible


@pytest.mark.parametrize("model", ["untied", "tied"])
def test_float64_static_target_equals_transformers(model):
    """Prefill over two attention blocks, a tree forward in two passes, a keep, one more
    token: logits and final hidden states within 1e-12 of transformers float64."""
    target = tiny_llama(5, layers=2) if model == "untied" else _tied_llama()
    static = StaticLlama(target, group_slots=2, rows=4, capacity=2 * ATTENTION_BLOCK, slots=3)
    assert static.weights == torch.float64
    ours, theirs = static.new_cache(), CachedLM(target)
    ours.keep_hidden = theirs.keep_hidden = True
    prompt = [(5 * j + 2) % VOCAB for j in range(ATTENTION_BLOCK + 11)]
    torch.testing.assert_close(ours.extend(prompt), theirs.extend(prompt), atol=EXACT, rtol=0)
    tokens, depths, visible = _tree_inputs(len(prompt))
    a = ours.forward(tokens, depths, visible, len(prompt))
    b = theirs.forward(tokens, depths, visible, len(prompt))
    torch.testing.assert_close(a, b, atol=EXACT, rtol=0)
    assert ours.last_hidden is not None and theirs.last_hidden is not None
    torch.testing.assert_close(ours.last_hidden, theirs.last_hidden, atol=EXACT, rtol=0)
    path = [len(prompt), len(prompt) + 1, len(prompt) + 3, len(prompt) + 6]
    ours.keep(len(prompt), path)
    theirs.keep(len(prompt), path)
    assert ours.cached == theirs.cached == len(prompt) + 4
    torch.testing.assert_close(ours.extend([1]), theirs.extend([1]), atol=EXACT, rtol=0)


@pytest.fixture(scope="module")
def float32_static():
    """The tiny float64 model served by a float32 static target: G = 2, R = 4 (small, so
    trees and prompts need several passes and groups)."""
    model = tiny_llama(0, layers=3)
    return StaticLlama(
        model, weights=torch.float32, group_slots=2, rows=4, capacity=2 * ATTENTION_BLOCK,
        slots=8,
    )  # fmt: skip


def test_float32_rows_do_not_depend_on_the_forward(float32_static):
    """The logits at a context: one token at a time == a tree row (second pass included) ==
    a row of a forward over three sequences (other lengths, other block counts, other group
    places) (torch.equal, not a tolerance)."""
    prompt = [(3 * j + 1) % VOCAB for j in range(9)]
    tokens, depths, visible = _tree_inputs(len(prompt))
    tree = open_cache(float32_static)
    tree.extend(prompt)
    in_tree = tree.forward(tokens, depths, visible, len(prompt))
    for node, path in ((1, [7, 3]), (4, [7, 9, 4]), (6, [7, 3, 12, 31])):
        alone = open_cache(float32_static)
        alone.extend(prompt)
        rows = [alone.extend([t]) for t in path]
        assert torch.equal(rows[-1][0], in_tree[node])
    others = []
    for length in (ATTENTION_BLOCK + 20, 4):  # two attention blocks, one
        cache = open_cache(float32_static)
        cache.extend([(7 * j + length) % VOCAB for j in range(length)])
        others.append(cache)
    mine = open_cache(float32_static)
    mine.extend(prompt)
    batched = forward_many(
        [others[0], others[1], mine],
        [[5], [8, 2], tokens],
        [[0], [0, 1], depths],
        [torch.ones((1, others[0].cached + 1), dtype=torch.bool),
         torch.ones((2, others[1].cached + 2), dtype=torch.bool).tril(others[1].cached),
         visible],
        [others[0].cached, others[1].cached, len(prompt)],
    )  # fmt: skip
    assert torch.equal(batched[2], in_tree)


def test_bucketed_block_counts_give_the_bits_of_exact_ones():
    """Windows rounded up to a power of two of blocks (3 -> 4 here) add blocks of exact zeros:
    a prompt over three blocks and a tree after it give the same logits, bit for bit, as
    with the exact count (torch.equal)."""
    seen: dict[bool, list[int]] = {True: [], False: []}
    out: dict[bool, list[torch.Tensor]] = {}
    prompt = [(11 * j + 5) % VOCAB for j in range(2 * ATTENTION_BLOCK + 20)]
    tokens, depths, visible = _tree_inputs(len(prompt))
    for buckets in (True, False):
        static = StaticLlama(
            tiny_llama(0, layers=2), weights=torch.float32, group_slots=2, rows=4,
            capacity=4 * ATTENTION_BLOCK, slots=2, buckets=buckets,
        )  # fmt: skip
        run = static._run_group

        def spy(blocks: int, run=run, seen=seen[buckets]):  # type: ignore[no-untyped-def]
            seen.append(blocks)
            return run(blocks)

        static._run_group = spy  # type: ignore[method-assign]
        cache = static.new_cache()
        out[buckets] = [cache.extend(prompt), cache.forward(tokens, depths, visible, len(prompt))]
    assert max(seen[False]) == 3 and max(seen[True]) == 4
    assert set(seen[True]) <= {1, 2, 4}
    for bucketed, exact in zip(out[True], out[False], strict=True):
        assert torch.equal(bucketed, exact)


def test_a_group_sends_only_its_mask_window():
    """The host builds and copies only the window of the mask a group forward reads: columns
    past it keep whatever they held (here a sentinel of True everywhere, which would let every
    row see every column if it were read), and the logits equal a target whose whole mask was
    rewritten each group (torch.equal)."""
    prompt = [(7 * j + 3) % VOCAB for j in range(ATTENTION_BLOCK + 9)]  # two blocks
    tokens, depths, visible = _tree_inputs(len(prompt))
    out = []
    for sentinel in (False, True):
        static = StaticLlama(
            tiny_llama(0, layers=2), weights=torch.float32, group_slots=2, rows=4,
            capacity=8 * ATTENTION_BLOCK, slots=2,
        )  # fmt: skip
        past = static.inputs.mask[:, :, 2 * ATTENTION_BLOCK :]
        with torch.inference_mode():
            past.fill_(sentinel)
        cache = static.new_cache()
        out.append([cache.extend(prompt), cache.forward(tokens, depths, visible, len(prompt))])
        assert bool(past.all()) if sentinel else not bool(past.any())
        assert static.staging.mask.device.type == "cpu"
    for window_only, whole in zip(out[1], out[0], strict=True):
        assert torch.equal(window_only, whole)


def test_a_forward_of_many_groups_copies_its_logits_to_the_host_once():
    """Three sequences over two group slots, one of them in two passes of R rows: three group
    forwards, one device-to-host copy, and each sequence's logits those of its solo forward
    (torch.equal)."""
    static = StaticLlama(
        tiny_llama(0, layers=2), weights=torch.float32, group_slots=2, rows=4,
        capacity=4 * ATTENTION_BLOCK, slots=6,
    )  # fmt: skip
    prompts = [[(5 * i + 3 * j + 1) % VOCAB for j in range(n)] for i, n in enumerate((6, 3, 2))]
    solo = [static.new_cache().extend(prompt) for prompt in prompts]
    caches = [static.new_cache() for _ in prompts]
    groups, copies = static.group_forwards, static.host_copies
    together = static.forward(
        caches, prompts, [list(range(len(p))) for p in prompts],
        [torch.ones(len(p), len(p), dtype=torch.bool).tril() for p in prompts], [0, 0, 0],
    )  # fmt: skip
    assert static.group_forwards - groups == 3 and static.host_copies - copies == 1
    for alone, batched in zip(solo, together, strict=True):
        assert torch.equal(alone, batched)


def test_a_prefill_copies_no_logits_to_the_host():
    """``prefill`` (a prompt's chain, logits unread) sends nothing to the host, keeps the
    hidden states, and the next forward's logits equal those after a prefill by ``extend``
    (torch.equal)."""
    static = StaticLlama(
        tiny_llama(0, layers=2), weights=torch.float32, group_slots=2, rows=4,
        capacity=4 * ATTENTION_BLOCK, slots=4,
    )  # fmt: skip
    prompts = [[(3 * i + 7 * j + 2) % VOCAB for j in range(n)] for i, n in enumerate((9, 5))]
    by_extend = [static.new_cache() for _ in prompts]
    for cache, prompt in zip(by_extend, prompts, strict=True):
        cache.extend(prompt)
    by_prefill = [static.new_cache() for _ in prompts]
    for cache in by_prefill:
        cache.keep_hidden = True
    copies = static.host_copies
    static.prefill(by_prefill, prompts)
    assert static.host_copies == copies
    for cache, prompt, other in zip(by_prefill, prompts, by_extend, strict=True):
        assert cache.cached == len(prompt) and cache.forward_calls == 1
        assert cache.last_hidden is not None and cache.last_hidden.shape[0] == len(prompt)
        assert torch.equal(cache.extend([5, 6]), other.extend([5, 6]))


def test_every_forward_runs_a_window_capture_windows_captures():
    """The windows captured up front (powers of two of blocks, and the capacity's blocks)
    cover every block count a forward can ask for, at every length up to the capacity."""
    static = StaticLlama(
        tiny_llama(0, layers=1), weights=torch.float32, group_slots=2, rows=4,
        capacity=38 * ATTENTION_BLOCK, slots=2,
    )  # fmt: skip
    assert static.windows() == [1, 2, 4, 8, 16, 32, 38]
    needed = {static._blocks_needed([0], 0, [start], [1]) for start in range(static.capacity)}
    assert needed == set(static.windows())
    assert static.capture_windows() < 1.0  # no graphs on the CPU: nothing to capture
    static.buckets = False
    assert static.windows() == list(range(1, 39))


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret((700 + i).to_bytes(32, "little")), 4, True, i)


@pytest.mark.parametrize("config", SPECULATIVE_CONFIGS)
def test_float32_mpfr_equals_basic_uwm(float32_static, config):
    """Thm. 5.1 on the static target: MPFR/PFR emit BASIC-UWM's tokens, drafter by drafter."""
    assert_speculative_equals_basic_uwm(float32_static, config, _source)


def test_float32_batched_equals_solo(float32_static):
    """Continuous batching on the static target: every request's ids equal its solo run."""
    assert_batched_equals_solo(float32_static, _source, max_batch=5, node_budget=32)


def test_the_static_target_is_a_tree_invariant_backend(float32_static, target):
    assert isinstance(open_cache(float32_static), StaticCache)
    assert tree_invariant(float32_static)
    assert "static" in machine_fingerprint(float32_static)["backend"]
    with pytest.raises(ValueError, match="same backend"):
        forward_many(
            [open_cache(float32_static), open_cache(target)],
            [[1], [1]], [[0], [0]],
            [torch.ones((1, 1), dtype=torch.bool)] * 2, [0, 0],
        )  # fmt: skip


def test_the_static_target_refuses_what_it_cannot_run(target):
    with pytest.raises(ValueError, match="bfloat16, float32 or float64"):
        StaticLlama(target, weights=torch.float16)
    with pytest.raises(ValueError, match="multiple of"):
        StaticLlama(target, capacity=100)
    with pytest.raises(ValueError, match="CUDA graphs"):
        StaticLlama(target, graphs=True, device="cpu")
    static = StaticLlama(target, rows=2, capacity=ATTENTION_BLOCK, slots=1)
    cache = static.new_cache()
    with pytest.raises(ValueError, match=r"expected visible of shape \(1, 1\)"):
        cache.forward([1], [0], torch.ones((1, 2), dtype=torch.bool), 0)
    with pytest.raises(ValueError, match="capacity of 128"):
        cache.extend([1] * (ATTENTION_BLOCK + 1))
    with pytest.raises(ValueError, match="token ids"):
        cache.extend([VOCAB])
    with pytest.raises(RuntimeError, match="all 1 slots"):
        static.new_cache()
    seen_ahead = torch.ones((3, 3), dtype=torch.bool)  # token 0 sees token 2, a later pass
    with pytest.raises(ValueError, match="later token"):
        cache.forward([1, 2, 3], [0, 1, 2], seen_ahead, 0)
    del cache  # its slot is free again
    assert static.new_cache().slot == 0
