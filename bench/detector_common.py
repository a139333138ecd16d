"""Shared bits of the detector benchmarks: the bench key, the data dir, run metadata.

Every result file records the model, the hardware (platform, CPU, core count), the git commit
and the date (``bench.common.environment``), so a number can be traced to what produced it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from bench.common import RESULTS, environment
from keyed import KeyedSource, Secret

BENCH_KEY_NAME = "poissonmark-bench:detector"
MODEL = "smollm2-135m-instruct"
GENERATIONS = RESULTS / "detector_generations.jsonl"
DATA = Path(__file__).resolve().parents[1] / "data"


def bench_secret(name: str = BENCH_KEY_NAME) -> Secret:
    """A fixed, public benchmark secret (BLAKE2b of a name): reproducible, never a real key."""
    return Secret(hashlib.blake2b(name.encode(), digest_size=32).digest())


def bench_source(name: str = BENCH_KEY_NAME) -> KeyedSource:
    """The benchmark key's keyed source (m = 4, masking on)."""
    return KeyedSource(bench_secret(name), context_width=4, masking=True)


def data_home() -> Path:
    """The converted-model cache shared with the CLI and the tests (``POISSONMARK_HOME``)."""
    return Path(os.environ.get("POISSONMARK_HOME", "~/.local/share/poissonmark")).expanduser()


def run_metadata() -> dict[str, Any]:
    """Model, hardware (with the platform string), commit and date of this run."""
    env = environment()
    env["hardware"] = {**env["hardware"], "platform": platform.platform()}  # type: ignore[dict-item]
    return {"model": MODEL, **env}


def human_token_ids(tok: Any) -> list[list[int]]:
    """The 227 human passages of ``data/human-pydoc.jsonl`` as ``tok`` tokenizes them (no
    special tokens): the H0 texts of the detector benches."""
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
