"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, real_tokenizer) -> Path:
    """A tiny random Llama with the real tokenizer (49,152 ids, hidden 32): the CLI's distill
    path end to end in seconds (the real model's run is the benchmark's)."""
    from tests.tiny_models import real_vocab_llama

    path = tmp_path_factory.mktemp("tinyllm")
    real_vocab_llama(real_tokenizer, 2048).save_pretrained(path)
    real_tokenizer.save_pretrained(path)
    return path
