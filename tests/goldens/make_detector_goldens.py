"""Freeze the detector's statistics: write ``tests/goldens/detector_v{P_VALUES_VERSION}.json``.

Two kinds of vectors:
- ``pivot_cases``: a list of pivots (``float.hex``, exact) -> for every score family (default
  and non-default parameters): the aggregate S, ln p, log10 p, p and the method.
- ``tail_cases``: (family, M, S) -> log10 p, including case C7, (M, S) = (200, 300) and
  (2000, 4000) for the Aaronson score.
``tests/detector/test_goldens.py`` recomputes every value (rel 1e-12 on S, 1e-9 on log10 p).

Policy (``tests/goldens/README.md``): a failing golden means a p-value changed. This script never
overwrites the file of an existing ``P_VALUES_VERSION``; a deliberate change bumps it in
``detector/scores.py`` and is frozen into a new file, after review.

Run from the repository root::

    python -m tests.goldens.make_detector_goldens          # write (new version only)
    python -m tests.goldens.make_detector_goldens --check  # recompute and compare
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from detector.scores import (
    AARONSON,
    P_VALUES_VERSION,
    ScoreFamily,
    lattimore_score,
    li_score,
    u_score,
)

GOLDENS_DIR = Path(__file__).resolve().parent
REL_S = 1e-12
REL_LOG10 = 1e-9


def families() -> dict[str, ScoreFamily]:
    """Every family under a golden id: defaults plus one non-default parameter each."""
    return {
        "aaronson": AARONSON,
        "u": u_score(),
        "li": li_score(),
        "li_delta0.3": li_score(0.3),
        "li_delta0.5": li_score(0.5),
        "lattimore": lattimore_score(),
        "lattimore_eps1e-4": lattimore_score(1e-4),
    }


def pivot_sets() -> dict[str, np.ndarray]:
    """Named pivot vectors: edge values, H0-like and watermark-like draws of several sizes."""
    rng = np.random.default_rng(20260101)
    below_one = 1.0 - 2.0**-53
    return {
        "one_half": np.array([0.5]),
        "edges": np.array([2.0**-54, 1e-300, 0.25, 0.999, 0.9995, below_one]),
        "three_near_one": np.array([below_one, below_one, below_one]),
        "h0_5": rng.random(5),
        "h0_30": rng.random(30),
        "h0_300": rng.random(300),
        "marked_20": 1.0 - rng.random(20) ** 3,  # r = 1 − u^3: mean Aaronson term 3
        "marked_64": 1.0 - rng.random(64) ** 2,
        "marked_200": 1.0 - rng.random(200) ** 2.5,
        "mixed_1000": np.concatenate([rng.random(800), 1.0 - rng.random(200) ** 2]),
        "long_4000": 1.0 - rng.random(4000) ** 1.5,
    }


TAILS: list[tuple[str, int, float]] = [
    ("aaronson", 200, 300.0),  # C7: log10 p = −9.47223
    ("aaronson", 2000, 4000.0),  # C7: log10 p = −268.57903
    ("aaronson", 1, 1e6),
    ("aaronson", 20_000, 60_000.0),
    ("u", 10, 9.5),
    ("u", 64, 60.0),
    ("u", 65, 60.0),
    ("u", 1000, 900.0),
    ("li", 100, 30.0),
    ("li", 100, 69.0),
    ("lattimore", 100, 100.0),
    ("lattimore", 100, 2000.0),
]


def _entry(family: ScoreFamily, m: int, s: float) -> dict[str, Any]:
    p = family.p_value(m, s)
    return {
        "score": p.score,
        "log_p": p.log_p_value,
        "log10_p": p.log10_p_value,
        "p_value": p.p_value,
        "method": p.method,
    }


def build() -> dict[str, Any]:
    """The golden document."""
    fams = families()
    pivot_cases = []
    for name, pivots in pivot_sets().items():
        scores = {}
        for fid, family in fams.items():
            terms, p = family.evaluate(pivots)
            scores[fid] = _entry(family, pivots.size, float(np.sum(terms)))
            assert math.isclose(p.log10_p_value, scores[fid]["log10_p"], rel_tol=1e-15)
        pivot_cases.append(
            {"id": name, "pivots": [float.hex(float(r)) for r in pivots], "scores": scores}
        )
    tail_cases = [
        {"id": f"{fid}_M{m}_S{s:g}", "family": fid, "m": m, "s": s} | _entry(fams[fid], m, s)
        for fid, m, s in TAILS
    ]
    return {
        "p_values_version": P_VALUES_VERSION,
        "generator": "python -m tests.goldens.make_detector_goldens",
        "families": {fid: {"name": f.name, "params": dict(f.params)} for fid, f in fams.items()},
        "pivot_cases": pivot_cases,
        "tail_cases": tail_cases,
    }


def golden_path(version: int = P_VALUES_VERSION) -> Path:
    return GOLDENS_DIR / f"detector_v{version}.json"


def render(doc: dict[str, Any]) -> str:
    """JSON with one case per line, so a review diff shows each changed case."""
    head = {k: v for k, v in doc.items() if k not in ("pivot_cases", "tail_cases")}
    lines = [json.dumps(head, indent=2)[:-2] + ","]
    for key in ("pivot_cases", "tail_cases"):
        body = ",\n".join("    " + json.dumps(case) for case in doc[key])
        lines.append(f'  "{key}": [\n{body}\n  ]' + ("," if key == "pivot_cases" else ""))
    return "\n".join(lines) + "\n}\n"


def differences(stored: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """Values of ``fresh`` that differ from ``stored`` beyond the golden tolerances."""
    problems = []
    for kind in ("pivot_cases", "tail_cases"):
        for old, new in zip(stored[kind], fresh[kind], strict=True):
            pairs = old["scores"].items() if kind == "pivot_cases" else [(old["id"], old)]
            news = new["scores"] if kind == "pivot_cases" else {old["id"]: new}
            for fid, value in pairs:
                got = news[fid]
                ok = (
                    math.isclose(got["score"], value["score"], rel_tol=REL_S, abs_tol=1e-300)
                    and math.isclose(
                        got["log10_p"], value["log10_p"], rel_tol=REL_LOG10, abs_tol=1e-300
                    )
                    and got["method"] == value["method"]
                )
                if not ok:
                    problems.append(f"{old['id']}/{fid}: stored {value}, now {got}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the existing file")
    args = parser.parse_args(argv)
    path = golden_path()
    doc = build()
    if args.check:
        if not path.exists():
            print(f"{path} does not exist", file=sys.stderr)
            return 1
        problems = differences(json.loads(path.read_text()), doc)
        print(f"{path}: " + ("matches" if not problems else "DIFFERS:\n" + "\n".join(problems)))
        return 0 if not problems else 1
    if path.exists():
        print(
            f"refusing to overwrite {path}: goldens of P_VALUES_VERSION {P_VALUES_VERSION} are "
            "frozen; bump it for a deliberate change (see tests/goldens/README.md)",
            file=sys.stderr,
        )
        return 1
    path.write_text(render(doc))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
