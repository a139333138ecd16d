"""Continuous batching (``sampler.batch``) on float64 tiny Llamas: every request's
token ids equal the same request served alone, with mixed prompt lengths, methods, keys,
processing, B, L and drafters in one batch, requests joining and leaving between steps."""

from __future__ import annotations

import pytest
import torch

import sampler.batch
import sampler.loop
from keyed import KeyedSource, Secret
from sampler.batch import Batch, generate_many, step_many
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import (
    FixedTokenDrafter,
    ModelDrafter,
    NgramDrafter,
    fresh_drafter,
    self_drafter,
)
from sampler.drafters.heads import HeadsDrafter, new_heads
from sampler.loop import start, step
from sampler.processing import Processing
from sampler.targets.base import Target
from sampler.targets.transformers import CachedLM, forward_many
from tests.sampler.conftest import VOCAB


def _source(i: int, nonce: int = 0) -> KeyedSource:
    return KeyedSource(Secret((500 + i).to_bytes(32, "little")), 4, True, nonce)


def _heads(target, lookahead: int, seed: int) -> HeadsDrafter:
    heads = new_heads(target, lookahead)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return HeadsDrafter(heads.eval(), target, "heads")


def _prompt(i: int) -> list[int]:
    return [(11 * i + 5 * j + 1) % VOCAB for j in range(1 + (3 * i) % 9)]  # 1..9 tokens


def _mixed_requests(target, other):
    """(prompt, config, source, drafter prototype) for 14 requests of every comparable kind
    (``*-nowm`` draw a fresh secret per run by design, so they have no solo twin to equal)."""
    heads = _heads(target, 4, 7)
    makers = [
        lambda: ModelDrafter(other, VOCAB, "other"),
        lambda: self_drafter(target, 1),
        lambda: NgramDrafter(VOCAB),
        lambda: FixedTokenDrafter(VOCAB, 9),
        lambda: heads,
    ]
    plain, warm = Processing(), Processing(0.7, 20, 0.9)
    rows = [
        ("mpfr", 4, 3, 14, plain),
        ("mpfr", 2, 4, 9, warm),
        ("basic-uwm", 1, 1, 11, plain),
        ("pfr", 1, 4, 13, warm),
        ("ar", 1, 1, 8, warm),
        ("vsps", 1, 3, 12, plain),
        ("gls", 3, 2, 10, plain),
        ("mpfr", 8, 2, 16, Processing(1.3, 0, 0.95)),
        ("mpfr", 1, 1, 5, plain),
        ("pfr", 1, 2, 12, plain),
        ("gls", 2, 3, 9, warm),
        ("vsps", 1, 2, 7, warm),
        ("mpfr", 4, 4, 15, Processing(0.0, 0, 1.0)),  # greedy
        ("basic-uwm", 1, 1, 6, warm),
    ]
    out = []
    for i, (method, b, lookahead, n, processing) in enumerate(rows):
        config = SamplerConfig(method, b, lookahead, n, processing)
        drafter = makers[i % len(makers)]() if config.speculative else None
        out.append((_prompt(i), config, _source(i % 5, nonce=i), drafter))
    return out


def _solo(target, requests):
    return [
        generate(target, p, c, s, fresh_drafter(d) if d is not None else None)
        for p, c, s, d in requests
    ]


def _batched(target, requests, **kwargs):
    own = [(p, c, s, fresh_drafter(d) if d is not None else None) for p, c, s, d in requests]
    return generate_many(target, own, **kwargs)


@pytest.mark.parametrize("max_batch", [None, 5])
def test_batched_equals_solo_mixed(target, other_drafter_model, max_batch, monkeypatch):
    """All 14 at once, and at most 5 at a time (the rest join as others finish): token ids,
    finish reasons and the step counters equal the solo runs (same trees, same forwards)."""
    requests = _mixed_requests(target, other_drafter_model)
    solo = _solo(target, requests)
    rows: list[int] = []

    def counting(lms, *args):
        rows.append(len(lms))
        return forward_many(lms, *args)

    monkeypatch.setattr(sampler.batch, "forward_many", counting)
    batched = _batched(target, requests, max_batch=max_batch)
    assert max(rows) == (max_batch or len(requests))  # one forward over all active requests
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    assert [r.finish_reason for r in batched] == [r.finish_reason for r in solo]
    for b, s in zip(batched, solo, strict=True):
        assert b.stats.target_forward_passes == s.stats.target_forward_passes
        assert b.stats.accepted_per_level == s.stats.accepted_per_level
        assert b.stats.drafted_per_level == s.stats.drafted_per_level
    assert sum(sum(r.stats.accepted_per_level) for r in solo) > 0  # speculation happened
    assert len({len(r.token_ids) for r in solo}) > 3  # the requests leave at different steps


