"""The state folder: an atomic checkpoint, a refusal for other options, one server at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from eatta.serve.state import StateDir, StateMismatch


def test_a_checkpoint_is_written_whole_and_read_back(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    assert state.load({"method": "tent"}) is None
    size = state.save({"options": {"method": "tent"}, "steps": 3})
    assert size == state.checkpoint.stat().st_size
    assert sorted(p.name for p in state.path.iterdir()) == ["checkpoint.pt"]  # no temporary left
    assert state.load({"method": "tent"})["steps"] == 3
    with pytest.raises(StateMismatch, match="started with method 'tent', not 'eatta'"):
        state.load({"method": "eatta"})


def test_one_server_holds_a_state_folder(tmp_path: Path) -> None:
    first, second = StateDir(tmp_path / "s"), StateDir(tmp_path / "s")
    first.lock()
    with pytest.raises(RuntimeError, match="in use by another eatta-serve"):
        second.lock()
    first.unlock()
    second.lock()
    second.unlock()


def test_a_folder_whose_parent_is_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no folder"):
        StateDir(tmp_path / "missing" / "s")
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file"):
        StateDir(tmp_path / "f")
