"""What every benchmark result records: model, hardware, commit, date."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DATA = Path(__file__).resolve().parents[1] / "data"
PROMPT_FILES = ("prompts-eli5.jsonl", "prompts-summarize.jsonl")
"""The shared prompt sets in ``DATA``: ELI5 questions and summarisation requests."""


MEASURED_CODE = ("keyed", "sampler", "detector", "service")
"""The packages whose uncommitted changes make a run's ``dirty_tree`` true."""


def environment() -> dict[str, object]:
    """Model-independent facts about this run: hardware, software, commit, date."""
    import torch  # here, not at import: bench.corpus_rate's workers must start without it

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=RESULTS.parent,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                # from the repository root: pathspecs are relative to the working directory
                # (run from bench/ they named nothing, so a modified tree read as clean)
                ["git", "status", "--porcelain", "-uno", "--", *MEASURED_CODE],
                capture_output=True,
                text=True,
                cwd=RESULTS.parents[1],
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", True
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "commit": commit,
        "dirty_tree": dirty,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "hardware": {
            "cpu": cpu,
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(),
        },
        "software": {"python": platform.python_version(), "torch": torch.__version__},
    }


def prompts_by_hash(name: str) -> list[dict[str, Any]]:
    """The records of the shared prompt file ``name`` in the order of the SHA-256 of their ids."""
    rows = [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    return rows


def shared_prompts(n: int) -> list[dict[str, Any]]:
    """n prompts, half ELI5 and half summarisation (an odd n's extra one ELI5), chosen by a
    fixed hash of their id."""
    counts = ((n + 1) // 2, n // 2)
    return [
        row
        for name, k in zip(PROMPT_FILES, counts, strict=True)
        for row in prompts_by_hash(name)[:k]
    ]
