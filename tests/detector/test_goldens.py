"""Frozen detector statistics (``tests/goldens/detector_v{P_VALUES_VERSION}.json``).

A failure here means a p-value changed for the same pivots: find the change in ``detector/``
(a formula, the λ grid, the quadrature, the exact/bound threshold). A deliberate change bumps
``P_VALUES_VERSION`` and freezes a new file (policy: ``tests/goldens/README.md``); never
regenerate to make this pass.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detector.scores import P_VALUES_VERSION
from detector.stats import PValue
from tests.goldens.make_detector_goldens import REL_LOG10, REL_S, differences, families

GOLDEN_FILE = Path(__file__).resolve().parents[1] / "goldens" / f"detector_v{P_VALUES_VERSION}.json"
DOC: dict[str, Any] = json.loads(GOLDEN_FILE.read_text())
FAMILIES = families()


def test_golden_families_are_the_current_parameters() -> None:
    assert DOC["p_values_version"] == P_VALUES_VERSION
    for fid, spec in DOC["families"].items():
        assert (FAMILIES[fid].name, dict(FAMILIES[fid].params)) == (spec["name"], spec["params"])


@pytest.mark.parametrize("case", DOC["pivot_cases"], ids=lambda c: c["id"])
def test_pivots_to_every_score(case: dict[str, Any]) -> None:
    pivots = np.array([float.fromhex(h) for h in case["pivots"]])
    for fid, expected in case["scores"].items():
        _, p = FAMILIES[fid].evaluate(pivots)
        assert p.method == expected["method"], fid
        assert p.score == pytest.approx(expected["score"], rel=REL_S, abs=1e-300), fid
        assert p.log10_p_value == pytest.approx(expected["log10_p"], rel=REL_LOG10, abs=1e-300)
        assert math.isfinite(p.log10_p_value)


@pytest.mark.parametrize("case", DOC["tail_cases"], ids=lambda c: c["id"])
def test_tails(case: dict[str, Any]) -> None:
    p = FAMILIES[case["family"]].p_value(case["m"], case["s"])
    assert p.method == case["method"]
    assert p.log10_p_value == pytest.approx(case["log10_p"], rel=REL_LOG10)


@pytest.mark.parametrize(
    ("m", "s", "log10_p"), [(200, 300.0, -9.47223), (2000, 4000.0, -268.57903)], ids=str
)
def test_c7_values_are_frozen(m: int, s: float, log10_p: float) -> None:
    # Case C7's published values (5 decimals) are in the golden file and stay there.
    (case,) = [c for c in DOC["tail_cases"] if (c["family"], c["m"], c["s"]) == ("aaronson", m, s)]
    assert round(case["log10_p"], 5) == log10_p
    # p prints 0 only beside a finite log10 p (here it does not underflow yet).
    PValue(case["score"], case["p_value"], case["log10_p"], "exact")


def test_regeneration_check_reports_a_change() -> None:
    # The --check path must flag a drifted value (so a silent change cannot pass it).
    fresh = json.loads(json.dumps(DOC))
    fresh["tail_cases"][0]["log10_p"] *= 1 + 1e-6
    assert differences(DOC, fresh) and not differences(DOC, DOC)


def test_the_previous_version_is_reproduced_within_the_golden_tolerance() -> None:
    """v2 changed how the Aaronson tail is computed (gammaincc above 1e-280), not what it is:
    every v1 value is still met to rel 1e-9."""
    previous = json.loads(GOLDEN_FILE.with_name("detector_v1.json").read_text())
    for case in previous["tail_cases"]:
        p = FAMILIES[case["family"]].p_value(case["m"], case["s"])
        assert p.log10_p_value == pytest.approx(case["log10_p"], rel=REL_LOG10), case["id"]
