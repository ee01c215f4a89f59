"""Fixtures of the model tests: one torch thread, as in the harness tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread per test (restored afterwards): on a busy 2-core machine intra-op
    threads slow the tiny models down many times over."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
