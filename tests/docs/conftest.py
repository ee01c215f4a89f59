"""The site's hook module (docs/_hooks.py), loaded as the tests need it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def site_hooks() -> ModuleType:
    """``docs/_hooks.py`` as a module (it needs mkdocs: skipped without the docs extra)."""
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("_docs_hooks", REPO / "docs" / "_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hooks  # its dataclass looks its module up
    spec.loader.exec_module(hooks)
    return hooks
