"""Exact state comparison: every tensor and every generator state, bit for bit.

``repr`` would elide tensors over 1,000 elements (a CPU generator's state is 5,056 bytes) and round
floats, so a snapshot here is a deep copy compared with :func:`conftest.nested_equal`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from conftest import nested_equal


def exact_state(method: nn.Module) -> dict[str, Any]:
    """Model tensors, optimizer state, method state (RNGs, EMA, buffer, balance) and counters."""
    state: dict[str, Any] = {
        "model": {k: v.detach().clone() for k, v in method.model.state_dict().items()},
        "method": copy.deepcopy(method.method_state()),
        "torch_rng": torch.get_rng_state(),
        "labels_used": method.labels_used,
    }
    if method.optimizer is not None:
        state["optimizer"] = copy.deepcopy(method.optimizer.state_dict())
    return state


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where ``a`` and ``b`` differ (empty: exactly equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    return [] if nested_equal(a, b) else [path or "/"]


def assert_same_state(before: dict[str, Any], method: nn.Module) -> None:
    diff = differences(before, exact_state(method))
    assert not diff, f"state changed at {diff}"


def assert_reset_state(initial: dict[str, Any], method: nn.Module, spent: int) -> None:
    """The state after ``method.reset()`` is ``initial`` except the budget's lifetime count,
    which keeps the ``spent`` labels (a reset never lifts a total cap)."""
    expected = copy.deepcopy(initial)
    expected["method"]["budget"]["lifetime_used"] = spent
    assert_same_state(expected, method)
