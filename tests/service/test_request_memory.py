"""The largest detect request the default limits allow stays within a stated memory bound.

That request: a text of ``max_tokens`` (32,768) tokens, every option at its most (all score
families, spans, the re-aligned test, ``max_results`` 100, raw evidence), and the most keys
the default rate limit lets one request test at that length (20: 32,768 × (20 + 8·20)
token·keys is 590 units of the 600 a window holds). ``bench/request_memory.py`` runs it in a
fresh process with its address space capped (``RLIMIT_AS``): an allocation past the cap is a
``MemoryError`` there. Measured: ``bench/results/request_memory.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from service.jobs.detection import DETAILED_KEY_WEIGHT
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ADDRESS_SPACE_MIB = 512
"""What the request may add to the process's address space (``RLIMIT_AS``)."""
RESIDENT_BOUND_MIB = 256
"""What it may add to the resident set (measured: about 100 MiB)."""


def run_case(tokens: int, keys: int, limit_mib: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bench.request_memory", "--case", str(tokens), str(keys)]
    return subprocess.run(
        [*command, "--limit-mib", str(limit_mib)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_case_is_the_largest_the_default_limits_allow() -> None:
    settings = Settings.model_construct()
    budget = settings.detect_rate_limit * settings.detect_work_unit  # token·keys per window

    def work(keys: int) -> int:
        return settings.max_tokens * (keys + DETAILED_KEY_WEIGHT * min(keys, 100))

    assert work(20) <= budget < work(21)


def test_the_largest_default_request_fits_its_memory_bound() -> None:
    out = run_case(Settings.model_construct().max_tokens, 20, ADDRESS_SPACE_MIB)
    assert out.returncode == 0, out.stderr[-3000:]
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert (row["tokens"], row["keys"]) == (32_768, 20)
    assert 0 < row["peak_mib"] < RESIDENT_BOUND_MIB, row


def test_the_address_space_cap_bites() -> None:
    """The cap ``bench/request_memory.py`` sets (``RLIMIT_AS`` at the current address space plus
    a margin) is a real limit here: in a fresh process, an allocation past an 8 MiB margin fails
    with ``MemoryError`` while one within it succeeds. (The request itself is not run under so
    small a cap: an allocation failure inside a native library may abort or hang instead of
    raising.)"""
    code = (
        "import resource, numpy, psutil\n"
        "vms = psutil.Process().memory_info().vms\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vms + 8 * 2**20, hard))\n"
        "small = numpy.ones(2**18)  # 2 MiB: within the margin\n"
        "try:\n"
        "    numpy.ones(2**23)  # 64 MiB: past it\n"
        "except MemoryError:\n"
        "    print('MemoryError')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "MemoryError"
