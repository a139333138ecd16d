"""docs/design.md §1: imports flow one way; the detector never imports the sampler."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.fresh import fresh_python

DETECTOR = Path(__file__).resolve().parents[2] / "detector"


def test_detector_source_never_names_sampler() -> None:
    for path in sorted(DETECTOR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n == "sampler" or n.startswith("sampler.") for n in names), path


def test_importing_detector_loads_no_sampler_module() -> None:
    code = (
        "import sys, detector; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sampler'))"
    )
    assert fresh_python(code) == "[]"


def test_detecting_loads_no_torch() -> None:
    """Corpus workers start by importing the detector: torch (seconds to import) stays out of a
    whole detection, key derivation and pivots included (only ``keyed.tensor`` imports it)."""
    code = (
        "import sys, detector, keyed\n"
        "from detector.tokens import TokenizedText\n"
        "from detector.detect import detect_tokenized\n"
        "ids = tuple(range(100, 140))\n"
        "text = TokenizedText.from_spans(ids, 'x' * 40, [(i, i + 1) for i in range(40)])\n"
        "source = keyed.KeyedSource(keyed.Secret(bytes(32)))\n"
        "options = detector.DetectOptions(scores=detector.SCORE_NAMES, spans=True)\n"
        "found = detect_tokenized(text, frozenset(), source, options)\n"
        "assert found.num_scored == 36, found.num_scored\n"
        "print('torch' in sys.modules)\n"
    )
    assert fresh_python(code) == "False"
