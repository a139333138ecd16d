"""Labels and the repeated-context rule (``keyed/context.py``, docs/design.md §2; case C4)."""

from __future__ import annotations

import numpy as np
import pytest

from keyed import _kernel_loader
from keyed.context import (
    SKIP_CODES,
    DetectionPlan,
    PlannedPosition,
    SkipReason,
    detection_plan,
    detection_plan_arrays,
    label_at,
)
from keyed.prf import SENTINEL

S = SENTINEL


def scored(plan: list[PlannedPosition]) -> list[int]:
    return [p.position for p in plan if p.skip is None]


# ------------------------------------------------------------------------------ labels


@pytest.mark.parametrize(
    ("position", "width", "expected"),
    [
        pytest.param(0, 4, (S, S, S, S), id="start"),
        pytest.param(1, 4, (S, S, S, 10), id="one_before"),
        pytest.param(3, 4, (S, 10, 11, 12), id="three_before"),
        pytest.param(4, 4, (10, 11, 12, 13), id="full_window"),
        pytest.param(6, 4, (12, 13, 14, 15), id="end"),
        pytest.param(0, 1, (S,), id="m1_start"),
        pytest.param(6, 1, (15,), id="m1_end"),
        pytest.param(2, 8, (S, S, S, S, S, S, 10, 11), id="m8"),
    ],
)
def test_label_at_pads_with_sentinel(position, width, expected):
    tokens = [10, 11, 12, 13, 14, 15]
    assert label_at(tokens, position, width) == expected


def test_label_at_is_plain_ints():
    label = label_at(np.array([1, 2, 3, 4, 5]), 5, 4)
    assert label == (2, 3, 4, 5)
    assert all(type(t) is int for t in label)


# ------------------------------------------------------------------------------- case C4


@pytest.mark.parametrize("prompt_len", [0, 1, 3, 50])
def test_case_c4_twelve_tokens_m4_scores_eight(prompt_len):
    """Case C4: a 12-token completion with m = 4 has exactly 8 scored positions (those with a
    full window inside the text); the first 4 are ``no_context``; nothing before the text
    changes the count or the labels."""
    rng = np.random.default_rng(prompt_len)
    prompt = [int(t) for t in rng.integers(0, 49_152, size=prompt_len)]
    text = list(range(1000, 1012))  # 12 distinct tokens
    plan = detection_plan(text, width=4)
    assert len(plan) == 12
    assert [p.position for p in plan] == list(range(12))
    assert [p.skip for p in plan[:4]] == [SkipReason.NO_CONTEXT] * 4
    assert scored(plan) == list(range(4, 12))
    # each scored label is the one the generator used at that position behind this prompt
    for p in plan[4:]:
        assert p.label == label_at(prompt + text, prompt_len + p.position, 4)
        assert S not in p.label


@pytest.mark.parametrize(
    ("length", "width", "expected"),
    [
        pytest.param(0, 4, 0, id="empty"),
        pytest.param(3, 4, 0, id="shorter_than_m"),
        pytest.param(4, 4, 0, id="exactly_m"),
        pytest.param(5, 4, 1, id="m_plus_1"),
        pytest.param(12, 1, 11, id="m1"),
        pytest.param(12, 8, 4, id="m8"),
    ],
)
def test_scored_count_is_length_minus_width(length, width, expected):
    plan = detection_plan(list(range(100, 100 + length)), width=width)
    assert len(scored(plan)) == expected
    assert all(p.skip is SkipReason.NO_CONTEXT for p in plan[: min(width, length)])


# ---------------------------------------------------------------- repeated-context rule


def test_repeated_label_skipped_with_masking():
    tokens = [1, 2, 3, 4, 5, 1, 2, 3, 4, 9]
    plan = detection_plan(tokens, width=4)
    # position 9 has label (1, 2, 3, 4), already scored at position 4
    assert scored(plan) == [4, 5, 6, 7, 8]
    assert plan[9].skip is SkipReason.REPEATED_CONTEXT
    assert plan[9].label == (1, 2, 3, 4)
    assert plan[9].skip == "repeated_context"


def test_repeated_label_scored_without_masking():
    tokens = [1, 2, 3, 4, 5, 1, 2, 3, 4, 9]
    plan = detection_plan(tokens, width=4, masking=False)
    assert scored(plan) == [4, 5, 6, 7, 8, 9]
    assert plan[9].label == plan[4].label == (1, 2, 3, 4)


