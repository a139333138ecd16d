"""docs/design.md §1: imports flow one way between the packages and between the rooms inside
them, and no module imports itself back.

The import graph is read from the source by ``scripts/layers.py`` (every ``import`` statement,
function-level ones included: a lazy import that breaks a cycle is still a cycle; ``if
TYPE_CHECKING:`` blocks are left out of the layering, they never run, but not out of the
cycle check: two modules that name each other's types are still tied together). A module
``a.b`` that imports ``a.c`` gives the edge b → c; the implicit import of a parent package's
``__init__`` is not an edge.
"""

from __future__ import annotations

import ast

import pytest

from scripts.layers import (
    DIAGRAM,
    PACKAGES,
    ROOM_NAMES,
    ROOMS,
    import_graph,
    modules,
    render,
    room_of,
)
from scripts.layers import imported as _imported

ALLOWED = {
    "keyed": set(),
    "sampler": {"keyed"},
    "detector": {"keyed"},
    "service": {"keyed", "sampler", "detector"},
}
"""What each package may import of ours (docs/design.md §1: keyed ← sampler, detector ← service)."""


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(found)


def test_no_import_cycle_in_the_packages() -> None:
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_flow_one_way(package: str) -> None:
    wrong = sorted(
        (module, target)
        for module, targets in import_graph(typing=True).items()
        if module.split(".")[0] == package
        for target in targets
        if (top := target.split(".")[0]) != package and top not in ALLOWED[package]
    )
    assert wrong == []


def test_the_cycle_finder_finds_cycles() -> None:
    """The checks above can fail: a lazy import back into a module is a cycle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    lazy = ast.parse("def f():\n    from sampler import decoder\n")
    assert "sampler.decoder" in _imported(lazy, "sampler.baselines", False)
    relative = ast.parse("from .tree import DraftTree\n")
    assert "sampler.tree" in _imported(relative, "sampler.decoder", False)
    assert "sampler.tree" in _imported(relative, "sampler", True)
    submodule = ast.parse("from keyed import prf\n")
    assert _imported(submodule, "keyed.context", False, frozenset({"keyed.prf"})) == ["keyed.prf"]
    assert "keyed" in _imported(submodule, "keyed.context", False)
    guarded = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sampler\n")
    assert "sampler" not in _imported(guarded, "detector.x", False)
    assert "sampler" in _imported(guarded, "detector.x", False, typing=True)


def test_no_import_cycle_even_through_type_checking_imports() -> None:
    """Two modules that only name each other's types are tied too: the lower one declares
    what it needs (e.g. ``sampler.targets.llamacpp_kv.LlamaBackend``) instead."""
    assert cycles(import_graph(typing=True)) == []


def test_every_module_has_a_room() -> None:
    assert all(room_of(module) in ROOM_NAMES for module in import_graph())


def test_imports_point_to_the_same_room_or_below() -> None:
    """The rooms, bottom first, are ``scripts.layers.ROOMS`` (docs/design.md §1, docs/layers.md):
    inside ``sampler`` targets ← laws ← drafters ← core ← training, inside ``service`` base ←
    keys ← schemas ← jobs ← admission ← http ← server ← ray ← cli."""
    rank = {name: i for i, name in enumerate(ROOM_NAMES)}
    upward = sorted(
        (module, target)
        for module, targets in import_graph(typing=True).items()
        for target in targets
        if rank[room_of(target)] > rank[room_of(module)]
    )
    assert upward == []


def _imports_of(room_prefix: str) -> list[tuple[str, str]]:
    return sorted(
        (module, target)
        for module, targets in import_graph(typing=True).items()
        if module == room_prefix or module.startswith(room_prefix + ".")
        for target in targets
    )


TARGETS_NEVER = (
    "sampler.drafters",
    "sampler.loop",
    "sampler.decoder",
    "sampler.batch",
    "sampler.autotree",
    "sampler.training",
)


def test_targets_never_import_drafters_the_loop_the_decoder_or_the_chooser() -> None:
    """A target is the model P alone: it never reaches a drafter, the step loop, the decoder,
    the batch or the tree chooser (its forward profile is its own: ``sampler.targets.profile``).
    Only ``keyed`` and the other targets."""
    wrong = [
        (module, target)
        for module, target in _imports_of("sampler.targets")
        if any(target == n or target.startswith(n + ".") for n in TARGETS_NEVER)
        or not (target.startswith("sampler.targets") or target.split(".")[0] == "keyed")
    ]
    assert wrong == []


DRAFTERS_REACH_TARGETS_THROUGH = {
    "sampler.targets.base",
    "sampler.targets.transformers",
    "sampler.targets.cpu_features",
}
"""``targets.base`` (``Target``, ``TargetLM``), ``targets.transformers`` because a drafter
accepts a bare transformers model as its target (``as_target`` wraps it there) and a model
drafter runs on transformers' ``CachedLM``, and ``targets.cpu_features`` (the CPU's flags read
from ``/proc/cpuinfo``, no backend: the eagle level's 8-bit kernels depend on them too); never
a backend of its own choosing."""


def test_drafters_import_targets_only_through_base() -> None:
    wrong = [
        (module, target)
        for module, target in _imports_of("sampler.drafters")
        if target.startswith("sampler.targets") and target not in DRAFTERS_REACH_TARGETS_THROUGH
    ]
    assert wrong == []


def test_keys_never_import_sampler() -> None:
    """Key custody needs no model: ``service.keys`` imports neither ``sampler`` nor
    ``detector``, and of the service only its base modules."""
    wrong = [
        (module, target)
        for module, target in _imports_of("service.keys")
        if target.split(".")[0] in ("sampler", "detector")
        or (
            target.startswith("service")
            and room_of(target) not in ("service.keys", "service (base)")
        )
    ]
    assert wrong == []


def test_sampler_and_detector_never_import_each_other() -> None:
    graph = import_graph(typing=True)
    wrong = sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if {module.split(".")[0], target.split(".")[0]} == {"sampler", "detector"}
    )
    assert wrong == []


def test_the_rules_can_fail() -> None:
    """The room checks above see an upward arrow and a target reaching the loop."""
    assert room_of("sampler.targets.llamacpp") == "sampler.targets"
    assert room_of("sampler.tree") == "sampler (laws)"
    assert room_of("sampler.loop") == "sampler (core)"
    assert room_of("service.keys.store") == "service.keys"
    assert room_of("service.settings") == "service (base)"
    rank = {name: i for i, name in enumerate(ROOM_NAMES)}
    assert rank[room_of("sampler.loop")] > rank[room_of("sampler.targets.base")]
    assert rank[room_of("service.jobs.worker")] > rank[room_of("service.keys.store")]
    assert len(ROOMS) == len(ROOM_NAMES)


def test_the_layer_diagram_matches_the_code() -> None:
    """docs/layers.md is what ``python scripts/layers.py`` writes from the code's imports."""
    assert DIAGRAM.read_text(encoding="utf-8") == render(), "run: python scripts/layers.py"


MAX_LINES = {"keyed": 450, "service": 450, "sampler": 500, "detector": 500}
"""A module is one concept that reads in a sitting (STYLE 1): past these it is split by job."""


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_its_package_line_limit(package: str) -> None:
    limit = MAX_LINES[package]
    over = {
        name: count
        for name, path in modules().items()
        if name.split(".")[0] == package
        and (count := len(path.read_text(encoding="utf-8").splitlines())) > limit
    }
    assert over == {}, f"over {limit} lines"
