"""Ctrl-C (a real SIGINT to a subprocess) stops ``eatta-annotate serve``,
``examples/annotate_digits.py`` and ``eatta-bench`` cleanly: exit status 130, no traceback, and a
line saying what was kept and how to resume."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _default_sigint() -> None:
    # a shell that starts pytest in the background ignores SIGINT, and a child inherits that;
    # Python only raises KeyboardInterrupt when SIGINT is not ignored at its start
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(
    argv: list[str], ready: Callable[[str], bool], timeout: float = 120.0
) -> tuple[int, str, str]:
    """Start ``python argv``, send SIGINT once ``ready(output so far)``; (status, out, err)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        preexec_fn=_default_sigint,
    )
    out: list[str] = []
    err: list[str] = []
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=into.extend, args=(stream,), daemon=True)
        for stream, into in ((proc.stdout, out), (proc.stderr, err))
    ]
    for r in readers:
        r.start()
    try:
        deadline = time.monotonic() + timeout
        while not ready("".join(out) + "".join(err)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never ready; out:\n{''.join(out)}\nerr:\n{''.join(err)}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        status = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for r in readers:
        r.join(10)
    return status, "".join(out), "".join(err)


def test_eatta_annotate_serve_stops_cleanly(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    queue = tmp_path / "labels.db"
    argv = ["-m", "eatta.annotate.cli", "serve", "--queue", str(queue), "--port", "0"]
    status, _, err = interrupted(argv, lambda text: "serving" in text)
    assert status == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert f"eatta-annotate: stopped; the queue {queue} keeps every answer" in err


def test_the_annotation_example_stops_cleanly_and_names_its_checkpoint(
    tmp_path: Path,
) -> None:
    pytest.importorskip("uvicorn")
    queue = tmp_path / "labels.db"
    argv = ["examples/annotate_digits.py", "--queue", str(queue), "--simulate", "--port", "0"]
    argv += ["--interval", "0.2", "--corruptions", "gaussian_noise", "--batch-size", "16"]
    status, out, err = interrupted(argv, lambda text: re.search(r"^\s+2/\d+ ", text, re.M))
    assert status == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    found = re.search(
        rf"stopped: its checkpoint {re.escape(str(queue))}\.ckpt holds batch (\d+)/", out
    )
    assert found is not None, out
    saved = int(found[1])
    assert saved >= 2
    # the checkpoint holds the batch the line names: what the same command resumes from
    import torch

    assert torch.load(f"{queue}.ckpt", weights_only=False)["batch"] == saved


def test_eatta_bench_stops_cleanly_and_says_what_it_kept(tmp_path: Path) -> None:
    out_dir = tmp_path / "run"
    argv = ["-m", "eatta.bench.cli", "--rounds", "2", "--methods", "source,tent"]
    argv += ["--limit", "256", "--batch-size", "8", "--checkpoint-every", "1", "--jobs", "2"]
    argv += ["--no-plot", "--no-progress", "--out", str(out_dir)]
    checkpoints = out_dir / "checkpoints"
    status, _, err = interrupted(argv, lambda _: any(checkpoints.glob("*.pt")))
    assert status == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    found = re.search(r"eatta-bench: interrupted: (\d) of 2 runs finished and saved in (\S+);", err)
    assert found is not None, err
    assert found[2] == str(out_dir / "cells")
    assert int(found[1]) == len(list((out_dir / "cells").glob("*.json"))) < 2
    assert f"checkpointed in {checkpoints}" in err and "The same command again resumes" in err
    assert any(checkpoints.glob("*.pt"))
    # no cell process is left running
    time.sleep(0.5)
    assert not [p for p in Path("/proc").glob("[0-9]*") if _is_cell_of(p, out_dir)]


def _is_cell_of(proc: Path, out_dir: Path) -> bool:
    try:
        return str(out_dir) in (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_a_local_sweep_stops_cleanly_and_names_the_resubmit_command(tmp_path: Path) -> None:
    pytest.importorskip("submitit")
    out = tmp_path / "sweep"
    argv = ["-m", "eatta.bench.cli", "sweep", "--launcher", "local", "--jobs", "1"]
    argv += ["--shards", "1", "--out", str(out), "--", "--rounds", "2", "--methods", "tent"]
    argv += ["--limit", "128", "--batch-size", "16", "--seeds", "0"]
    argv += ["--checkpoint-every", "5", "--no-plot", "--no-progress"]
    status, _, err = interrupted(argv, lambda _: any(out.glob("shard-*/checkpoints/*.pt")))
    assert status == 130, err
    # submitit's local controllers, interrupted by job.cancel(), write to a log, not here
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "eatta-bench: interrupted: 0 of 1 shards finished" in err
    assert f"continue with: eatta-bench sweep --resubmit --out {out}" in err
    assert "KeyboardInterrupt" in (out / "submitit" / "controllers.log").read_text()
