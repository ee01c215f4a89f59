"""Loading a script of the repository (``benchmarks/``, ``examples/``) as a module for its tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def repo_script(folder: str, name: str) -> Iterator[ModuleType]:
    """``<folder>/<name>.py`` imported as module ``name``, with its folder on ``sys.path`` for
    its neighbours (``_common``, ``_study``); both undone on exit."""
    where = str(REPO / folder)
    sys.path.insert(0, where)
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(where)


def benchmark_script(name: str) -> AbstractContextManager[ModuleType]:
    """``benchmarks/<name>.py`` (:func:`repo_script`)."""
    return repo_script("benchmarks", name)