def test_same_label_different_token_is_still_repeated():
    """The rule is about the context, not the (context, token) pair."""
    plan = detection_plan([7, 7, 1, 7, 7, 2], width=2)
    assert plan[2].label == plan[5].label == (7, 7)
    assert plan[5].skip is SkipReason.REPEATED_CONTEXT


def test_one_token_repeated_scores_once():
    plan = detection_plan([42] * 300, width=4)
    assert scored(plan) == [4]
    assert sum(p.skip is SkipReason.REPEATED_CONTEXT for p in plan) == 295
    assert len(scored(detection_plan([42] * 300, width=4, masking=False))) == 296


def test_cycle_of_three_scores_three():
    plan = detection_plan([5, 6, 7] * 100, width=4)
    assert scored(plan) == [4, 5, 6]
    assert {p.label for p in plan if p.skip is None} == {(6, 7, 5, 6), (7, 5, 6, 7), (5, 6, 7, 5)}


# ------------------------------------------------------------------------ special tokens


def test_special_tokens_skipped():
    eos = 2
    tokens = [10, 11, 12, 13, 14, eos, 15, 16, eos]
    plan = detection_plan(tokens, width=4, special_ids=frozenset({eos}))
    assert plan[5].skip is SkipReason.SPECIAL_TOKEN
    assert plan[8].skip is SkipReason.SPECIAL_TOKEN
    assert plan[5].skip == "special_token"
    assert plan[5].label is None
    assert scored(plan) == [4, 6, 7]
    assert plan[6].label == (12, 13, 14, eos)  # special ids may sit inside a window


def test_special_token_does_not_consume_its_label():
    """A skipped special token leaves its label free for a later ordinary token."""
    tokens = [1, 2, 3, 4, 0, 1, 2, 3, 4, 5]
    plan = detection_plan(tokens, width=4, special_ids=frozenset({0}))
    assert plan[4].skip is SkipReason.SPECIAL_TOKEN
    assert plan[9].skip is None
    assert plan[9].label == (1, 2, 3, 4)


def test_special_token_reason_wins_over_no_context():
    """A special token is reported as such wherever it is, so users see why it is not scored."""
    plan = detection_plan([0, 1, 2, 3, 4], width=4, special_ids=frozenset({0}))
    assert plan[0].skip is SkipReason.SPECIAL_TOKEN
    assert plan[1].skip is SkipReason.NO_CONTEXT


# ------------------------------------------------------------- the vectorised plan (fast path)


def _as_reference(
    plan: DetectionPlan, width: int
) -> list[tuple[int, tuple[int, ...] | None, SkipReason | None]]:
    labels = iter(plan.labels.tolist())
    out = []
    for t, code in enumerate(plan.skip.tolist()):
        reason = SKIP_CODES[code]
        out.append((t, tuple(next(labels)) if reason is None else None, reason))
    return out


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("width", [1, 2, 4, 7])
@pytest.mark.parametrize(
    "kind",
    ["random", "long", "one_token", "short_cycle", "few_symbols", "big_ids", "empty",
     "shorter_than_m"],
)  # fmt: skip
def test_plan_arrays_equal_the_reference_loop(
    width: int, kind: str, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``detection_plan_arrays`` makes the same decisions as ``detection_plan`` (masking on),
    on random and on adversarially repetitive texts, with special tokens sprinkled in — both
    the compiled kernel (a hash table of packed labels) and the NumPy path (sort-based)."""
    if not compiled:
        monkeypatch.setattr(_kernel_loader, "kernels", lambda: None)
    else:
        assert _kernel_loader.kernels() is not None  # numba is a dependency: the kernel really runs
    rng = np.random.default_rng(width * 31 + len(kind))
    tokens = {
        "random": rng.integers(0, 49_152, 400),
        "long": rng.integers(0, 6, 6000),  # a long text, most labels repeated (6^m of them)
        "one_token": np.full(300, 17),
        "short_cycle": np.tile([5, 6, 7], 120),
        "few_symbols": rng.integers(0, 3, 500),
        "big_ids": np.tile(rng.integers(0, 2**31, 7), 40),  # ids too wide to pack: bytes path
        "empty": np.zeros(0, np.int64),
        "shorter_than_m": np.arange(width - 1 if width > 1 else 0),
    }[kind]
    special = frozenset({0, 2, 99})
    plan = detection_plan_arrays(tokens, width, special)
    reference = detection_plan(list(map(int, tokens)), width, masking=True, special_ids=special)
    expected = [(p.position, p.label if p.skip is None else None, p.skip) for p in reference]
    assert _as_reference(plan, width) == expected
    assert plan.scored.tolist() == [p.position for p in reference if p.skip is None]
    assert plan.labels.shape == (len(plan.scored), width)
