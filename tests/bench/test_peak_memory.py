"""A run's CPU peak memory is its own: an earlier, bigger run in the same process does not hide
it (the high-water mark is reset at the run's start; Linux only)."""

from __future__ import annotations

import os

import pytest
import torch

from eatta.bench import runner

CPU = torch.device("cpu")


def _touch(mb: int) -> torch.Tensor:
    return torch.ones(mb * 2**18)  # float32: 4 bytes each, every page written


@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK), reason="needs /proc/self/clear_refs"
)
def test_a_run_after_a_bigger_one_reports_its_own_peak():
    first = runner._memory_start()
    big = _touch(400)
    assert first[1] and runner._peak(CPU, first, None) >= 380
    del big  # freed: the process's lifetime peak (getrusage) stays ~400 MB above
    second = runner._memory_start()
    small = _touch(100)
    peak = runner._peak(CPU, second, None)
    assert 90 <= peak <= 140, peak
    del small
    # an earlier session's peak (a resumed run) is kept when larger
    assert runner._peak(CPU, runner._memory_start(), 500.0) == 500.0


def test_without_a_reset_the_lifetime_peak_is_the_baseline(monkeypatch):
    monkeypatch.setattr("builtins.open", _refuse_clear_refs(open))
    start = runner._memory_start()
    assert start[1] is False and start[0] == runner._max_rss_mb()


def _refuse_clear_refs(real):
    def fake(path, *args, **kwargs):
        if str(path) == "/proc/self/clear_refs":
            raise PermissionError(path)
        return real(path, *args, **kwargs)

    return fake
