"""Shared fixtures: the data dir and the real SmolLM2 model/tokenizer (loaded once per session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sampler.models import DEFAULT_MODEL, LoadedModel, load_model, load_tokenizer

DATA = Path(__file__).resolve().parents[1] / "data"


def _data_dir() -> Path:
    # Tests share the converted-model cache with the CLI so the GGUF is converted once per machine.
    return Path(os.environ.get("POISSONMARK_HOME", "~/.local/share/poissonmark")).expanduser()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return _data_dir()


@pytest.fixture(scope="session")
def data_files() -> Path:
    """The repository's copy of the shared prompts and human text (``data/``)."""
    return DATA


@pytest.fixture(scope="session")
def real_tokenizer(data_dir: Path):  # type: ignore[no-untyped-def]
    return load_tokenizer(DEFAULT_MODEL, data_dir)


@pytest.fixture(scope="session")
def real_model(data_dir: Path) -> LoadedModel:
    return load_model(DEFAULT_MODEL, data_dir, device="cpu")
