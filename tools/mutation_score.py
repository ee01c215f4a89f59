#!/usr/bin/env python
"""Mutation score of the core modules: how many small bugs the tests catch (not run in CI).

Each mutant changes one operator or constant of one module (``<`` to ``<=``, ``+`` to ``-``,
``and`` to ``or``, ``True`` to ``False``, an integer ``n`` to ``n + 1``, ``not x`` to ``x``,
``x[-1:]`` style slice bounds shifted); docstrings, annotations and error messages are left
alone. The mutant replaces the module in a private copy of ``src/`` and every test file that covers
the module runs against it (``pytest -x``); a mutant is *killed* when a test fails, the import
fails or the tests time out. Mutants are sampled (seeded) when a module has more sites than
``--per-module``; ``--per-module 0`` runs them all.

Usage::

    python tools/mutation_score.py --per-module 0 --jobs 2 --out after.json   # the full score
    python tools/mutation_score.py --modules debias/gradnorm.py --per-module 0 # one module
    python tools/mutation_score.py --root ../old-checkout --per-module 0       # an older commit

``--root`` scores another checkout with its own tests (modules or test files it lacks are left
out), so a before/after comparison runs the same tool on both. Results and the surviving
mutants' lines: benchmarks/results/mutation_score.md.

Heavy on CPU: run it alone, in the background.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

#: module (under src/eatta) -> the test files that cover it, fastest and most targeted first so a
#: killed mutant stops early (``pytest -x``). Files a checkout lacks are left out (older checkouts).
_STEP_TESTS = [
    "tests/methods/test_eatta.py",
    "tests/methods/test_eatta_perf_options.py",
    "tests/test_golden.py",
    "tests/methods/test_active_contract.py",
    "tests/methods/test_eatta_variants.py",
]
MODULE_TESTS: dict[str, list[str]] = {
    "methods/eatta.py": _STEP_TESTS,
    "methods/step_options.py": _STEP_TESTS,
    "methods/_grads.py": ["tests/methods/test_grads.py", *_STEP_TESTS],
    "debias/gradnorm.py": [
        "tests/debias/test_gradnorm_properties.py",
        "tests/debias/test_bounded.py",
        *_STEP_TESTS,
    ],
    "balance.py": [
        "tests/test_balance_properties.py",
        "tests/selection/test_perturbation.py",
        *_STEP_TESTS,
    ],
    "budget.py": ["tests/test_budget_oracle_buffer.py", *_STEP_TESTS],
    "oracle.py": ["tests/test_budget_oracle_buffer.py", *_STEP_TESTS],
    "buffer.py": ["tests/test_budget_oracle_buffer.py", *_STEP_TESTS],
    "selection/perturbation.py": [
        "tests/selection/test_perturbation.py",
        "tests/selection/test_selectors.py",
        *_STEP_TESTS,
    ],
}
#: Tests that start a fresh interpreter (slow, and they test packaging, not the module).
_DESELECT = "not new_process"
_OUTCOMES = ("killed", "error", "timeout", "survived")

_CMP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BIN = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
}


@dataclass(frozen=True)
class Site:
    """One mutation: the ``index``-th mutable node in walk order, and what it becomes."""

    index: int
    line: int
    kind: str


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """Nodes inside docstrings, annotations, f-strings (messages) and ``__all__``."""
    skip: set[int] = set()

    def drop(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            drop(node.returns)
            for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                drop(a.annotation)
        if isinstance(node, ast.AnnAssign):
            drop(node.annotation)
        if isinstance(node, ast.JoinedStr):
            drop(node)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            drop(node)
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                drop(body[0])
    return skip


def _candidates(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    skip = _skipped_nodes(tree)
    out: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare) and type(node.ops[0]) in _CMP:
            out.append((node, "compare"))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            out.append((node, "arithmetic"))
        elif isinstance(node, ast.BoolOp):
            out.append((node, "boolean"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            out.append((node, "unary"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            out.append((node, "bool-constant"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            out.append((node, "number"))
    return out


def _apply(node: ast.AST, kind: str) -> ast.AST:
    """The mutated replacement of ``node`` (a new node, or ``node`` changed in place)."""
    if kind == "compare":
        node.ops[0] = _CMP[type(node.ops[0])]()  # type: ignore[attr-defined]
    elif kind == "arithmetic":
        node.op = _BIN[type(node.op)]()  # type: ignore[attr-defined]
    elif kind == "boolean":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()  # type: ignore[attr-defined]
    elif kind == "unary":
        return node.operand  # type: ignore[attr-defined]
    elif kind == "bool-constant":
        node.value = not node.value  # type: ignore[attr-defined]
    elif kind == "number":
        value = node.value  # type: ignore[attr-defined]
        node.value = value + 1 if value != 0 else 1  # type: ignore[attr-defined]
    return node


def sites(source: str) -> list[Site]:
    tree = ast.parse(source)
    return [Site(i, getattr(n, "lineno", 0), kind) for i, (n, kind) in enumerate(_candidates(tree))]


def mutate(source: str, site: Site) -> str:
    tree = ast.parse(source)
    node, kind = _candidates(tree)[site.index]
    new = _apply(node, kind)
    if new is not node:  # replace the node in its parent
        for parent in ast.walk(tree):
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, new)
                elif isinstance(value, list):
                    for j, item in enumerate(value):
                        if item is node:
                            value[j] = new
    return ast.unparse(tree)


def describe(source: str, mutant: str) -> str:
    """The changed line, ``before -> after``, from the unparsed original and mutant."""
    a, b = ast.unparse(ast.parse(source)).splitlines(), mutant.splitlines()
    changed = [(x.strip(), y.strip()) for x, y in zip(a, b, strict=False) if x != y]
    return " | ".join(f"{x} -> {y}" for x, y in changed[:2])


def present_tests(root: Path, module: str) -> list[str]:
    """The module's test files that exist in ``root`` (older checkouts lack some)."""
    return [t for t in MODULE_TESTS[module] if (root / t).exists()]


