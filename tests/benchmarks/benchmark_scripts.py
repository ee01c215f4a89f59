"""Loading a script of ``benchmarks/`` as a module for its tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextmanager
def benchmark_script(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` imported as module ``name``, with ``benchmarks/`` on
    ``sys.path`` for its neighbours (``_common``, ``_study``); both undone on exit."""
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(str(BENCHMARKS))
