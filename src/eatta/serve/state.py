"""The server's durable state under ``--state DIR``: the method's checkpoint and the label queue.

- ``DIR/labels.db``: the label queue (:class:`~eatta.annotate.queue.LabelQueue`, SQLite in WAL
  mode, ``synchronous=FULL``): every request and every acknowledged answer, committed before the
  page replies.
- ``DIR/checkpoint.pt``: the method's ``state_dict()`` (the model, the optimizer, every part, the
  requests it waits for and the queue's cursor), the origins of its window's samples, and the
  options it was started with. Written whole to a temporary file, flushed to disk, then renamed
  over the old one (and the folder flushed), so a ``kill -9`` leaves the old checkpoint or the
  new one, never a mix.
- ``DIR/options.json``: the options that decide what the checkpoint holds (the model, the
  method, its dataset row, window and budget), written at the first start and checked at every
  start, before the model is built.
- ``DIR/lock``: held (``flock``) while a server runs, so two servers never share a state; the
  kernel releases it when the process dies, ``kill -9`` included.

A restart with the same ``--state`` loads the checkpoint; options that change what it holds
(the model, the method, its dataset row, window and budget) must be the same.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT", "QUEUE", "StateDir", "StateMismatch"]

QUEUE = "labels.db"
CHECKPOINT = "checkpoint.pt"
FORMAT = 1


class StateMismatch(ValueError):
    """The state folder was written by a server started with other options."""


class StateDir:
    """The folder of one server's durable state (created if missing; its parent must exist)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise FileNotFoundError(
                f"--state {str(self.path)!r}: no folder {str(self.path.parent)!r}"
            )
        if self.path.exists() and not self.path.is_dir():
            raise FileNotFoundError(f"--state {str(self.path)!r} is a file, not a folder")
        self.path.mkdir(exist_ok=True)
        self._lock_fd: int | None = None

    @property
    def queue(self) -> Path:
        return self.path / QUEUE

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT

    def lock(self) -> None:
        """Hold the folder for this process; a :class:`RuntimeError` if another server does."""
        import fcntl

        fd = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RuntimeError(
                f"--state {str(self.path)!r} is in use by another eatta-serve; stop it first or "
                "give another folder"
            ) from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def claim(self, options: Mapping[str, Any]) -> None:
        """Record ``options`` at the first start; later, a :class:`StateMismatch` naming the
        first option that differs."""
        path = self.path / "options.json"
        mine = json.loads(json.dumps(dict(options)))  # tuples as lists, as they are read back
        if path.exists():
            saved = json.loads(path.read_text(encoding="utf-8"))
            _compare(saved, mine, self.path)
            return
        if self.checkpoint.exists():  # a state from before options.json: its checkpoint says
            return
        tmp = path.with_name("options.json.tmp")
        tmp.write_text(json.dumps(mine, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def save(self, state: Mapping[str, Any]) -> int:
        """Write the checkpoint atomically (see the module doc); returns its size in bytes."""
        tmp = self.checkpoint.with_name(CHECKPOINT + ".tmp")
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, self.checkpoint)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself is durable
        finally:
            os.close(fd)
        return size

    def load(self, options: Mapping[str, Any]) -> dict[str, Any] | None:
        """The checkpoint (None: none yet); a :class:`StateMismatch` naming the option that
        differs when it was written with other ``options``."""
        if not self.checkpoint.exists():
            return None
        state: dict[str, Any] = torch.load(self.checkpoint, map_location="cpu", weights_only=False)
        if state.get("format") != FORMAT:
            raise StateMismatch(
                f"{self.checkpoint} is of format {state.get('format')!r}; this eatta-serve reads "
                f"format {FORMAT}"
            )
        _compare(state.get("options", {}), dict(options), self.path)
        return state


def _compare(saved: Mapping[str, Any], mine: Mapping[str, Any], path: Path) -> None:
    saved, mine = (json.loads(json.dumps(dict(m))) for m in (saved, mine))  # tuples as lists
    for key in [*mine, *(k for k in saved if k not in mine)]:
        theirs, value = saved.get(key), mine.get(key)
        if theirs != value:
            raise StateMismatch(
                f"--state {str(path)!r} holds a server started with {key} {theirs!r}, not "
                f"{value!r}: start with the same options, or give another --state"
            )
