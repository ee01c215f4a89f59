"""Helpers for the label queue's tests: requests, a page server in a thread, a CLI subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from eatta.annotate import LabelRequest

SRC = Path(__file__).resolve().parents[2] / "src"
SERVE = [sys.executable, "-m", "eatta.annotate.cli", "serve"]


def make_request(
    rid: str, seed: int, *, classes: int = 10, pred: int | None = None, step: int = 1
) -> LabelRequest:
    """A request whose sample depends on ``seed`` and whose prediction is ``pred``."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(classes, generator=g)
    if pred is not None:
        logits[pred] = logits.max() + 1.0
    return LabelRequest(rid, torch.rand(1, 8, 8, generator=g), logits, "label", step, seed % 7)


@contextmanager
def serve_in_thread(queue_path: Path, token: str | None = None) -> Iterator[str]:
    """The page's app under uvicorn in a thread on a free loopback port; yields its base URL."""
    uvicorn = pytest.importorskip("uvicorn")
    from eatta.annotate.server import make_app

    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(make_app(queue_path, token=token), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the page server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def subprocess_env() -> dict[str, str]:
    """The environment for child processes: this checkout's ``src`` first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_server_process(
    queue_path: Path, timeout: float = 60.0
) -> tuple[subprocess.Popen[str], str]:
    """``eatta-annotate serve --port 0`` as a child process; returns it and its base URL."""
    proc = subprocess.Popen(
        [*SERVE, "--queue", str(queue_path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env(),
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if " at http://" in line:
            url = line.split(" at ", 1)[1].strip().rstrip("/")
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
            return proc, url
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"the server process did not start: {line!r}")
