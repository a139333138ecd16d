"""The eagle head's fused decoding level (``sampler.drafters.eagle_level.FastLevel``) on a tiny
random float32 Llama: in float32 it computes the head's own states, path caches and draft logits;
with 8-bit weights a law near the head's; a float32 eagle drafter uses it and stays exact (mpfr
emits basic-uwm's tokens, batched equals solo); ``EagleDrafter.support`` is the processed
``propose`` over the draft vocabulary alone."""

from __future__ import annotations

import pytest
import torch

from keyed import KeyedSource, Secret
from sampler.batch import generate_many
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import fresh_drafter
from sampler.drafters.eagle import EagleDrafter, EagleHead, new_eagle
from sampler.drafters.eagle_level import FastLevel, exact_int8_sums, int8_available
from sampler.processing import Processing, dense_logp, process
from sampler.tree import DraftTree
from tests.sampler.conftest import VOCAB, tiny_llama


@pytest.fixture(scope="module")
def target32():
    model = tiny_llama(31, dtype=torch.float32)
    with torch.no_grad():  # a final-norm gain that is not all ones, so folding it is tested
        model.model.norm.weight.copy_(
            1 + 0.5 * torch.randn(32, generator=torch.Generator().manual_seed(8))
        )
    return model


def _head(target, seed: int, tokens: torch.Tensor | None = None) -> EagleHead:
    head = new_eagle(target, "test", tokens)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return head.eval()


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret((700 + i).to_bytes(32, "little")), 4, True, i)


def _levels(run, state, embeddings):
    """States, caches and logits of three chained levels of ``run`` (advance, logits)."""
    out, past = [], None
    for embedding in embeddings:
        state, past = run[0](state, embedding, past)
        out.append((state, past, run[1](state)))
    return out


