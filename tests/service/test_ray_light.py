"""The default install stays light: Ray is an optional extra (``poissonmark[ray]``), and
nothing on the default import path — the CLI with its corpus runner, the HTTP app — imports it
(fresh interpreter, ``sys.modules``). ``service.ray.corpus`` / ``service.ray.serve`` are
imported only by ``--engine ray`` and by Serve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fresh import fresh_python


def test_default_import_path_loads_no_ray() -> None:
    code = (
        "import sys\n"
        "import service.cli, service.cli.detect, service.jobs.corpus, service.http.app\n"
        "print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
    )
    assert fresh_python(code) == "False"


def test_the_ray_modules_do_load_ray() -> None:
    """The negative control: the check above sees ray when it is imported."""
    import pytest

    pytest.importorskip("ray")
    code = (
        "import sys\nimport service.ray.corpus\n"
        "print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))"
    )
    assert fresh_python(code) == "True"


def test_engine_ray_without_the_extra_says_how_to_install_it(
    tmp_path: Path, data_dir: Path
) -> None:
    """``--engine ray`` where ray cannot be imported: exit 2 and the pip command, no
    traceback (``sys.modules["ray"] = None`` makes the import fail as in a default install)."""
    home = tmp_path / "home"
    home.mkdir()
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(data_dir / "models", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POISSONMARK_KEK")}
    env["POISSONMARK_HOME"] = str(home)
    cli = [
        sys.executable,
        "-c",
        "import sys; sys.modules['ray'] = None\nfrom service.cli import main; main()",
    ]
    created = subprocess.run(
        [*cli, "keys", "create", "--json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert created.returncode == 0, created.stderr
    corpus = tmp_path / "in.jsonl"
    corpus.write_text('{"id": "a", "text": "Some text."}\n', encoding="utf-8")
    key = json.loads(created.stdout)["key_id"]
    args = ["detect", "--key", key, "--jsonl", str(corpus), "--engine", "ray"]
    found = subprocess.run([*cli, *args], env=env, capture_output=True, text=True, timeout=300)
    assert found.returncode == 2, found.stderr
    assert "pip install 'poissonmark[ray]'" in found.stderr
    assert "Traceback" not in found.stderr
