"""What the server tests share: an ASGI app under uvicorn in a thread, and waiting on a
condition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def uvicorn_thread(app: Any, **config: Any) -> Iterator[int]:
    """``app`` served by uvicorn in a thread on a free loopback port (the library's own
    ``bind``: TCP_NODELAY, no 40 ms wait a request); yields the port, stops it whatever happens."""
    import uvicorn

    from eatta.annotate.cli import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 20.0, "the server to start")
        if not server.started:
            raise RuntimeError("the server did not start")
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


def wait_until(
    condition: Callable[[], Any], timeout: float = 10.0, what: str = "", every: float = 0.01
) -> Any:
    """``condition()``'s first truthy value, polled every ``every`` seconds; an AssertionError
    naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
