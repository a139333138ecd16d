"""Detector fixtures: the human passages (unwatermarked text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def human_passages(data_files: Path) -> list[str]:
    """The 227 human-written Python-doc passages of ``data/human-pydoc.jsonl``."""
    with (data_files / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]
