"""eatta-serve's own checks: a user's mistake is one line and exit status 2, before it serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from eatta.serve import cli
from eatta.serve.service import Options
from eatta.serve.state import StateDir


@pytest.fixture(autouse=True)
def _never_serve(monkeypatch) -> None:
    """A check that lets a command through fails the test instead of serving forever."""
    import uvicorn

    def served(*args: object, **kwargs: object) -> None:
        raise AssertionError("eatta-serve started serving")

    monkeypatch.setattr(uvicorn.Server, "run", served)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no_such_module:f"], "--model 'no_such_module:f': no module 'no_such_module'"),
        (["--model", "eatta.serve.model"], "give pkg.module:factory"),
        (["--model", "eatta.serve.model:nothing"], "has no 'nothing'"),
        (["--model", "eatta.serve.model:DEMO_SHAPE"], "is not callable"),
        (["--input-shape", "1,32,32"], "does not take inputs of shape [N, 1, 32, 32]"),
        (["--max-batch", "64", "--max-queue", "8"], "--max-queue (8) must be >= --max-batch"),
        (["--hp", "tolerance"], "--hp expects KEY=VALUE, got 'tolerance'"),
        (["--hp", "nope=1"], "has no hyperparameter 'nope'"),
        (["--hp", "tolerance='x'"], "'tolerance' of method 'eatta-safe' must be float"),
        (["--hp", "window=8"], "give window with --window"),
    ],
)
def test_a_mistake_is_one_line_and_status_2(tmp_path: Path, capsys, args, message: str) -> None:
    assert cli.main(["--state", str(tmp_path / "s"), "--port", "0", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eatta-serve: error: ") and message in err and err.count("\n") == 1


def test_a_state_of_other_options_is_refused(tmp_path: Path, capsys) -> None:
    saved = Options(model="eatta.serve.model:digits", method="tent").durable()
    StateDir(tmp_path / "s").claim(saved)  # a server of another method ran there
    assert cli.main(["--state", str(tmp_path / "s"), "--port", "0"]) == 2
    assert "started with method 'tent', not 'eatta-safe'" in capsys.readouterr().err


def test_bad_flags_are_argparse_errors(tmp_path: Path, capsys) -> None:
    for args in (["--window", "1"], ["--method", "nope"], ["--input-shape", "3,x"]):
        with pytest.raises(SystemExit) as done:
            cli.main(["--state", str(tmp_path / "s"), *args])
        assert done.value.code == 2
    assert "expected >= 2" in capsys.readouterr().err


def test_a_refused_setting_leaves_the_state_folder_untouched(tmp_path: Path) -> None:
    assert cli.main(["--state", str(tmp_path / "s"), "--port", "0", "--hp", "nope=1"]) == 2
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


def test_settings_reach_the_method_and_are_part_of_the_state(tmp_path: Path, capsys) -> None:
    settings = cli.method_settings("eatta-safe", ["tolerance=1", "fallback_start=blend"])
    assert settings == {"tolerance": 1.0, "fallback_start": "blend"}
    saved = Options(model="eatta.serve.model:digits", hparams=settings).durable()
    StateDir(tmp_path / "s").claim(saved)  # a server with settings of its own ran there
    assert cli.main(["--state", str(tmp_path / "s"), "--port", "0"]) == 2
    assert "started with hparams {'fallback_start': 'blend', 'tolerance': 1.0}, not None" in (
        capsys.readouterr().err
    )
