"""The command line's flags come from the option dataclasses (eatta.bench.flags)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import eatta.bench
from eatta.bench import commands, flags
from eatta.bench.annotation import AnnotatorOptions
from eatta.bench.flags import LoadOptions, RunConfig
from eatta.bench.monitoring import MonitorOptions
from eatta.bench.protocol import StreamProtocol

FLAGGED = (RunConfig, LoadOptions, StreamProtocol, AnnotatorOptions, MonitorOptions)


def _dests(parser) -> dict[str, object]:
    return {a.dest: a for a in parser._actions}


@pytest.mark.parametrize("cls", FLAGGED)
def test_every_flagged_field_is_a_flag_with_its_help(cls):
    actions = _dests(commands.run_parser())
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        dest = (f.metadata["name"] or f.name).replace("-", "_")
        assert dest in actions, f"{cls.__name__}.{f.name} has no flag"
        assert actions[dest].help == f.metadata["help"]


def test_defaults_read_back_as_the_dataclasses_defaults():
    args = commands.run_parser().parse_args([])
    assert StreamProtocol(**flags.values(StreamProtocol, args)) == StreamProtocol()
    annotator = flags.values(AnnotatorOptions, args)
    assert AnnotatorOptions(**annotator) == AnnotatorOptions()
    config = flags.values(RunConfig, args)
    assert config["reuse"] is True and config["progress"] is True and config["plot"] is True
    assert config["labels"] == [1] and config["every"] == [1] and config["buffers"] == [None]
    assert config["batch_size"] == 64 and config["window"] == "auto"
    assert flags.values(LoadOptions, args)["pretrained"] is True
    assert commands.monitor_options(args) == MonitorOptions()


def test_flags_parse_into_the_fields():
    argv = ["--rerun", "--no-plot", "--random-init", "--label-delay", "never", "--rounds", "3"]
    argv += ["--mixed", "--guard-block", "50", "--seeds", "0-2", "--buffer", "4,default"]
    args = commands.run_parser().parse_args(argv)
    config = flags.values(RunConfig, args)
    assert config["reuse"] is False and config["plot"] is False and config["progress"] is True
    assert config["seeds"] == [0, 1, 2] and config["buffers"] == [4, None]
    assert flags.values(LoadOptions, args)["pretrained"] is False
    assert flags.values(AnnotatorOptions, args)["delay"] == "never"
    assert flags.values(StreamProtocol, args) == {
        "rounds": 3,
        "gradual": False,
        "dirichlet": None,
        "mixed": True,
        "ccc": None,
    }
    assert flags.values(MonitorOptions, args)["block"] == 50


def test_seed_list_reads_ranges_and_lists():
    assert flags.seed_list("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(Exception, match="distinct"):
        flags.seed_list("1,1")


def test_run_takes_the_dataclass_fields_and_refuses_others(tmp_path):
    with pytest.raises(TypeError, match="unknown option"):
        eatta.bench.run("digits-c", "source", out=tmp_path, not_an_option=1)
    with pytest.raises(TypeError, match="batch_sizes"):
        RunConfig(batch_sizes=3)  # type: ignore[call-arg]


def test_templates_fill_pages_and_fragments(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import _common
    finally:
        sys.path.pop(0)
    (tmp_path / "page.md").write_text(
        "Seeds $seeds.\n$rest\n<!-- fragment: one -->\nA $x line.\n\n<!-- fragment: two -->\nB\n"
    )
    monkeypatch.setattr(_common, "TEMPLATES", tmp_path)
    page = _common.Template("page")
    assert page("one", x="short") == "A short line."
    assert page("two") == "B"
    assert page(seeds="0,1", rest=page("two")) == "Seeds 0,1.\nB\n"
    with pytest.raises(KeyError):
        page(seeds="0")