def test_joiners_prefill_in_one_forward(target, other_drafter_model, monkeypatch):
    """The requests that join together prefill in ONE target forward (``loop.start_many``),
    prompts of 1 token (nothing to prefill) left out, heads drafters fed their own rows of
    its hidden states; the outputs still equal the solo runs."""
    requests = _mixed_requests(target, other_drafter_model)
    solo = _solo(target, requests)
    prefills: list[list[int]] = []

    prefill = Target.prefill

    def counting(self, lms, chains):
        prefills.append([len(t) for t in chains])
        return prefill(self, lms, chains)

    monkeypatch.setattr(Target, "prefill", counting)
    batched = _batched(target, requests)
    assert prefills == [[len(p) - 1 for p, *_ in requests if len(p) > 1]]
    assert len(set(prefills[0])) > 1  # mixed prompt lengths in the one forward
    assert any(isinstance(d, HeadsDrafter) for *_, d in requests)
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]


def test_prefill_groups_bound_the_padded_size():
    """Joint prefills split so that rows x longest chain stays within the bound (the batched
    forward's logits and attention grow with it); a chain over the bound runs alone."""
    from sampler.loop import prefill_groups

    chains = [(None, [0] * n) for n in (3, 5, 2, 9, 1, 4)]
    groups = prefill_groups(chains, padded=12)  # type: ignore[arg-type]
    assert [[len(c) for _, c in g] for g in groups] == [[3, 5], [2], [9], [1, 4]]  # greedy
    assert [len(c) for g in groups for _, c in g] == [3, 5, 2, 9, 1, 4]  # order kept
    assert all(len(g) * max(len(c) for _, c in g) <= 12 for g in groups)
    assert prefill_groups([(None, [0] * 20)], padded=12) == [[(None, [0] * 20)]]  # type: ignore[list-item]


def test_eos_and_stops_per_request(target):
    """Each request stops at its own EOS / budget: an EOS that is only one request's ends
    that one alone."""
    requests = [
        (_prompt(i), SamplerConfig("mpfr", 2, 3, 20), _source(i), NgramDrafter(VOCAB))
        for i in range(4)
    ]
    solo_free = _solo(target, requests)
    eos = frozenset({solo_free[1].token_ids[4]})
    solo = [generate(target, p, c, s, fresh_drafter(d), eos_ids=eos) for p, c, s, d in requests]
    batched = _batched(target, requests, eos_ids=eos)
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    assert "eos" in {r.finish_reason for r in solo}
    assert "length" in {r.finish_reason for r in solo}


def test_node_budget_keeps_keyed_output_and_shrinks_trees(target, other_drafter_model):
    """Thm. 5.1: the keyed race's output is invariant of B and ℓ, so a node budget that shrinks
    the trees of a large batch changes no token; the trees did shrink (fewer drafted nodes,
    more forwards), and vsps/gls (whose output depends on the tree) are never capped."""
    requests = _mixed_requests(target, other_drafter_model)
    solo = _solo(target, requests)
    batched = _batched(target, requests, node_budget=24)
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    keyed = [i for i, (_, c, _, _) in enumerate(requests) if c.method in ("mpfr", "pfr")]
    assert any(
        sum(batched[i].stats.drafted_per_level) < sum(solo[i].stats.drafted_per_level)
        for i in keyed
    )
    for i, (_, c, _, _) in enumerate(requests):
        if c.method in ("vsps", "gls"):
            assert batched[i].stats.drafted_per_level == solo[i].stats.drafted_per_level


def test_a_budget_under_two_nodes_a_request_steps_one_token(target, other_drafter_model):
    """A node budget of one node per request: every keyed-race request steps one token at a
    time (nothing drafted while batched), the same tokens as alone."""
    requests = _mixed_requests(target, other_drafter_model)
    keyed = [i for i, (_, c, _, _) in enumerate(requests) if c.method in ("mpfr", "pfr")]
    solo = _solo(target, requests)
    batched = _batched(target, requests, node_budget=len(requests))
    assert [r.token_ids for r in batched] == [r.token_ids for r in solo]
    assert sum(sum(solo[i].stats.drafted_per_level) for i in keyed) > 0
    drafted = [sum(batched[i].stats.drafted_per_level) for i in keyed]
    # a request drafts again only once it steps alone (the others finished)
    assert min(drafted) == 0 and sum(drafted) < sum(
        sum(solo[i].stats.drafted_per_level) for i in keyed
    )


