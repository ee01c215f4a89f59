"""Reference parity: the golden traces replayed through the public API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import GOLDEN_DIR
from eatta.golden import replay_trace

# the authors' golden traces are batches of 16: small on purpose (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

TRACES = sorted(GOLDEN_DIR.glob("*.pt"))
TOOL = Path(__file__).parents[1] / "tools" / "replay_golden.py"


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_trace_reproduced_within_tolerance(path):
    report = replay_trace(path)
    bad = {n: (f.worst_ratio, f.worst_step) for n, f in report.fields.items() if not f.ok}
    assert report.ok, bad
    assert report.steps >= 8 and report.worst_ratio <= 1.0


def test_tool_exits_nonzero_on_a_mismatch(tmp_path):
    trace = torch.load(TRACES[0], weights_only=True)
    trace["steps"][2]["loss"] = trace["steps"][2]["loss"] * 1.01
    trace["steps"][3]["selected"] = [0]
    bad = tmp_path / "bad.pt"
    torch.save(trace, bad)
    out = subprocess.run(
        [sys.executable, str(TOOL), str(TRACES[0]), str(bad)], capture_output=True, text=True
    )
    assert out.returncode == 1
    assert "PASS" in out.stdout and "FAIL" in out.stdout
    lines = {
        line.split()[0]: line.split() for line in out.stdout.splitlines()[-16:] if line.strip()
    }
    assert lines["loss"][-1] == "1" and lines["selected"][-1] != "0"
