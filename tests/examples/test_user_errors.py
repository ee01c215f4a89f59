"""A user's mistake under an example script or a command (a missing dataset folder, weights not
cached, a bad flag) ends in one ``PROG: error: ...`` line and exit status 2, no traceback; a bug
keeps its traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from eatta.console import USAGE_ERROR, UsageError, exit_on_user_error
from eatta.data.imagenet import CORRUPTIONS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCH_HOME": str(cwd / "torch-home"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _one_error_line(done: subprocess.CompletedProcess[str], prog: str, says: str) -> None:
    assert done.returncode == USAGE_ERROR, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(f"{prog}: error: "), done.stderr
    assert says in errors[0], errors[0]


def _script(name: str, *args: str) -> list[str]:
    return [str(EXAMPLES / name), *args]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (_script("reproduce_imagenet_c.py", "--root", "empty"), "corruption folder"),
        (_script("reproduce_pacs.py", "--root", "empty"), "PACS domain 'art_painting'"),
        (_script("reproduce_pacs.py", "--root", "empty", "--sequence", "X-Y"), "--sequence"),
        (_script("reproduce_imagenet_c.py", "--root", "empty", "--shard", "4/2"), "--shard"),
        (
            _script("train_pacs_source.py", "--root", "empty", "--source", "P", "--out", "w.pt"),
            "PACS domain 'photo'",
        ),
        (_script("quickstart.py", "--corruptions", "snoww"), "--corruptions"),
        (
            _script("annotate_digits.py", "--queue", "missing/q.db", "--no-serve"),
            "no folder",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else Path(v[0]).name + " " + " ".join(v[1:]),
)
def test_an_example_script_says_the_mistake_in_one_line(argv, says, tmp_path):
    (tmp_path / "empty").mkdir()
    _one_error_line(_run(argv, tmp_path), Path(argv[0]).name, says)


def test_weights_that_are_not_cached_are_one_line_naming_the_remedy(tmp_path):
    for corruption in CORRUPTIONS:  # the layout is right: the weights are what is missing
        folder = tmp_path / "imagenet-c" / corruption / "5" / "n01440764"
        folder.mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(folder / "a.JPEG")
    argv = _script("reproduce_imagenet_c.py", "--root", "imagenet-c", "--rows", "source")
    done = _run(argv, tmp_path)
    _one_error_line(done, "reproduce_imagenet_c.py", "--checkpoint PATH")
    done = _run([*argv, "--checkpoint", "missing.pt"], tmp_path)
    _one_error_line(done, "reproduce_imagenet_c.py", "checkpoint 'missing.pt' does not exist")


def test_eatta_annotate_says_a_missing_folder_or_a_taken_port_in_one_line(tmp_path, capsys):
    from eatta.annotate import cli

    assert cli.main(["stats", "--queue", str(tmp_path / "missing" / "q.db")]) == USAGE_ERROR
    assert capsys.readouterr().err.startswith("eatta-annotate: error: label queue ")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        argv = ["serve", "--queue", str(tmp_path / "q.db"), "--port", port]
        assert cli.main(argv) == USAGE_ERROR
    assert capsys.readouterr().err.startswith(
        f"eatta-annotate: error: cannot listen on 127.0.0.1:{port}"
    )
    with pytest.raises(SystemExit) as bad:
        cli.main(["serve", "--queue", "q.db", "--port", "70000"])
    assert bad.value.code == USAGE_ERROR and "a port is 0 to 65535" in capsys.readouterr().err


def test_only_a_users_mistake_is_turned_into_a_line(capsys):
    def mistake() -> int:
        raise UsageError("give --x")

    def bug() -> int:
        raise RuntimeError("a bug")

    assert exit_on_user_error("prog", mistake) == USAGE_ERROR
    assert capsys.readouterr().err == "prog: error: give --x\n"
    with pytest.raises(RuntimeError, match="a bug"):
        exit_on_user_error("prog", bug)
    assert exit_on_user_error("prog", lambda: 3) == 3
    assert exit_on_user_error("prog", lambda: {"a": 1}) == 0  # a report, not a status
