"""Run code in a new interpreter: what a fresh process imports is part of the architecture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str) -> str:
    """What ``code`` prints (stdout, stripped) in a new interpreter at the repository root.

    Raises:
        subprocess.CalledProcessError: the code failed (its stderr is on the exception).
    """
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout.strip()
