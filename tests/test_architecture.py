"""docs/design.md §1: imports flow one way between the packages, and no module imports itself back.

The import graph is read from the source (every ``import`` statement, function-level ones
included: a lazy import that breaks a cycle is still a cycle; ``if TYPE_CHECKING:`` blocks are
left out, they never run). A module ``a.b`` that imports ``a.c`` gives the edge b → c; the
implicit import of a parent package's ``__init__`` is not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("keyed", "sampler", "detector", "service")
ALLOWED = {
    "keyed": set(),
    "sampler": {"keyed"},
    "detector": {"keyed"},
    "service": {"keyed", "sampler", "detector"},
}
"""What each package may import of ours (docs/design.md §1: keyed ← sampler, detector ← service)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(
    tree: ast.AST, module: str, is_package: bool, modules: frozenset[str] = frozenset()
) -> list[str]:
    """Absolute names each import statement of ``tree`` asks for; the caller keeps those that
    are modules. ``from a import b`` gives ``a.b``, and ``a`` too unless ``a.b`` is one of
    ``modules`` (then it only reaches the submodule, as ``import a.b`` would)."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
            if not all(n in modules for n in names):
                out.append(base)
            out.extend(names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the modules of ours it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        wanted = _imported(tree, name, path.name == "__init__.py", frozenset(modules))
        graph[name] = {w for w in wanted if w in modules and w != name}
    return graph


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
        for module, targets in import_graph().items()
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
