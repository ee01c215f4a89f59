"""Helpers for the label queue's tests: requests, a page server in a thread, a CLI subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from _threaded import uvicorn_thread
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
def serve_in_thread(
    queue_path: Path, token: str | None = None, order: str = "newest"
) -> Iterator[str]:
    """The page's app under uvicorn in a thread on a free loopback port; yields its base URL."""
    pytest.importorskip("uvicorn")
    from eatta.annotate.server import make_app

    app = make_app(queue_path, token=token, order=order)  # type: ignore[arg-type]  # checked there
    with uvicorn_thread(app) as port:
        yield f"http://127.0.0.1:{port}"


def subprocess_env() -> dict[str, str]:
    """The environment for child processes: this checkout's ``src`` first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ServerProcess:
    """``eatta-annotate serve --port 0`` as a child process; :attr:`url` is set (by a thread that
    reads its output) once it serves, so a restart does not block the caller."""

    def __init__(self, queue_path: Path) -> None:
        self.url: str | None = None
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [*SERVE, "--queue", str(queue_path), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=subprocess_env(),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if self.url is None and " at http://" in line:
                self.url = line.split(" at ", 1)[1].strip().rstrip("/")

    def wait_url(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while self.url is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.proc.kill()
                raise RuntimeError(f"the server did not start: {''.join(self.output)}")
            time.sleep(0.02)
        return self.url


def start_server_process(queue_path: Path, timeout: float = 60.0) -> tuple[ServerProcess, str]:
    """A :class:`ServerProcess` on ``queue_path`` and its base URL, once it serves."""
    server = ServerProcess(queue_path)
    return server, server.wait_url(timeout)
