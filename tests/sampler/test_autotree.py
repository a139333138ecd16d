"""Trees sized by cost (``sampler.autotree``): the choice follows the forward
profile and the request's acceptance, falls back to one-token steps where no tree pays and
keeps exploring; whatever it chooses, keyed-race output equals basic-uwm (Thm. 5.1), solo and
batched, on float64 tiny models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from keyed import KeyedSource, Secret
from sampler import autotree, tree_evidence
from sampler.autotree import EXPLORE_EVERY, EXPLORE_MAX, TreeChooser
from sampler.batch import generate_many
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import NgramDrafter, fresh_drafter, self_drafter
from sampler.targets.profile import ForwardProfile, measure_profile, profile_for, set_profile_dir
from sampler.targets.transformers import as_target
from tests.sampler.conftest import VOCAB, tiny_llama

FLAT = ForwardProfile((1, 2, 3, 5, 9, 17, 33), (0.010,) * 7)  # trees cost what a step costs
STEEP = ForwardProfile((1, 2, 3, 5, 9, 17, 33), (0.010, 0.020, 0.030, 0.050, 0.09, 0.17, 0.33))


def test_profile_interpolates_and_refuses_nonsense():
    p = ForwardProfile((1, 3, 5), (1.0, 2.0, 4.0))
    assert p.cost(1) == 1.0 and p.cost(2) == 1.5 and p.cost(4) == 3.0
    assert p.cost(7) == 6.0  # the last segment's slope beyond the last count
    with pytest.raises(ValueError, match="increasing node counts from 1"):
        ForwardProfile((2, 3), (1.0, 2.0))
    for bad in (0.0, float("nan"), float("inf")):  # a NaN file once switched trees off for good
        with pytest.raises(ValueError, match="positive finite seconds"):
            ForwardProfile((1, 3), (1.0, bad))


def _train(chooser: TreeChooser, accepted: int, steps: int = 40) -> None:
    for _ in range(steps):
        drafts, depth = chooser.record(*chooser.choose(100))
        chooser.observe(drafts, depth, drafts * depth, min(accepted, depth), False, 0.0, 0.0)


def test_free_trees_that_are_accepted_grow_deep():
    chooser = TreeChooser(FLAT, 4, 4)
    _train(chooser, accepted=4)
    assert chooser.choose(100)[1] == 4
    assert chooser.expected_tokens(4, 4) > 4.0


@pytest.fixture
def free_explores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The back-off interval alone decides when to explore (no cost floor)."""
    monkeypatch.setattr(autotree, "EXPLORE_BUDGET", math.inf)


def test_costly_trees_that_are_rejected_give_one_token_steps_and_exploration(free_explores):
    chooser = TreeChooser(STEEP, 4, 4)
    _train(chooser, accepted=0, steps=80)
    picks = [chooser.record(*chooser.choose(100)) for _ in range(EXPLORE_MAX * 2)]
    one_token = [p for p in picks if p[1] == 0]
    assert len(one_token) >= len(picks) - 2  # rejected explores back off to EXPLORE_MAX
    assert len(one_token) < len(picks)  # but it keeps trying


def test_rejected_explores_back_off_and_an_accepted_one_halves_the_interval(free_explores):
    chooser = TreeChooser(STEEP, 4, 4)

    def steps_to_next_tree(accepted: int) -> int:
        for n in range(1, 10 * EXPLORE_MAX):
            drafts, depth = chooser.record(*chooser.choose(100))
            chooser.observe(drafts, depth, drafts * depth, min(accepted, depth), False, 0.0, 0.0)
            if depth:
                return n
        raise AssertionError("no tree was explored")

    gaps = [steps_to_next_tree(0) for _ in range(6)]
    assert gaps[-1] == EXPLORE_MAX >= gaps[-2] > gaps[1] >= EXPLORE_EVERY
    steps_to_next_tree(1)  # this explored tree is accepted at level 1 ...
    assert steps_to_next_tree(1) == EXPLORE_MAX // 2  # ... so the next comes twice as soon
    assert steps_to_next_tree(0) == EXPLORE_MAX // 4  # and again; a rejected one doubles it
    assert steps_to_next_tree(0) == EXPLORE_MAX // 2


