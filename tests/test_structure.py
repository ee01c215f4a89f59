"""The shape of the assembly (issue 60): how far a batch travels, how deep a method's classes go,
how long the step is, and what the harness may know of the library."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

import eatta
from eatta.methods.registry import get_spec

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "eatta"


def _trace_tool():
    spec = importlib.util.spec_from_file_location("trace_batch", ROOT / "tools" / "trace_batch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Issue 60's bounds on one batch: (modules entered, moves between them) at most; issue 66 added
#: one module to every path, ``eatta.outputs`` (the one place a model's output is read), and
#: issue 67 one to eatta-safe's, its promise (``monitor/promise.py``).
BOUNDS = {"tent": (5, 12), "eatta": (14, 40), "eatta-safe": (20, 60)}


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_one_batch_travels_through_few_modules(name: str) -> None:
    path = _trace_tool().trace(name)
    modules, moves = len(set(path)), len(path) - 1
    most_modules, most_moves = BOUNDS[name]
    assert modules <= most_modules and moves <= most_moves, (
        f"{name}: {modules} modules, {moves} moves: {' -> '.join(path)}"
    )


def _library_depth(cls: type) -> int:
    return sum(1 for c in cls.__mro__ if c.__module__.startswith("eatta."))


@pytest.mark.parametrize("name", eatta.available())
def test_every_registered_method_is_at_most_three_library_classes_deep(name: str) -> None:
    trace_tool = _trace_tool()
    kw: dict = {"oracle": eatta.GroundTruthOracle()} if get_spec(name).active else {}
    if name == "eata":
        kw["fisher_data"] = [torch.randn(4, 3, 16, 16)]
    method = eatta.create(name, trace_tool.FeaturesClassifier(), **kw)
    assert _library_depth(type(method)) <= 3, [c.__qualname__ for c in type(method).__mro__]


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_the_step_is_on_one_screen() -> None:
    module = SRC / "methods" / "eatta.py"
    assert len(module.read_text().splitlines()) <= 300
    (step,) = [f for f in _functions(module) if f.name == "_step"]
    assert step.end_lineno is not None and step.end_lineno - step.lineno + 1 <= 60


def test_no_function_of_the_library_is_over_a_hundred_lines() -> None:
    long = [
        f"{path.relative_to(SRC)}:{f.name} ({f.end_lineno - f.lineno + 1})"
        for path in sorted(SRC.rglob("*.py"))
        for f in _functions(path)
        if f.end_lineno is not None and f.end_lineno - f.lineno + 1 > 100
    ]
    assert long == []


def _imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` for every ``from eatta... import name`` and ``import eatta...``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("eatta"):
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names if alias.name.startswith("eatta")]
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_the_harness_imports_only_public_names() -> None:
    private = [
        f"{path.name}: {module} {name}"
        for path in sorted((SRC / "bench").rglob("*.py"))
        for module, name in _imports(path)
        if not module.startswith("eatta.bench")
        and (_private(name) or any(_private(part) for part in module.split(".")))
    ]
    assert private == []


def test_the_harness_names_no_method_outside_its_tables() -> None:
    """A method's name appears in ``eatta.bench`` only in a module-level table (an assignment
    at the top of a module); its needs are data on its MethodSpec."""
    names = set(eatta.available())
    found = []
    for path in sorted((SRC / "bench").rglob("*.py")):
        tree = ast.parse(path.read_text())
        tables = {
            id(c)
            for stmt in tree.body
            if isinstance(stmt, ast.Assign | ast.AnnAssign)
            for c in ast.walk(stmt)
        }
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
        }
        found += [
            f"{path.name}:{n.lineno} {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant)
            and n.value in names
            and id(n) not in tables
            and id(n) not in docstrings
        ]
    assert found == []
