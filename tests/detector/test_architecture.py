"""DESIGN §1: imports flow one way; the detector never imports the sampler."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=DETECTOR.parent,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "[]"