def test_depth_never_passes_the_tokens_left_or_the_caps():
    chooser = TreeChooser(FLAT, 2, 3)
    _train(chooser, accepted=3)
    assert chooser.choose(2) in {(1, 2), (2, 2), (1, 1), (2, 1), (1, 0)}
    assert all(b <= 2 and d <= 3 for (b, d) in chooser.choices)


def test_acceptance_counts_only_what_was_decided():
    chooser = TreeChooser(FLAT, 2, 4)
    chooser.observe(2, 4, 8, 1, False, 0.0, 0.0)  # level 1 accepted, level 2 rejected
    chooser.observe(2, 4, 8, 2, True, 0.0, 0.0)  # stopped (EOS/budget) after level 2
    # Beta(1, 2) prior: (accepted + 1) / (reached + 3)
    assert chooser.acceptance(2, 1) == (2 + 1) / (2 + 3)
    assert chooser.acceptance(2, 2) == (1 + 1) / (2 + 3)
    assert chooser.acceptance(2, 3) == 1 / 3  # never reached: the prior
    prior = chooser.acceptance(1, 1)
    assert prior == 1 / 3 and chooser.acceptance(2, 1) >= prior


def test_a_capped_tree_is_recorded_as_run():
    """A node cap's B (e.g. 3) rounds down to a candidate (2), and that is what is counted."""
    chooser = TreeChooser(FLAT, 4, 4)
    assert chooser.record(3, 2) == (2, 2) and chooser.record(4, 0) == (1, 0)
    assert chooser.choices == {(2, 2): 1, (1, 0): 1}


def test_a_corrupt_profile_file_is_measured_again(tmp_path):
    target = tiny_llama(0, layers=1)
    set_profile_dir(target, tmp_path)
    first = profile_for(target)
    (path,) = tmp_path.glob("forward-*.json")
    path.write_text('{"nodes": [1, 2], "seconds": [NaN, 1.0]}')
    again = tiny_llama(0, layers=1)
    set_profile_dir(again, tmp_path)
    remeasured = profile_for(again)
    assert all(s > 0 for s in remeasured.seconds) and remeasured.nodes == first.nodes
    assert "NaN" not in path.read_text()


def test_float32_targets_draft_as_fixed():
    """On transformers' float32 a tree's logits can differ in the last bits from a one-token
    step's, so a timing-driven tree could flip a near-tie between runs: auto is fixed there."""
    target = tiny_llama(2, layers=2, dtype=torch.float32)
    prompt = [3, 1, 4, 1, 5]
    auto = generate(target, prompt, SamplerConfig("mpfr", 4, 4, 16, tree="auto"), _source(1),
                    NgramDrafter(VOCAB))  # fmt: skip
    fixed = generate(target, prompt, SamplerConfig("mpfr", 4, 4, 16), _source(1),
                     NgramDrafter(VOCAB))  # fmt: skip
    assert auto.stats.tree_choices == () and auto.token_ids == fixed.token_ids
    assert auto.stats.target_forward_passes == fixed.stats.target_forward_passes


@pytest.mark.parametrize("method", ["vsps", "gls"])
def test_tree_dependent_methods_ignore_auto(method):
    """vsps and gls draw from the tree itself: auto leaves them at B drafts of depth L."""
    target = tiny_llama(2, layers=2)
    prompt = [2, 7, 1, 8]
    drafter = self_drafter(target, 1)
    runs = [
        generate(
            target,
            prompt,
            SamplerConfig(method, 2, 3, 14, tree=tree),
            _source(3),
            fresh_drafter(drafter),
        )
        for tree in ("auto", "fixed")
    ]
    assert runs[0].token_ids == runs[1].token_ids and runs[0].stats.tree_choices == ()
    assert runs[0].stats.drafted_per_level == runs[1].stats.drafted_per_level


