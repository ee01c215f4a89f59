"""Shared fixtures: tiny BatchNorm classifiers and batches, deterministic."""

from __future__ import annotations

import copy
import importlib.util
import io
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import settings
from torch import nn

GOLDEN_DIR = Path(__file__).parent / "golden"

# Derandomized property tests: CI and every developer explore the same examples.
settings.register_profile("eatta", derandomize=True, deadline=None)
settings.load_profile("eatta")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker: no oversubscription on 2 cores
    torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``small_batches`` adapts on small batches on purpose: eatta's
    ``SmallBatchWarning`` is expected there and filtered (one place to follow a rename)."""
    from eatta import SmallBatchWarning

    spec = f"ignore::{SmallBatchWarning.__module__}.{SmallBatchWarning.__qualname__}"
    for item in items:
        if item.get_closest_marker("small_batches") is not None:
            item.add_marker(pytest.mark.filterwarnings(spec))


def tiny_cnn(num_classes: int = 5, width: int = 8, seed: int = 0) -> nn.Sequential:
    """conv-BN-ReLU ×2, pool, Linear: a Sequential so eatta's split is automatic."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )


def confident_cnn(num_classes: int = 5, seed: int = 0) -> nn.Sequential:
    """A tiny CNN whose head is scaled up so many predictions pass the 0.4 ln C entropy margin."""
    model = tiny_cnn(num_classes, seed=seed)
    with torch.no_grad():
        model[-1].weight.mul_(8.0)
    return model


@pytest.fixture
def make_model():
    return tiny_cnn


@pytest.fixture
def make_confident_model():
    return confident_cnn


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 5, (16,), generator=g)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def image_batches(n: int, size: int = 8, seed: int = 0) -> list[torch.Tensor]:
    """``n`` batches of ``size`` random 3×8×8 images in [0, 1] (CoTTA's input range)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(size, 3, 8, 8, generator=g) for _ in range(n)]


def nested_equal(a: object, b: object) -> bool:
    """Exact equality of nested dicts / lists / tuples of tensors and plain values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(nested_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(nested_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.fixture
def make_image_batches():
    return image_batches


@pytest.fixture
def assert_nested_equal():
    def check(a: object, b: object) -> None:
        assert nested_equal(a, b)

    return check


def bytes_round_trip(state: dict) -> dict:
    """``state`` through ``torch.save`` / ``torch.load(weights_only=True)``, as a checkpoint."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.fixture
def checkpoint_round_trip():
    return bytes_round_trip


#: Batches every method must reject (for 3x8x8 inputs), built fresh per use.
BAD_BATCHES = {
    "empty": lambda: torch.rand(0, 3, 8, 8),
    "int": lambda: torch.zeros(8, 3, 8, 8, dtype=torch.long),
    "nan": lambda: torch.full((8, 3, 8, 8), float("nan")),
}


def check_rejects_without_change(method: nn.Module, warmup: torch.Tensor, bad: str) -> None:
    """After one good batch, ``method(BAD_BATCHES[bad]())`` raises and changes no state."""
    from eatta.methods.base import InvalidInputError

    method(warmup)
    before = copy.deepcopy(method.state_dict())
    with pytest.raises(InvalidInputError):
        method(BAD_BATCHES[bad]())
    assert nested_equal(method.state_dict(), before)


@pytest.fixture(scope="session")
def site_hooks() -> ModuleType:
    """``docs/_hooks.py`` as a module (it needs mkdocs: skipped without the docs extra).

    Here and not in ``tests/docs/conftest.py``: a second ``conftest`` module would shadow this
    one for the tests that import its helpers."""
    pytest.importorskip("mkdocs")
    path = Path(__file__).resolve().parents[1] / "docs" / "_hooks.py"
    spec = importlib.util.spec_from_file_location("_docs_hooks", path)
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hooks  # its dataclass looks its module up
    spec.loader.exec_module(hooks)
    return hooks


@pytest.fixture(scope="module")
def one_thread():
    """One thread for a module of tiny-model tests: fastest, and immune to a busy machine's
    scheduling (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
