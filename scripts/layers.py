"""The layers of the code, read from its imports: the rooms, who imports whom, and the diagram.

    python scripts/layers.py            # writes docs/layers.md
    python scripts/layers.py --check    # exit 1 if docs/layers.md is not what the code gives

The import graph is read from the source (every ``import`` statement, function-level ones
included: a lazy import is still an arrow; ``if TYPE_CHECKING:`` blocks are left out unless
``typing=True``, they never run). A module ``a.b`` that imports ``a.c`` gives the edge b → c;
the implicit import of a parent package's ``__init__`` is not an edge. Rooms are groups of
modules (``ROOMS``, bottom first); ``tests/test_architecture.py`` holds that every arrow points
to the same room or one below it, and checks that ``docs/layers.md`` matches ``render()``.
Standard library only: nothing of ours is imported.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("keyed", "sampler", "detector", "service")
DIAGRAM = ROOT / "docs" / "layers.md"


def _in(*prefixes: str) -> Callable[[str], bool]:
    return lambda m: any(m == p or m.startswith(p + ".") for p in prefixes)


def _one_of(*names: str) -> Callable[[str], bool]:
    return lambda m: m in names


SAMPLER_LAWS = (
    "sampler._kernels",
    "sampler.compiled",
    "sampler.processing",
    "sampler.processing_config",
    "sampler.race",
    "sampler.topk",
    "sampler.tree",
)
"""The decoding core's leaf modules: laws, kernels and the draft tree, below the drafters
(a drafter fills a ``DraftTree`` and drafts from a processed law)."""

SERVICE_BASE = (
    "service",
    "service.contract",
    "service.errors",
    "service.metrics",
    "service.ratelimit",
    "service.settings",
)

ROOMS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("keyed", _in("keyed")),
    ("detector", _in("detector")),
    ("sampler.targets", _in("sampler.targets")),
    ("sampler (laws)", _one_of(*SAMPLER_LAWS)),
    ("sampler.drafters", _in("sampler.drafters")),
    ("sampler (core)", lambda m: _in("sampler")(m) and not _in("sampler.training")(m)),
    ("sampler.training", _in("sampler.training")),
    ("service (base)", _one_of(*SERVICE_BASE)),
    ("service.keys", _in("service.keys")),
    ("service.schemas", _in("service.schemas")),
    ("service.jobs", _in("service.jobs")),
    ("service.admission", _in("service.admission")),
    ("service.http", _in("service.http")),
    ("service.server", _in("service.server")),
    ("service.ray", _in("service.ray")),
    ("service.cli", _in("service.cli")),
)
"""Each module's room: the first that claims it (order matters only where two overlap:
targets, laws and drafters before the core). Bottom first within each package."""

ROOM_NAMES = tuple(name for name, _ in ROOMS)


def room_of(module: str) -> str:
    for name, claims in ROOMS:
        if claims(module):
            return name
    raise ValueError(f"expected a module of {', '.join(PACKAGES)}, got {module!r}")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(
    tree: ast.AST,
    module: str,
    is_package: bool,
    known: frozenset[str] = frozenset(),
    typing: bool = False,
) -> list[str]:
    """Absolute names each import statement of ``tree`` asks for; the caller keeps those that
    are modules. ``from a import b`` gives ``a.b``, and ``a`` too unless ``a.b`` is one of
    ``known`` (then it only reaches the submodule, as ``import a.b`` would). ``typing``: the
    imports under ``if TYPE_CHECKING:`` count too."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing:
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
            if not all(n in known for n in names):
                out.append(base)
            out.extend(names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    """Module → the modules of ours it imports (``typing``: ``TYPE_CHECKING`` imports too)."""
    found = modules()
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        wanted = imported(tree, name, path.name == "__init__.py", frozenset(found), typing)
        graph[name] = {w for w in wanted if w in found and w != name}
    return graph


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room → the other rooms its modules import."""
    rooms: dict[str, set[str]] = {name: set() for name in ROOM_NAMES}
    for module, targets in graph.items():
        here = room_of(module)
        rooms[here] |= {room_of(t) for t in targets} - {here}
    return rooms


def reduced(rooms: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows a longer path does not imply (transitive reduction of an acyclic graph)."""

    def reach(start: str, skip: str) -> set[str]:
        seen: set[str] = set()
        todo = [t for t in rooms[start] if t != skip]
        while todo:
            room = todo.pop()
            if room not in seen:
                seen.add(room)
                todo.extend(rooms[room])
        return seen

    return {a: {b for b in targets if b not in reach(a, b)} for a, targets in rooms.items()}


def _short(module: str, room: str, packages: set[str]) -> str:
    """A module's name within its room (``__init__`` for a package's own module)."""
    prefix = room.split(" ")[0]
    if module in packages and (module == prefix or room.endswith(")")):
        return "`__init__`"
    if module == prefix or room.endswith(")"):  # a module room, or a package's top level
        return f"`{module.rsplit('.', 1)[-1]}`"
    return f"`{module[len(prefix) + 1 :]}`"


def render() -> str:
    """docs/layers.md: the rooms and their modules, and the diagram of the room arrows."""
    graph = import_graph()
    rooms = room_graph(graph)
    packages = {m for m, path in modules().items() if path.name == "__init__.py"}
    members: dict[str, list[str]] = {name: [] for name in ROOM_NAMES}
    for module in sorted(graph):
        members[room_of(module)].append(module)
    ids = {name: f"r{i}" for i, name in enumerate(ROOM_NAMES)}
    lines = [
        "# Layers",
        "",
        "Generated by `python scripts/layers.py` from the code's imports; "
        "`tests/test_architecture.py` fails when this file is stale. Rooms top to bottom; an "
        "arrow is an import (arrows that a longer path implies are left out). Every arrow "
        "points down: docs/design.md §1 says what each room may import.",
        "",
        "```mermaid",
        "flowchart TD",
    ]
    for name in reversed(ROOM_NAMES):
        lines.append(f'    {ids[name]}["{name}"]')
    for name in reversed(ROOM_NAMES):
        for target in sorted(reduced(rooms)[name], key=ROOM_NAMES.index, reverse=True):
            lines.append(f"    {ids[name]} --> {ids[target]}")
    lines += ["```", "", "| room | modules | imports (rooms) |", "|---|---|---|"]
    for name in reversed(ROOM_NAMES):
        if name in ("keyed", "detector"):  # a room of its own: see its package
            short = f"the `{name}` package"
        else:
            short = ", ".join(_short(m, name, packages) for m in members[name])
        below = ", ".join(sorted(rooms[name], key=ROOM_NAMES.index, reverse=True)) or "—"
        lines.append(f"| {name} | {short} | {below} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if DIAGRAM.read_text(encoding="utf-8") != text:
            sys.stderr.write("docs/layers.md is stale: run python scripts/layers.py\n")
            return 1
        return 0
    DIAGRAM.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
