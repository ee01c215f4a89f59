"""A run's CPU peak memory is its own: an earlier, bigger run in the same process does not hide
it (the high-water mark is reset at the run's start; Linux only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from eatta.bench import runner

# in a fresh interpreter: what other tests left in this process's heap cannot blur the numbers
_SCRIPT = """
import json, torch
from eatta.bench import runner
cpu = torch.device("cpu")
first = runner._memory_start()
big = torch.ones(400 * 2**18)          # 400 MB, every page written
peaks = [first[1], runner._peak(cpu, first, None)]
del big                                 # freed: getrusage's lifetime peak stays ~400 MB higher
second = runner._memory_start()
small = torch.ones(100 * 2**18)
peaks.append(runner._peak(cpu, second, None))
peaks.append(runner._peak(cpu, runner._memory_start(), 500.0))
print(json.dumps(peaks))
"""


@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK), reason="needs /proc/self/clear_refs"
)
def test_a_run_after_a_bigger_one_reports_its_own_peak():
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    reset, first, second, resumed = json.loads(done.stdout)
    assert reset is True
    assert first >= 380
    assert 90 <= second <= 140  # was ~0: measured against the 400 MB run's lifetime peak
    assert resumed == 500.0  # an earlier session's larger peak (a resumed run) is kept


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
