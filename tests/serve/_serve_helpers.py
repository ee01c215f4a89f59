"""Helpers for eatta-serve's tests: a service on a tiny CNN, served by uvicorn in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from _threaded import uvicorn_thread
from conftest import tiny_cnn
from eatta.serve.service import Options, Service
from eatta.serve.state import StateDir

SHAPE = (3, 8, 8)


def make_service(state: Path, *, seed: int = 0, **options: Any) -> Service:
    """A :class:`Service` on ``tiny_cnn`` (5 classes, 3×8×8 inputs), a window of 8 by default."""
    settings: dict[str, Any] = {
        "model": "tests:tiny_cnn",
        "input_shape": SHAPE,
        "window": 8,
        "max_batch": 8,
        "max_wait_ms": 2.0,
        "checkpoint_s": 0.0,
        "adapter": "thread",
        **options,
    }
    return Service(tiny_cnn(seed=seed), Options(**settings), StateDir(state))


def batches(n: int, rows: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, *SHAPE, generator=g) for _ in range(n)]


@contextmanager
def running(service: Service, token: str | None = None) -> Iterator[str]:
    """The whole server over ``service`` on a free loopback port; yields ``host:port``."""
    from eatta.serve.app import make_server_app

    with uvicorn_thread(make_server_app(service, token), access_log=False) as port:
        yield f"127.0.0.1:{port}"


class ServeProcess:
    """``eatta-serve --port 0`` as a child process; :meth:`wait_url` gives ``host:port`` once it
    serves (read from its output by a thread)."""

    def __init__(self, state: Path, *args: str) -> None:
        import subprocess
        import sys

        self.url: str | None = None
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eatta.serve.cli", "--state", str(state), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if self.url is None and "labelling page at http://" in line:
                self.url = line.split("http://", 1)[1].strip().split("/", 1)[0]

    def wait_url(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while self.url is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.proc.kill()
                raise RuntimeError(f"the server did not start: {''.join(self.output)}")
            time.sleep(0.02)
        return self.url


def _env() -> dict[str, str]:
    import os

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env
