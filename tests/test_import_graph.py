"""eatta's modules import one another without a cycle, imports inside functions included.

Every ``import`` / ``from ... import`` statement anywhere in a module (module level, inside
functions and classes, inside ``if TYPE_CHECKING:``) adds edges from that module to every eatta
module the statement may run or read:

- the module it names: ``import a.b.c``, ``from a.b.c import x``, and ``from a.b import c`` where
  ``a.b.c`` is a module, each an edge to ``a.b.c``;
- the packages Python initializes on the way (``a`` and ``a.b`` for ``a.b.c``), except the
  importing module's own ancestors: Python starts those before the importing module itself, so
  reaching them again runs nothing (counting them would make every package whose ``__init__``
  imports a submodule a cycle). ``eatta.monitor.x`` importing ``eatta.methods.base`` is an edge
  to ``eatta.methods`` (its ``__init__`` runs); ``eatta.methods.tent`` importing
  ``eatta.methods.registry`` is not;
- a package whose names the statement reads (``from eatta import create``,
  ``from eatta.methods import EATTA``): an edge to that package's ``__init__`` even from one of
  its own submodules, since the name may not be bound yet;
- a package's ``__init__`` importing its own submodules: an edge like any other.

``TYPE_CHECKING`` imports never execute; they are counted anyway, so that the layers hold for
the type checker too.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "eatta"


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out: dict[str, Path] = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _absolute(node: ast.ImportFrom, module: str, modules: dict[str, Path]) -> str:
    """The dotted name a ``from`` statement reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module, modules):
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _executed(target: str, module: str, modules: dict[str, Path]) -> set[str]:
    """The modules that importing ``target`` from ``module`` may run: ``target`` and its parent
    packages, less ``module``'s own ancestors (already started before ``module`` was)."""
    parts = target.split(".")
    prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {p for p in prefixes if p in modules and not (module + ".").startswith(p + ".")}


def _targets(module: str, tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The eatta modules ``module``'s import statements run or read (see the module docstring)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out |= _executed(alias.name, module, modules)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, modules)
            if source not in modules:
                continue
            out |= _executed(source, module, modules)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in modules:
                    out |= _executed(sub, module, modules)
                else:  # a name of ``source``'s namespace, which may not be bound yet
                    out.add(source)
    out.discard(module)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the eatta modules it imports."""
    modules = _modules()
    return {
        name: _targets(name, ast.parse(path.read_text(encoding="utf-8")), modules)
        for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return [*path[path.index(child) :], child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph[child])))
    return None


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "eatta.methods.tent" in graph["eatta.methods"]  # a package importing a submodule
    assert "eatta.methods.registry" in graph["eatta.methods.tent"]
    assert "eatta.split" in graph["eatta"]


def test_find_cycle_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}) is None


def test_function_level_imports_are_edges() -> None:
    tree = ast.parse("def f():\n    from eatta.methods import tent\n    import eatta.budget\n")
    expected = {"eatta.methods", "eatta.methods.tent", "eatta.budget"}  # the package's init runs
    assert _targets("eatta.x", tree, _modules()) == expected


def test_an_ancestor_is_an_edge_only_where_its_names_are_read() -> None:
    modules = _modules()
    tree = ast.parse("from eatta.methods.base import AdaptiveMethod\nfrom eatta import budget\n")
    assert _targets("eatta.methods.tent", tree, modules) == {"eatta.methods.base", "eatta.budget"}
    tree = ast.parse("from eatta.methods import EATTA\n")
    assert _targets("eatta.methods.tent", tree, modules) == {"eatta.methods"}
    tree = ast.parse("from . import base\nfrom .. import budget\n")  # relative imports
    assert _targets("eatta.methods.tent", tree, modules) == {"eatta.methods.base", "eatta.budget"}


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
