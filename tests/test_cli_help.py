"""Every --help of eatta-bench, eatta-annotate and eatta-serve reads as plain text, each default
said once and true: the value the parser (or, where the parser leaves it unset, the library)
really uses."""

from __future__ import annotations

import argparse
import inspect
import re

import pytest

from eatta.annotate import cli as annotate_cli
from eatta.annotate.paced import DEFAULT_PATIENCE, PersonPace
from eatta.bench import api, sweep
from eatta.bench import cli as bench_cli
from eatta.console import HelpFormatter, says_default
from eatta.serve import cli as serve_cli

#: reST a docstring may carry into a help text: ``literal``, :role:`x`, `x`, x: (a field list)
_REST = re.compile(r"``|:(func|mod|class|meth|attr|data|ref|doc):|`[^`]+`|::")
_OPTION_START = re.compile(r"^  (-\S+)")
#: the value a help states: "(default: X", "default X" (its first word)
_STATED = re.compile(r"\bdefault:? ([^\s,;)]+)")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser as ``--help`` shows it (the sweep prints its own)."""
    bench = bench_cli.main_parser()
    annotate = annotate_cli._parser()
    out = {"eatta-bench": bench, "eatta-annotate": annotate}
    out |= {f"eatta-bench {k}": p for k, p in _subparsers(bench).items() if k != "sweep"}
    out["eatta-bench sweep"] = sweep.sweep_parser()
    out |= {f"eatta-annotate {k}": p for k, p in _subparsers(annotate).items()}
    out["eatta-serve"] = serve_cli._parser()
    return out


PARSERS = _parsers()


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    """No wrapping: one option's help on one line (argparse reads the width from $COLUMNS)."""
    monkeypatch.setenv("COLUMNS", "1000")


def _help_text(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``COMMAND --help`` prints, through the program's own entry point."""
    program, *sub = command.split()
    main = {"eatta-bench": bench_cli.main, "eatta-annotate": annotate_cli.main}.get(
        program, serve_cli.main
    )
    with pytest.raises(SystemExit) as done:
        main([*sub, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def _option_texts(text: str) -> dict[str, str]:
    """Each option's help in ``text``, by its first flag, its lines joined."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if m := _OPTION_START.match(line):
            current = m[1].rstrip(",")
            out[current] = line[m.end() :]
        elif current is not None and line.startswith("      "):
            out[current] += " " + line.strip()
        else:
            current = None
    return {k: re.sub(r"\s+", " ", v).strip() for k, v in out.items()}


def test_every_command_is_checked():
    assert set(PARSERS) == {
        "eatta-bench",
        "eatta-bench run",
        "eatta-bench merge",
        "eatta-bench list",
        "eatta-bench sweep",
        "eatta-annotate",
        "eatta-annotate serve",
        "eatta-annotate stats",
        "eatta-serve",
    }
    assert all(p.formatter_class is HelpFormatter for p in PARSERS.values())


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_help_is_plain_text(command, capsys):
    text = _help_text(command, capsys)
    assert not _REST.search(text), _REST.search(text)


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_each_default_is_printed_once_and_is_the_parsers(command, capsys):
    options = _option_texts(_help_text(command, capsys))
    actions = {a.option_strings[0]: a for a in PARSERS[command]._actions if a.option_strings}
    assert set(options) == set(actions)
    for flag, text in options.items():
        unquoted = re.sub(r"'[^']*'", "", text)
        assert len(re.findall(r"\bdefault\b", unquoted)) <= 1, (flag, text)
        assert "(default: None)" not in text, (flag, text)
        default = actions[flag].default
        if default in (None, argparse.SUPPRESS, []) or actions[flag].nargs == 0:
            continue  # no value: the help may say what the command resolves it to
        value = re.escape(str(default))
        assert re.search(rf"\bdefault:? '?{value}'?(?=[\s,;)]|$)", text), (flag, text)


def _stated(command: str, flag: str, capsys: pytest.CaptureFixture[str]) -> str:
    stated = _STATED.search(_option_texts(_help_text(command, capsys))[flag])
    assert stated
    return stated[1]


def test_defaults_the_library_resolves_are_the_ones_printed(capsys):
    run = "eatta-bench run"
    assert _stated(run, "--rounds", capsys) == str(api.DIGITS_ROUNDS)
    assert _stated(run, "--label-patience", capsys) == str(DEFAULT_PATIENCE)
    order = inspect.signature(PersonPace).parameters["order"].default
    assert _stated(run, "--label-order", capsys) == order
    assert _stated(run, "--protocol", capsys) == "offline"


def test_the_formatter_prints_a_default_once_and_only_a_real_one():
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--a", default=3, help="plain")
    p.add_argument("--b", default=3, help="says it (default 3)")
    p.add_argument("--c", help="unset")
    p.add_argument("--d", action="store_true", help="a switch")
    p.add_argument("--e", default="x", help="a value named 'default'")
    text = " ".join(p.format_help().split())
    assert "plain (default: 3)" in text
    assert "says it (default 3) " in text and text.count("default: 3") == 1
    assert "unset --d" in text and "a switch --e" in text
    assert "a value named 'default' (default: x)" in text
    assert says_default("x (default: 1)") and not says_default("the value 'default'")


def test_the_environments_token_is_used_but_never_printed_in_help(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("EATTA_ANNOTATE_TOKEN", "s3cret")
    assert "s3cret" not in _help_text("eatta-annotate serve", capsys)
    served: list[object] = []
    monkeypatch.setattr(annotate_cli, "serve", lambda *args: served.append(args))
    assert annotate_cli.main(["serve", "--queue", str(tmp_path / "q.db")]) == 0
    assert served == [(str(tmp_path / "q.db"), "127.0.0.1", 8765, "s3cret", "newest")]