def test_profile_is_cached_per_machine_on_disk(tmp_path):
    target = tiny_llama(0, layers=1)
    set_profile_dir(target, tmp_path)
    first = profile_for(target)
    files = list(tmp_path.glob("forward-*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    assert tuple(saved["seconds"]) == first.seconds and "cpu" in saved["fingerprint"]
    again = tiny_llama(0, layers=1)  # a new model object: read back, not measured
    set_profile_dir(again, tmp_path)
    assert profile_for(again) == first
    assert measure_profile(target, repeats=1).nodes == first.nodes


def _source(i: int) -> KeyedSource:
    return KeyedSource(Secret((900 + i).to_bytes(32, "little")), 4, True, i)


@pytest.mark.parametrize("profile", [FLAT, STEEP], ids=["flat", "steep"])
def test_auto_trees_keep_the_keyed_output(profile):
    """mpfr and pfr with tree auto equal basic-uwm token for token, solo and batched with
    fixed-tree requests, whatever the profile makes the chooser pick (flat: deep trees;
    steep: mostly one-token steps)."""
    target = tiny_llama(2, layers=2)
    as_target(target).forward_profile = profile  # what the chooser reads, not a measurement
    prompts = [[(7 * i + j) % VOCAB for j in range(2 + i % 5)] for i in range(6)]
    drafters = [NgramDrafter(VOCAB), self_drafter(target, 1)]
    requests = []
    for i, prompt in enumerate(prompts):
        method = "pfr" if i % 3 == 2 else "mpfr"
        tree = "fixed" if i == 4 else "auto"
        config = SamplerConfig(method, 4, 4, 24, tree=tree)  # type: ignore[arg-type]
        requests.append((prompt, config, _source(i), drafters[i % 2]))
    reference = [
        generate(target, p, SamplerConfig("basic-uwm", 1, 1, 24), s).token_ids
        for p, _, s, _ in requests
    ]
    solo = [generate(target, p, c, s, fresh_drafter(d)) for p, c, s, d in requests]
    batched = generate_many(target, [(p, c, s, fresh_drafter(d)) for p, c, s, d in requests])
    assert [r.token_ids for r in solo] == reference
    assert [r.token_ids for r in batched] == reference
    chosen = [dict(((b, d), n) for b, d, n in r.stats.tree_choices) for r in solo]
    assert chosen[4] == {}  # the fixed-tree request has no chooser
    depths = {d for choice in chosen for (_, d) in choice}
    if profile is FLAT:
        assert max(depths) >= 3
    else:
        assert 0 in depths
    steps = [sum(c.values()) for c in chosen]
    assert all(n == r.stats.target_forward_passes for n, r in zip(steps, solo, strict=True) if n)


def test_tree_mode_is_checked():
    with pytest.raises(ValueError, match="tree must be one of fixed, auto"):
        SamplerConfig("mpfr", tree="deep")  # type: ignore[arg-type]


def test_acceptance_counts_proposals_and_the_proposal_rate_scales_it():
    """Tree steps where the drafter proposed nothing (an n-gram drafter without a match) set
    the proposal rate π, not the acceptance; the expected tokens are 1 + π·a_1, so a drafter
    that rarely proposes, and is rejected when it does, gets one-token steps (until the
    explore) even where a tree costs little more than a step."""
    chooser = TreeChooser(ForwardProfile((1, 2), (1.0, 1.3)), 1, 1)
    for step in range(20):
        chooser.observe(1, 1, 1 if step % 7 == 0 else 0, 0, False, 0.0, 0.0)  # 3 proposals
    assert chooser.proposal_rate() == 3 / 20
    assert chooser.acceptance(1, 1) == 1 / (3 + 3)  # Beta(1, 2) over the 3 proposals
    assert chooser.expected_tokens(1, 1) == 1 + 3 / 20 * (1 / 6)
    picks = [chooser.record(*chooser.choose(100))[1] for _ in range(EXPLORE_EVERY)]
    assert picks == [0] * (EXPLORE_EVERY - 1) + [1]  # one-token steps, then the explore


def test_measured_forwards_scale_the_profile():
    """A request whose tree forwards take 1.5x what the profile says (and one-token ones as
    profiled) is planned with the measured costs (``forward_scale``)."""
    chooser = TreeChooser(ForwardProfile((1, 2), (1.0, 1.3)), 1, 1)
    for _ in range(4):
        chooser.observe(1, 0, 0, 0, False, 0.0, 0.0, forward_seconds=1.0)
    for _ in range(4):
        chooser.observe(1, 1, 1, 0, False, 0.0, 0.0, forward_seconds=1.5 * 1.3)
    assert chooser.forward_scale(False) == 1.0 and chooser.forward_scale(True) == 1.5
    assert chooser.expected_seconds(1, 1) == 1.5 * 1.3 and chooser.expected_seconds(1, 0) == 1.0


def test_a_costly_explore_waits_until_its_loss_fits_the_budget():
    """With drafting that costs two steps per level, an explore loses ~2 steps of time, so
    explores come at most every 2 / ``EXPLORE_BUDGET`` steps (capped at ``EXPLORE_MAX``);
    with free drafting where a 2-node forward costs 1.3 steps the floor lies between the
    back-off's bounds; where trees cost what a step costs the back-off alone decides."""
    mild = ForwardProfile((1, 2, 3, 5, 9, 17, 33), (0.010, 0.013, 0.03, 0.05, 0.09, 0.17, 0.33))
    costly, cheap, free = TreeChooser(STEEP, 1, 1), TreeChooser(mild, 1, 1), TreeChooser(FLAT, 1, 1)
    for chooser, draft in ((costly, 0.02), (cheap, 0.0), (free, 0.0)):
        chooser.observe(1, 1, 1, 0, False, draft, 0.0)  # one rejected tree: c measured
    step = costly.expected_seconds(1, 0)
    loss = costly.expected_seconds(1, 1) - costly.expected_tokens(1, 1) * step
    assert loss > 2 * step
    assert costly.explore_interval() == EXPLORE_MAX
    floor = (cheap.expected_seconds(1, 1) - cheap.expected_tokens(1, 1) * step) / (
        autotree.EXPLORE_BUDGET * step
    )
    assert EXPLORE_EVERY < floor < EXPLORE_MAX
    assert cheap.explore_interval() == pytest.approx(floor)
    assert free.explore_interval() == EXPLORE_EVERY


def test_choose_is_the_argmax_of_expected_tokens_over_expected_seconds():
    """``choose`` picks what the public cost model (``expected_tokens`` /
    ``expected_seconds``, ``acceptance``) picks — the first of a tie, else an explore where no
    tree beats a one-token step — over 300 random steps on a measured-looking profile (seed 3:
    trees and one-token steps both chosen). It guards any faster rewrite of ``choose``."""
    import random

    rng = random.Random(3)
    profile = ForwardProfile(
        (1, 2, 3, 5, 9, 17, 33), (0.0137, 0.0183, 0.0222, 0.0329, 0.052, 0.086, 0.15)
    )
    chooser = TreeChooser(profile, 8, 4)
    picked = set()
    for _ in range(300):
        remaining = rng.choice([1, 2, 3, 100])
        cap = min(chooser.max_depth, remaining)
        rates = {(1, 0): 1.0 / chooser.expected_seconds(1, 0)}
        for b in chooser.drafts_options:
            for depth in range(1, cap + 1):
                rate = chooser.expected_tokens(b, depth) / chooser.expected_seconds(b, depth)
                if (b, depth) not in rates:
                    rates[(b, depth)] = rate
        trees = {k: v for k, v in rates.items() if k[1] > 0}
        best_tree = max(trees, key=lambda k: (trees[k], -k[0], -k[1]))  # the first of a tie
        want = best_tree if trees[best_tree] > rates[(1, 0)] else (1, 0)
        got = chooser.choose(remaining)
        if got != want:  # an explore
            assert chooser._exploring and want == (1, 0) and got == (1, 1)
        picked.add(got[1] > 0)
        drafts, depth = chooser.record(*got)
        proposed = drafts * depth if rng.random() < 0.8 else 0
        accepted = min(depth, rng.choice([0, 0, 1, 2, 4])) if proposed else 0
        chooser.observe(drafts, depth, proposed, accepted, False, 1e-4 * depth, 2e-4, None)
    assert picked == {True, False}


def _steps(chooser: TreeChooser, accepted: int, draft: float, n: int = 40) -> None:
    """``n`` steps where every tree's first ``accepted`` levels are accepted and each drafted
    level costs ``draft`` seconds; forwards take what the profile says."""
    for _ in range(n):
        drafts, depth = chooser.record(*chooser.choose(100))
        proposed = drafts * depth
        forward = chooser.profile.cost(1 + proposed)
        chooser.observe(drafts, depth, proposed, min(accepted, depth), False, draft * depth,
                        0.0, forward)  # fmt: skip


def test_a_new_request_starts_from_what_the_process_learnt():
    """Where the priors say no tree pays (a 2-node forward costs 1.4 steps, acceptance 1/3),
    a request that learnt trees are always accepted leaves its evidence in the process's
    memory: the next request drafts at its first step, starting from the same drafting cost,
    weighed as at most ``MEMORY_COST_STEPS`` / ``MEMORY_ACCEPTANCE_STEPS`` steps; a request
    without the memory starts with a one-token step."""
    profile = ForwardProfile((1, 2, 3), (0.010, 0.014, 0.018))
    memory = tree_evidence.TreeMemory()
    first = TreeChooser(profile, 1, 2, memory)
    assert first.choose(100) == (1, 0)
    for _ in range(200):  # trees every step, all accepted, 1 ms a level
        first.observe(1, 2, 2, 2, False, 0.002, 0.0, profile.cost(3))
    second = TreeChooser(profile, 1, 2, memory)
    assert second.choose(100)[1] > 0
    assert second.evidence.draft_level.get(0.0) == pytest.approx(0.001)
    assert second.evidence.draft_level.count == tree_evidence.MEMORY_COST_STEPS
    assert second.evidence.reached[1][0] == tree_evidence.MEMORY_ACCEPTANCE_STEPS
    accepted = tree_evidence.MEMORY_ACCEPTANCE_STEPS + autotree.PRIOR_ACCEPTED
    prior = autotree.PRIOR_ACCEPTED + autotree.PRIOR_REJECTED
    assert second.acceptance(1, 1) == accepted / (tree_evidence.MEMORY_ACCEPTANCE_STEPS + prior)
    assert TreeChooser(profile, 1, 2).choose(100) == (1, 0)


def test_the_memory_is_per_target_drafter_and_processing_and_goes_with_the_target():
    import gc

    from sampler.processing import Processing

    class Target:
        pass

    target, other = Target(), Target()
    memory = tree_evidence.memory_for(target, "eagle", Processing())
    assert tree_evidence.memory_for(target, "eagle", Processing()) is memory
    assert tree_evidence.memory_for(target, "ngram", Processing()) is not memory
    assert tree_evidence.memory_for(target, "eagle", Processing(0.7)) is not memory
    assert tree_evidence.memory_for(other, "eagle", Processing()) is not memory
    gc.collect()  # other tests' targets that are garbage already leave first
    before = len(tree_evidence._MEMORIES)
    del target
    gc.collect()
    assert len(tree_evidence._MEMORIES) == before - 1


def test_explores_stay_within_their_budget_of_a_lone_request():
    """A drafter whose level costs 1.5 one-token steps and is always rejected: over a
    1024-token request its explores cost at most ``EXPLORE_BUDGET`` of its time (the first
    tree, priced before the drafter was measured, comes once and is not an explore)."""
    profile = ForwardProfile((1, 2, 3), (0.010, 0.012, 0.014))
    chooser = TreeChooser(profile, 1, 1)
    total = excess = 0.0
    trees = 0
    for emitted in range(1024):
        drafts, depth = chooser.record(*chooser.choose(1024 - emitted))
        trees += depth
        seconds = profile.cost(1 + drafts * depth) + 0.015 * depth
        chooser.observe(drafts, depth, drafts * depth, 0, False, 0.015 * depth, 0.0,
                        seconds - 0.015 * depth)  # fmt: skip
        total += seconds
        if trees > 1 or not depth:  # the first tree is not an explore
            excess += seconds - 0.010
    assert trees >= 2
    assert excess <= autotree.EXPLORE_BUDGET * total


def test_a_batch_prices_nodes_at_its_marginal_row():
    """Trees accepted half the time on a profile where rows get dear past 9: alone a one-draft
    chain pays (1.5 tokens for 1.1 steps); in a step shared by 16 requests its node adds
    t(17) − t(16) = 0.2 steps' time at the batch's rate 16 / t(16), worth less than the
    one-token step; with 8 it still pays."""
    profile = ForwardProfile(
        (1, 2, 3, 5, 9, 17, 33), (0.010, 0.011, 0.012, 0.014, 0.018, 0.034, 0.066)
    )
    chooser = TreeChooser(profile, 1, 1)
    for step in range(200):
        chooser.observe(1, 1, 1, step % 2, False, 0.0, 0.0, profile.cost(2))
    assert chooser.choose(100) == (1, 1)
    busy = autotree.BatchPrice(rows=15, rate=16 / profile.cost(16))
    assert chooser.choose(100, busy) == (1, 0)
    light = autotree.BatchPrice(rows=7, rate=8 / profile.cost(8))
    assert chooser.choose(100, light) == (1, 1)
    assert chooser.batch_price(15, 16) == busy and chooser.batch_price(7, 8) == light
    slow = TreeChooser(profile, 1, 1)  # every forward and level at twice the profile
    for step in range(200):
        slow.observe(1, 1, 1, step % 2, False, 0.0, 0.0, 2 * profile.cost(2))
        slow.observe(1, 0, 0, 0, False, 0.0, 0.0, 2 * profile.cost(1))
    assert slow.choose(100, slow.batch_price(15, 16)) == (1, 0)
    assert slow.choose(100, slow.batch_price(7, 8)) == (1, 1)


def test_a_batch_share_of_drafting_stays_out_of_the_process_memory():
    """A batched step's drafting seconds are a share of a level the batch paid once: they
    count for the request, not for the process's memory a lone request starts from."""
    profile = ForwardProfile((1, 2), (0.010, 0.012))
    memory = tree_evidence.TreeMemory()
    chooser = TreeChooser(profile, 1, 1, memory)
    chooser.observe(1, 1, 1, 1, False, 0.004, 0.0, None, batched=False)
    chooser.observe(1, 1, 1, 1, False, 0.0005, 0.0, None, batched=True)
    assert memory.evidence.draft_level.get(0.0) == 0.004
    assert chooser.evidence.draft_level.get(0.0) == pytest.approx(0.00225)


def _runs_of_each_size(chooser: TreeChooser, profile: ForwardProfile, accepted_of_20: int) -> None:
    """400 steps in runs of 20 one-token steps and 20 trees (B = ℓ = 1) — few changes, both
    kinds measured — ending with trees; a forward that changes the node count costs 1.3x the
    profile (a new compute graph), the others as profiled; ``accepted_of_20`` trees of each
    run accepted."""
    for step in range(400):
        tree = step % 40 >= 20
        nodes = 2 if tree else 1
        changed = chooser._last_nodes is not None and chooser._last_nodes != nodes
        forward = profile.cost(nodes) * (1.3 if changed else 1.0)
        accepted = 1 if tree and step % 20 < accepted_of_20 else 0
        chooser.observe(1, int(tree), int(tree), accepted, False, 0.0, 0.0, forward)


def test_a_change_of_tree_size_is_paid_once_not_every_step():
    """Trees accepted 35 % of the time (1.35 tokens for 1.3 steps) pay in steady state: the
    request stays with them, and from one-token steps it changes to them where the 0.3-step
    rebuild is repaid by the tokens to go (100), not with 2 to go."""
    profile = ForwardProfile((1, 2), (1.0, 1.3))
    chooser = TreeChooser(profile, 1, 1)
    _runs_of_each_size(chooser, profile, 7)
    assert chooser.forward_scale(True, True) == pytest.approx(1.3)
    assert chooser.forward_scale(True, False) == pytest.approx(1.0)
    assert chooser._last_nodes == 2
    assert chooser.choose(100) == (1, 1)
    chooser.observe(1, 0, 0, 0, False, 0.0, 0.0, 1.3)  # one one-token step
    assert chooser.choose(100) == (1, 1)
    assert chooser.choose(2) == (1, 0)


def test_a_losing_tree_size_is_left_even_though_leaving_costs_a_rebuild():
    """Trees accepted 20 % of the time (1.2 tokens for 1.3 steps) lose in steady state. After
    a tree the next one-token step pays the rebuild (1.3 steps for 1 token, worse than the
    tree's 1.08): a chooser that priced the change on one step would stay with losing trees
    for good; priced over the steps to come, it leaves them."""
    profile = ForwardProfile((1, 2), (1.0, 1.3))
    chooser = TreeChooser(profile, 1, 1)
    _runs_of_each_size(chooser, profile, 4)
    assert chooser._last_nodes == 2
    assert chooser.choose(100) == (1, 0)


def test_a_clear_one_token_verdict_stands_until_an_explore_or_a_tree():
    """Trees that lose clearly (a 2-node forward costs 3 one-token ones): the verdict is
    kept for ``HOLD_STEPS`` steps without pricing the trees again, so evidence that would
    flip it (a 2-node forward as cheap as one) moves the choice only after the hold;
    a tree step observed ends a hold at once."""
    profile = ForwardProfile((1, 2), (1.0, 3.0))
    chooser = TreeChooser(profile, 1, 1)
    chooser._explore_every = EXPLORE_MAX  # no explore falls due within the hold
    for _ in range(3):
        chooser.observe(1, 1, 1, 0, False, 0.0, 0.0, 3.0)
    for _ in range(2):
        chooser.observe(1, 0, 0, 0, False, 0.0, 0.0, 1.0)
    assert chooser.choose(100) == (1, 0) and chooser._hold == autotree.HOLD_STEPS - 1
    cheap = ForwardProfile((1, 2), (1.0, 1.0))
    chooser.profile = cheap  # trees now pay: priced again, they would be chosen
    held = [chooser.choose(100) for _ in range(autotree.HOLD_STEPS - 1)]
    assert held == [(1, 0)] * (autotree.HOLD_STEPS - 1)
    assert chooser.choose(100) == (1, 1)  # the hold is over: priced again
    chooser.profile = profile
    chooser.observe(1, 1, 1, 0, False, 0.0, 0.0, 3.0)
    assert chooser.choose(100) == (1, 0) and chooser._hold > 0
    chooser.observe(1, 1, 1, 1, False, 0.0, 0.0, 3.0)  # a tree step (an explore) ends it
    assert chooser._hold == 0


def test_a_new_process_starts_from_the_memory_its_machine_saved(tmp_path):
    """A request's end writes the process's memory beside the forward profile; a new process
    (the target's memories dropped) reads it back as the evidence a request starts from: the
    drafter's cost and the acceptance are known before its first tree. Another drafter or
    processing has its own file; a file with a NaN or of another format is ignored."""
    from sampler.processing import Processing

    target = as_target(tiny_llama(3, dtype=torch.float64))
    set_profile_dir(target, tmp_path)
    memory = tree_evidence.memory_for(target, "eagle", Processing())
    profile = ForwardProfile((1, 2, 3), (0.010, 0.012, 0.014))
    chooser = TreeChooser(profile, 2, 2, memory)
    for i in range(100):
        chooser.observe(1, 1, 1, int(i % 3 == 0), False, 0.004, 0.0005, 0.013)
    memory.save()
    (saved,) = tmp_path.glob("trees-*.json")
    del tree_evidence._MEMORIES[target]  # a new process
    again = tree_evidence.memory_for(target, "eagle", Processing())
    assert again is not memory and again.path == saved
    assert again.evidence.to_json() == memory.evidence.seed(2).to_json()
    fresh = TreeChooser(profile, 2, 2, again)
    assert fresh.level_seconds() == pytest.approx(0.004)
    assert fresh.acceptance(1, 1) == TreeChooser(profile, 2, 2, memory).acceptance(1, 1) < 0.5
    assert tree_evidence.memory_for(target, "ngram", Processing()).evidence.draft_level.count == 0
    assert tree_evidence.memory_for(target, "eagle", Processing(0.7)).path != saved
    data = json.loads(saved.read_text())
    data["evidence"]["means"]["draft_level"][0] = math.nan
    empty = json.loads(saved.read_text())
    empty["evidence"]["reached"]["1"] = empty["evidence"]["accepted"]["1"] = []
    over = json.loads(saved.read_text())
    over["evidence"]["accepted"]["1"][0] = over["evidence"]["reached"]["1"][0] + 1
    text = saved.read_text()
    kinds = (json.dumps(data), json.dumps(empty), json.dumps(over))
    for broken in (*kinds, text.replace("tree-memory/1", "tree-memory/0")):
        saved.write_text(broken)
        del tree_evidence._MEMORIES[target]
        assert (
            tree_evidence.memory_for(target, "eagle", Processing()).evidence.draft_level.count == 0
        )


def test_a_verdict_past_the_explore_interval_holds_while_no_explore_fits_the_budget():
    """Explores that cannot fit the budget (a level costing 10 one-token steps) never fall
    due, so the verdict is priced again once every ``HOLD_STEPS`` steps, not on every step
    past the explore interval."""
    profile = ForwardProfile((1, 2), (0.010, 0.030))
    chooser = TreeChooser(profile, 1, 1)
    chooser.observe(1, 1, 1, 0, False, 0.1, 0.0, 0.030)
    priced = 0
    original = chooser._terms

    def counted(tree: bool) -> tuple[float, float, float, float, float]:
        nonlocal priced
        priced += tree  # choose prices the trees once per evaluation
        return original(tree)

    chooser._terms = counted  # type: ignore[method-assign]
    for emitted in range(8 * EXPLORE_MAX):
        assert chooser.choose(8 * EXPLORE_MAX - emitted) == (1, 0)
        chooser.observe(1, 0, 0, 0, False, 0.0, 0.0, 0.010)
    assert priced == 8 * EXPLORE_MAX // autotree.HOLD_STEPS


def test_a_request_whose_first_step_is_a_tree_does_not_keep_drafting():
    """No memory, the first step a tree (priced before the drafter was measured), every tree
    rejected, a 2-node forward 1.3 one-token ones and a change of node count 1.3x more: the
    one-token steps after it are priced at their steady cost (never at a changing one's
    while no steady one is measured), so the request leaves trees and stays out."""
    profile = ForwardProfile((1, 2), (1.0, 1.3))
    chooser = TreeChooser(profile, 1, 1)
    trees = 0
    for emitted in range(128):
        drafts, depth = chooser.record(*chooser.choose(128 - emitted))
        nodes = 1 + depth
        forward = profile.cost(nodes) * (1.3 if chooser._switched(nodes) else 1.0)
        trees += depth
        chooser.observe(drafts, depth, depth, 0, False, 0.0, 0.0, forward)
    assert 1 <= trees <= 4
