"""The layout of ``keyed`` (DESIGN §1-§2): torch only behind ``keyed.tensor``, small modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

KEYED = Path(__file__).resolve().parents[2] / "keyed"


def _fresh_python(code: str) -> str:
    """What ``code`` prints in a new interpreter at the repository root."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=KEYED.parent,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout.strip()


def test_import_keyed_loads_no_torch_and_keyed_tensor_does() -> None:
    code = (
        "import sys, keyed, keyed.prf, keyed.philox, keyed.context, keyed._kernel_loader\n"
        "before = 'torch' in sys.modules\n"
        "import keyed.tensor\n"
        "print(before, 'torch' in sys.modules)\n"
    )
    assert _fresh_python(code) == "False True"


def test_keyed_exports_no_tensor_function() -> None:
    """The torch path is reached through ``keyed.tensor`` alone (no lazy attribute on
    ``keyed``): the package namespace holds no name of it."""
    import keyed
    import keyed.tensor

    tensor_names = {"clock_uniforms", "exponential_clocks", "keys_tensor", "philox4x32_10",
                    "uniforms_from_keys"}  # fmt: skip
    assert tensor_names <= set(vars(keyed.tensor))
    assert not tensor_names & set(keyed.__all__)
    assert not hasattr(keyed, "__getattr__")


@pytest.mark.parametrize("path", sorted(KEYED.glob("*.py")), ids=lambda p: p.name)
def test_keyed_modules_are_small(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 400
