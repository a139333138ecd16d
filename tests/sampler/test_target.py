"""One target interface (``sampler.targets.base.Target``): every backend implements it, the loader
returns it, and nothing reaches a backend through the transformers model's ``__dict__``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from sampler.targets.base import Target
from sampler.targets.cpu_bf16 import InvariantLlama
from sampler.targets.llamacpp import GgufTarget
from sampler.targets.static import StaticLlama
from sampler.targets.transformers import CachedLM, TransformersTarget, as_target, open_cache
from tests.sampler.conftest import tiny_llama

ROOT = Path(__file__).resolve().parents[2]


def _dict_uses(path: Path) -> list[int]:
    """Lines of ``path`` that read or write some object's ``__dict__``."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "__dict__"
    ]


def test_no_product_code_uses_a_models_dict() -> None:
    """No backend, profile or fingerprint is attached to (or read from) an object's
    ``__dict__`` anywhere in the packages."""
    found = {
        str(path.relative_to(ROOT)): lines
        for package in ("keyed", "sampler", "detector", "service")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := _dict_uses(path))
    }
    assert found == {}


def test_the_dict_finder_finds_a_use(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def f(model):\n    model.__dict__['x'] = 1\n")
    assert _dict_uses(planted) == [2]


@pytest.mark.parametrize("backend", [TransformersTarget, InvariantLlama, GgufTarget, StaticLlama])
def test_every_backend_is_a_target(backend: type) -> None:
    assert issubclass(backend, Target)
    for method in ("new_cache", "forward", "backend"):
        assert getattr(backend, method) is not getattr(Target, method), method


def test_a_bare_model_is_served_by_its_own_transformers_target() -> None:
    model = tiny_llama(0, layers=1)
    target = as_target(model)
    assert isinstance(target, TransformersTarget) and target.model is model
    assert as_target(model) is target  # one per model: its profile is measured once
    assert as_target(target) is target
    assert isinstance(open_cache(model), CachedLM)
    assert target.invariant  # float64
    assert not as_target(tiny_llama(0, layers=1).float()).invariant
    with pytest.raises(TypeError, match="Target or a transformers model"):
        as_target(object())  # type: ignore[arg-type]


def test_the_loader_returns_the_target_and_leaves_the_model_bare(real_model) -> None:  # type: ignore[no-untyped-def]
    """The real model as loaded (``auto``): its target is a ``Target`` over the same
    transformers model, which carries no backend of ours."""
    assert isinstance(real_model.target, Target)
    assert real_model.target.model is real_model.model
    assert not [k for k in vars(real_model.model) if k.startswith("_poissonmark")]
    if real_model.precision == "gguf":
        assert isinstance(real_model.target, GgufTarget)
        assert isinstance(open_cache(real_model.model), CachedLM)  # the bare model: its own


def test_a_replaced_model_brings_its_own_transformers_target(real_model) -> None:  # type: ignore[no-untyped-def]
    tiny = tiny_llama(0, layers=1)
    moved = dataclasses.replace(real_model, model=tiny, dtype=torch.float64)
    if isinstance(real_model.target, TransformersTarget):
        assert moved.target.model is tiny
    else:  # another backend stays what serves the loaded weights
        assert moved.target is real_model.target
