"""The default install stays light: Ray is an optional extra (``poissonmark[ray]``), and
nothing on the default import path — the CLI with its corpus runner, the HTTP app — imports it
(fresh interpreter, ``sys.modules``). ``service.ray_corpus`` / ``service.ray_serve`` are
imported only by ``--engine ray`` and by Serve."""

from __future__ import annotations

from tests.fresh import fresh_python


def test_default_import_path_loads_no_ray() -> None:
    code = (
        "import sys\n"
        "import service.cli, service.cli.detect, service.cli.corpus, service.app\n"
        "print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
    )
    assert fresh_python(code) == "False"


def test_the_ray_modules_do_load_ray() -> None:
    """The negative control: the check above sees ray when it is imported."""
    import pytest

    pytest.importorskip("ray")
    code = (
        "import sys\nimport service.ray_corpus\n"
        "print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
    )
    assert fresh_python(code) == "True"
