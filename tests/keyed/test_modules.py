"""The layout of ``keyed`` (docs/design.md §1-§2): torch only behind ``keyed.tensor``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fresh import fresh_python

KEYED = Path(__file__).resolve().parents[2] / "keyed"


def test_import_keyed_loads_no_torch_and_keyed_tensor_does() -> None:
    code = (
        "import sys, keyed, keyed.prf, keyed.philox, keyed.context, keyed._kernel_loader\n"
        "before = 'torch' in sys.modules\n"
        "import keyed.tensor\n"
        "print(before, 'torch' in sys.modules)\n"
    )
    assert fresh_python(code) == "False True"


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