def test_the_float_level_is_the_heads_level(target32):
    """float32 fused: states, path caches and draft logits within 1e-5 of the head's at levels
    1-3 for 3 contexts (the same function, fused projections and folded norm gain)."""
    head = _head(target32, 1, torch.arange(0, VOCAB, 3))
    fast = FastLevel(head, target32, int8=False)
    g = torch.Generator().manual_seed(2)
    state = torch.randn((3, 32), generator=g)
    embeddings = [target32.model.embed_tokens(torch.tensor([5, 9, 40]) + i) for i in range(3)]
    with torch.inference_mode():
        want = _levels((head.advance, lambda s: head.draft_logits(target32, s)), state, embeddings)
        got = _levels((fast.advance, fast.draft_logits), state, embeddings)
    for (ws, wp, wl), (gs, gp, gl) in zip(want, got, strict=True):
        torch.testing.assert_close(gs, ws, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gp[0], wp[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gp[1], wp[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gl, wl, atol=1e-4, rtol=1e-4)


def test_activations_take_the_full_8_bits_only_where_the_sums_are_exact() -> None:
    """fbgemm adds byte products in int32 with AVX-512 VNNI only; elsewhere its int16 pairs
    saturate at full activation range, so the level quantises activations to 7 bits there."""
    assert exact_int8_sums(frozenset({"avx2", "fma", "avx512f", "avx512_vnni"}))
    assert not exact_int8_sums(frozenset({"avx2", "fma", "avx512f", "avx512bw"}))
    assert not exact_int8_sums(frozenset({"avx2", "fma", "avx_vnni"}))


@pytest.mark.skipif(not int8_available(torch.device("cpu")), reason="no 8-bit engine")
def test_the_8bit_level_drafts_near_the_heads_law(target32):
    """8-bit weights: at each of 3 levels over 64 contexts the law is within 0.15 of the float
    head's in mean total variation, and its most likely token agrees on >= 80 % of them (the
    shipped head measured 0.08; a bound this loose still fails on a wrong row order, a missing
    norm gain or a swapped projection, which land near 0.5-0.9). At this CPU's activation range
    (``exact_int8_sums``): on a CPU without VNNI the full 8 bits fail it (saturated sums)."""
    head = _head(target32, 3)
    fast = FastLevel(head, target32, int8=True)
    g = torch.Generator().manual_seed(5)
    state = torch.randn((64, 32), generator=g)
    embeddings = [
        target32.model.embed_tokens(torch.randint(0, VOCAB, (64,), generator=g)) for _ in range(3)
    ]
    with torch.inference_mode():
        want = _levels((head.advance, lambda s: head.draft_logits(target32, s)), state, embeddings)
        got = _levels((fast.advance, fast.draft_logits), state, embeddings)
    for (_, _, wl), (_, _, gl) in zip(want, got, strict=True):
        tv = 0.5 * (wl.softmax(-1) - gl.softmax(-1)).abs().sum(-1).mean()
        assert float(tv) <= 0.15
        assert float((wl.argmax(-1) == gl.argmax(-1)).float().mean()) >= 0.8


@pytest.mark.parametrize("int8", [False, True])
def test_a_root_level_passes_the_values_through_as_the_attention_would(target32, int8):
    """At depth 0 the level takes only the key and value projections (the softmax over a
    root's one key is exactly 1): the same states and path caches, bit for bit, as the
    attention written out, and the next level from them the same too."""
    if int8 and not int8_available(torch.device("cpu")):
        pytest.skip("no 8-bit engine")
    head = _head(target32, 4)
    fast = FastLevel(head, target32, int8=int8)
    assert fast.root_identity
    g = torch.Generator().manual_seed(6)
    state = torch.randn((5, 32), generator=g)
    embeddings = [target32.model.embed_tokens(torch.tensor([3, 8, 13, 21, 34]) + i) for i in (0, 1)]
    with torch.inference_mode():
        short = _levels((fast.advance, fast.draft_logits), state, embeddings)
        fast.root_identity = False  # the attention written out at the root too
        written = _levels((fast.advance, fast.draft_logits), state, embeddings)
    for (ss, sp, sl), (ws, wp, wl) in zip(short, written, strict=True):
        assert torch.equal(ss, ws) and torch.equal(sl, wl)
        assert torch.equal(sp[0], wp[0]) and torch.equal(sp[1], wp[1])


def test_a_float32_drafter_drafts_through_the_fast_level_and_stays_exact(target32):
    """mpfr with a float32 eagle drafter (8-bit fast level where available) emits basic-uwm's
    tokens for 6 prompts × keys at several B, L; drafts were made; batched equals solo."""
    head = _head(target32, 7, torch.arange(1, VOCAB, 2))
    drafter = EagleDrafter(head, target32, "eagle:test")
    assert drafter.fast is not None
    assert drafter.fast.int8 == int8_available(torch.device("cpu"))
    drafted, runs = 0, []
    for i, (drafts, lookahead) in enumerate([(1, 1), (1, 3), (4, 2), (4, 4), (8, 3), (2, 6)]):
        prompt = [(5 * i + 3 * j + 2) % VOCAB for j in range(2 + i % 4)]
        ref = generate(target32, prompt, SamplerConfig("basic-uwm", max_new_tokens=16), _source(i))
        config = SamplerConfig("mpfr", drafts, lookahead, 16)
        out = generate(target32, prompt, config, _source(i), fresh_drafter(drafter))
        assert out.token_ids == ref.token_ids
        drafted += sum(out.stats.drafted_per_level)
        runs.append((prompt, config, _source(i), fresh_drafter(drafter), ref.token_ids))
    assert drafted > 0
    batched = generate_many(target32, [(p, c, s, d) for p, c, s, d, _ in runs])
    assert [r.token_ids for r in batched] == [want for *_, want in runs]


@pytest.mark.parametrize(
    "processing", [Processing(), Processing(0.7, 8, 0.9), Processing(1.0, 0, 1.0)]
)
def test_support_is_the_processed_proposal_over_the_draft_vocabulary(target32, processing):
    """``support`` (processing over the draft vocabulary's columns, slots mapped back) gives
    the same dense law as ``process(propose(...))`` over all V columns, bit for bit, at levels
    1 and 2 of a tree with several nodes."""
    head = _head(target32, 9, torch.arange(0, VOCAB, 2))
    hidden = torch.randn(32, generator=torch.Generator().manual_seed(1))
    tree = DraftTree(11, 4)
    tree.add_drafts(0, [2, 6, 8])
    laws = []
    for method in ("propose", "support"):
        drafter = EagleDrafter(head, target32, "eagle:test")
        drafter.see_target_hidden(hidden)
        for level in (1, 2):
            if method == "propose":
                support = process(drafter.propose(tree, level, [11]), processing)
            else:
                support = drafter.support(tree, level, [11], processing)
            laws.append(dense_logp(support, VOCAB))
    for alone, narrow in zip(laws[:2], laws[2:], strict=True):
        assert torch.equal(alone, narrow)
        assert bool(torch.isinf(alone[:, 1::2]).all())
