"""``sampler.targets.cpu_features``: the flags are read from /proc/cpuinfo, and importing
``sampler`` sets the OpenMP wait policy only where the bfloat16 runner is the default (AMX bfloat16,
no llama.cpp installed) and only if nobody set it (each case in a fresh interpreter: the policy
is read when torch loads OpenMP)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sampler.targets.cpu_features import cpu_flags, cpu_model, native_bfloat16

ROOT = Path(__file__).resolve().parents[2]


def test_flags_come_from_the_first_cpu(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_flags(info) == frozenset({"fpu", "avx512f", "amx_bf16", "amx_tile"})
    assert cpu_model(info) == "X"
    assert cpu_flags(tmp_path / "missing") == frozenset()


def _policy_after(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport os; print(os.environ.get('OMP_WAIT_POLICY'))"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def _runner_is_default() -> bool:
    """The bfloat16 runner is precision auto's CPU choice: AMX bfloat16 and no llama.cpp."""
    return native_bfloat16() and importlib.util.find_spec("llama_cpp") is None


def test_importing_sampler_sets_passive_only_where_the_runner_is_the_default():
    expected = "PASSIVE" if _runner_is_default() else "None"
    assert _policy_after("import sampler.models") == expected


def test_a_policy_the_user_set_is_kept():
    assert _policy_after("import sampler.models", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


@pytest.mark.skipif(not _runner_is_default(), reason="the policy is set only where it would be")
def test_nothing_is_set_once_torch_is_loaded():
    assert _policy_after("import torch\nimport sampler.models") == "None"