def run_tests(root: Path, src: Path, tests: list[str], timeout: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-o",
        "addopts=",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-k",
        _DESELECT,
        *tests,
    ]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    # pytest: 0 all passed, 1 a test failed, 2+ collection/import error (the mutant broke import).
    return "survived" if proc.returncode == 0 else ("killed" if proc.returncode == 1 else "error")


def _score_module(
    root: Path, module: str, chosen: list[Site], args: argparse.Namespace, started: float
) -> list[dict[str, object]]:
    """Run ``chosen`` mutants of ``module`` in a private copy of ``src/`` (one worker)."""
    tests = present_tests(root, module)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(root / "src", src)
        path = src / "eatta" / module
        original = path.read_text()
        for site in chosen:
            if time.monotonic() - started > args.time_cap:
                break
            mutant = mutate(original, site)
            path.write_text(mutant)
            try:
                outcome = run_tests(root, src, tests, args.timeout)
            finally:
                path.write_text(original)
            row = {"index": site.index, "line": site.line, "kind": site.kind, "outcome": outcome}
            if outcome == "survived":
                row["change"] = describe(original, mutant)
            rows.append(row)
            print(f"{module}#{site.index}:{site.line} {site.kind}: {outcome}", flush=True)
    return rows


def _parse_only(items: list[str], p: argparse.ArgumentParser) -> dict[str, set[int]]:
    """``["balance.py#22", ...]`` -> ``{"balance.py": {22}}``; unknown modules are errors."""
    out: dict[str, set[int]] = {}
    for item in items:
        module, sep, index = item.partition("#")
        if not sep or module not in MODULE_TESTS or not index.isdigit():
            p.error(f"--only takes MODULE#INDEX with MODULE one of {list(MODULE_TESTS)}: {item!r}")
        out.setdefault(module, set()).add(int(index))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=Path.cwd(), help="checkout to test (default: cwd)")
    p.add_argument(
        "--modules", nargs="+", default=None, choices=list(MODULE_TESTS), help="default: all"
    )
    p.add_argument(
        "--per-module", type=int, default=None, help="mutants per module (0: all; default 15)"
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the sampling (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="modules scored in parallel")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    p.add_argument("--time-cap", type=float, default=3600.0, help="stop after this many seconds")
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    p.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="MODULE#INDEX",
        help="run just these mutants (as the log names them), e.g. balance.py#22",
    )
    args = p.parse_args(argv)
    only = _parse_only(args.only, p) if args.only is not None else None
    sampling = ("modules", "per_module", "seed")
    given = [f"--{k.replace('_', '-')}" for k in sampling if getattr(args, k) is not None]
    if only is not None and given:
        p.error(f"--only names its mutants; it does not combine with {', '.join(given)}")
    args.modules = args.modules or list(MODULE_TESTS)
    args.per_module = 15 if args.per_module is None else args.per_module
    args.seed = 0 if args.seed is None else args.seed
    root = args.root.resolve()
    started = time.monotonic()
    wanted = list(only) if only is not None else args.modules
    modules = [m for m in wanted if (root / "src" / "eatta" / m).exists()]
    for m in sorted(set(wanted) - set(modules)):
        print(f"{m}: not in {root}; skipped", file=sys.stderr)
    plan: dict[str, tuple[int, list[Site]]] = {}
    for module in modules:
        found = sites((root / "src" / "eatta" / module).read_text())
        rng = random.Random(f"{args.seed}:{module}")
        chosen = (
            [s for s in found if s.index in only[module]]
            if only is not None
            else found
            if args.per_module <= 0
            else sorted(rng.sample(found, min(args.per_module, len(found))), key=lambda s: s.index)
        )
        if only is not None and len(chosen) != len(only[module]):
            p.error(f"{module} has mutants #0 to #{len(found) - 1}: {sorted(only[module])}")
        plan[module] = (len(found), chosen)
    baseline = run_tests(
        root,
        root / "src",
        sorted({t for m in modules for t in present_tests(root, m)}),
        args.timeout,
    )
    if baseline != "survived":
        print(f"the unmutated tests do not pass ({baseline}); no score", file=sys.stderr)
        return 2
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            m: pool.submit(_score_module, root, m, chosen, args, started)
            for m, (_, chosen) in plan.items()
        }
        results = {m: f.result() for m, f in futures.items()}
    total = [r for rows in results.values() for r in rows]
    killed = sum(r["outcome"] != "survived" for r in total)
    summary = {
        "root": str(root),
        "mutants": len(total),
        "killed": killed,
        "score": killed / len(total) if total else None,
        "per_module": {
            m: {
                "sites": plan[m][0],
                "mutants": len(rows),
                "killed": sum(r["outcome"] != "survived" for r in rows),
                "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in _OUTCOMES},
                "survivors": [r for r in rows if r["outcome"] == "survived"],
            }
            for m, rows in results.items()
        },
        "seconds": round(time.monotonic() - started),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "per_module"}))
    for m, s in summary["per_module"].items():
        print(f"  {m}: {s['killed']}/{s['mutants']} killed ({s['sites']} sites)")
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