def test_join_and_leave_between_steps(target):
    """Requests added to a running batch and one removed mid-way: the others are unaffected."""
    config = SamplerConfig("mpfr", 4, 2, 12)
    requests = [(_prompt(i), config, _source(i, i), NgramDrafter(VOCAB)) for i in range(4)]
    solo = _solo(target, requests)
    batch = Batch(target)
    members = {}
    got: dict[int, list[int]] = {i: [] for i in range(4)}
    for i in (0, 1):
        p, c, s, d = requests[i]
        members[i] = batch.add(p, c, s, fresh_drafter(d), frozenset(), tag=i)
    steps = 0
    while len(batch):
        if steps == 1:  # two join after one step; request 1 leaves after two
            for i in (2, 3):
                p, c, s, d = requests[i]
                members[i] = batch.add(p, c, s, fresh_drafter(d), frozenset(), tag=i)
        if steps == 2:
            batch.remove(members[1])
        for member, ids in batch.step():
            got[member.tag].extend(ids)  # type: ignore[index]
        steps += 1
    for i in (0, 2, 3):
        assert tuple(got[i]) == solo[i].token_ids
    assert 0 < len(got[1]) < len(solo[1].token_ids)
    assert tuple(got[1]) == solo[1].token_ids[: len(got[1])]


def test_step_many_of_one_is_step(target):
    config = SamplerConfig("mpfr", 3, 3, 10)
    a = start(target, _prompt(3), config, _source(1), NgramDrafter(VOCAB), frozenset())
    b = start(target, _prompt(3), config, _source(1), NgramDrafter(VOCAB), frozenset())
    while not a.done:
        assert step_many([a]) == [step(b)]
    assert b.done and a.history.committed == b.history.committed


def test_forward_many_equals_forward_per_row(target):
    """The padded batched forward gives each row the logits and cache of its own forward."""
    prompts = [_prompt(i) for i in (0, 2, 5)]  # 1, 7 and 7 tokens -> caches of 0, 6, 6
    prompts[1] = prompts[1][:4]
    solo, rows = [], []
    for prompt in prompts:
        for group in (solo, rows):
            lm = CachedLM(target)
            if len(prompt) > 1:
                lm.extend(prompt[:-1])
            group.append(lm)
    tokens = [[prompts[0][-1], 3, 4], [prompts[1][-1]], [prompts[2][-1], 8]]
    depths = [[0, 1, 1], [0], [0, 1]]
    visible = []
    for lm, d in zip(rows, depths, strict=True):
        v = torch.ones((len(d), lm.cached + len(d)), dtype=torch.bool)
        v[:, lm.cached :] = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)[
            : len(d), : len(d)
        ]
        visible.append(v)
    bases = [lm.cached for lm in rows]
    batched = forward_many(rows, tokens, depths, visible, bases)
    for r, lm in enumerate(solo):
        want = lm.forward(tokens[r], depths[r], visible[r], bases[r])
        torch.testing.assert_close(batched[r], want, rtol=1e-12, atol=1e-12)
        assert rows[r].cached == lm.cached
        for mine, theirs in zip(rows[r].cache.layers, lm.cache.layers, strict=True):
            torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-12, atol=1e-12)
    # the caches keep working: one more solo step on each agrees
    for r, lm in enumerate(solo):
        nxt = [5]
        v = torch.ones((1, lm.cached + 1), dtype=torch.bool)
        torch.testing.assert_close(
            rows[r].forward(nxt, [0], v, lm.cached), lm.forward(nxt, [0], v, lm.cached)
        )


def test_a_batch_needs_a_drafter_per_request(target):
    drafter = NgramDrafter(VOCAB)
    batch = Batch(target)
    config = SamplerConfig("mpfr", 2, 2, 4)
    batch.add(_prompt(1), config, _source(1), drafter, frozenset())
    with pytest.raises(ValueError, match="own drafter"):
        batch.add(_prompt(2), config, _source(2), drafter, frozenset())


def test_fresh_drafter_shares_weights_not_state(target):
    proto = self_drafter(target, 1)
    proto.calls = 3
    clone = fresh_drafter(proto)
    assert clone is not proto and clone.calls == 0
    assert isinstance(clone, ModelDrafter) and clone.model is proto.model
    assert clone.lm is not proto.lm
    heads = _heads(target, 2, 1)
    heads_clone = fresh_drafter(heads)
    assert isinstance(heads_clone, HeadsDrafter) and heads_clone.heads is heads.heads
