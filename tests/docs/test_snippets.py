"""Every fenced code block of README.md, DEVELOPERS.md and docs/**/*.md runs or is parsed here.

* ``python`` blocks run, in a temporary folder, with the names their page declares in an HTML
  comment just before the block: ``<!-- snippet: setup=model -->`` (see :data:`SETUPS`). A block
  that cannot run here says why: ``<!-- skip: needs ImageNet-C data -->``; the reason is shown in
  the skip. Blocks on a page share nothing.
* ``bash`` blocks and blocks without a language: each ``eatta-bench`` / ``eatta-annotate`` /
  ``eatta-serve`` command line is parsed by the real argument parser (and its method names and
  ``--hp`` keys checked, as the command does before any work), ``python SCRIPT ARGS`` by the
  script's own parser, ``pip install -e ".[extras]"`` against pyproject's extras. Nothing is
  executed.
* Every inline ``eatta.x.y`` name in the pages resolves to a module or attribute.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib.metadata
import linecache
import re
import runpy
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "DEVELOPERS.md", *(REPO / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_DIRECTIVE = re.compile(r"<!--\s*(?P<kind>snippet|skip):\s*(?P<body>.*?)\s*-->", re.S)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    setup: tuple[str, ...]
    skip: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with the directive (if any) in the lines just before each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start = len(m["indent"]), i
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise AssertionError(f"{page.name}:{start + 1}: unclosed code fence")
        code = "\n".join(line[indent:] for line in lines[start + 1 : j])
        # the directive: an HTML comment ending on one of the (non-blank) lines just before
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        before = "\n".join(lines[max(0, k - 3) : k + 1]) if k >= 0 else ""
        setup: tuple[str, ...] = ()
        skip = None
        d = list(_DIRECTIVE.finditer(before))
        if d and before.rstrip().endswith("-->"):
            kind, body = d[-1]["kind"], d[-1]["body"]
            if kind == "skip":
                skip = body
            else:
                fields = dict(f.split("=", 1) for f in body.split() if "=" in f)
                setup = tuple(s for s in fields.get("setup", "").split(",") if s)
        found.append(Block(page, start + 1, m["lang"] or "text", code, setup, skip))
        i = j + 1
    return found


ALL = [b for p in PAGES for b in blocks(p)]
PYTHON = [b for b in ALL if b.lang == "python"]
SHELL = [b for b in ALL if b.lang in ("bash", "sh", "shell", "console", "text")]


def test_every_block_is_collected_and_has_a_known_language():
    """A new language (or a typo in one) would otherwise go unchecked."""
    assert len(PYTHON) >= 5 and len(SHELL) >= 15
    unknown = [f"{b.name} ({b.lang})" for b in ALL if b not in PYTHON and b not in SHELL]
    assert unknown == []


def test_directive_parser_reads_setup_and_skip(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- snippet: setup=model,stream -->\n```python\nx = 1\n```\n\n"
        "<!-- skip: needs ImageNet-C data -->\n\n```python\ny = 2\n```\n"
        "text\n```bash\neatta-bench\n```\n",
        encoding="utf-8",
    )
    a, b, c = blocks(page)
    assert (a.setup, a.skip, a.code, a.line) == (("model", "stream"), None, "x = 1", 2)
    assert (b.setup, b.skip) == ((), "needs ImageNet-C data")
    assert (c.lang, c.setup, c.skip) == ("bash", (), None)


# ----------------------------------------------------------------------------- python blocks


def _digits_model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    from eatta.models.digits_cnn import packaged_digits_source

    model, _ = packaged_digits_source()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(16, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (16,), generator=g)
    return model, x, y


def _setup_model(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``model``: the packaged digits CNN (10 classes, 3x32x32 inputs); ``x``, ``y``: a batch of
    16; ``oracle``: a ground-truth oracle holding ``y``; ``backbone``, ``head``: the model's split;
    ``my_labeller``: a stand-in for a person (class 0 for every sample)."""
    import eatta

    model, x, y = _digits_model()
    oracle = eatta.GroundTruthOracle()
    oracle.set_labels(y)
    backbone, head = eatta.split_model(copy.deepcopy(model), example=x)
    ns.update(model=model, x=x, y=y, oracle=oracle, backbone=backbone, head=head)
    ns["my_labeller"] = lambda sample: 0


def _setup_resnet(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``model``, with a torchvision ResNet-18 (random weights, 10 classes) as ``model``: the
    authors' ImageNet parameter set (``preset="reference"``) needs ResNet naming."""
    import eatta
    from eatta._compat import import_torchvision

    _setup_model(ns, monkeypatch)
    torch.manual_seed(0)
    model = import_torchvision().models.resnet18(num_classes=10)
    backbone, head = eatta.split_model(copy.deepcopy(model), example=ns["x"])
    ns.update(model=model, backbone=backbone, head=head)


def _setup_guard(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``model``, with ``auditor`` (a ground-truth oracle holding ``y``)."""
    import eatta

    _setup_model(ns, monkeypatch)
    auditor = eatta.GroundTruthOracle()
    auditor.set_labels(ns["y"])
    ns.update(auditor=auditor)


def _setup_stream(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``model`` and ``stream``: three batches of 16 ``(x, y)`` pairs; ``batches``: the same
    without labels; ``save``: ``torch.save`` to ``checkpoint.pt``; ``it_is_time_to_checkpoint``."""
    model, x, y = _digits_model()
    g = torch.Generator().manual_seed(1)
    pairs = [(torch.rand(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g))]
    pairs = [(x, y), *pairs, (x.flip(0), y.flip(0))]
    ns.update(model=model, stream=pairs, batches=[p[0] for p in pairs])
    ns["save"] = lambda state: torch.save(state, "checkpoint.pt")
    ns["it_is_time_to_checkpoint"] = True


def _setup_tiny_bench(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """digits-C replaced by the harness tests' tiny stand-in (a few 3x8x8 tensors a domain)."""
    sys.path.insert(0, str(REPO / "tests" / "bench"))
    try:
        from bench_fixtures import fake_digits_c
    finally:
        sys.path.remove(str(REPO / "tests" / "bench"))
    fake_digits_c(monkeypatch)


def _setup_hf(ns: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``from_pretrained`` of ``transformers``' image classifiers and image processors, as a
    page writes them, without a download: the model is a tiny ViT of the same family (random
    weights, 10 classes, 32 px), the processor turns images into its ``pixel_values``;
    ``images``: a batch of 16 PIL images; ``y``: their labels, and ``oracle`` holding them."""
    import PIL.Image

    import eatta
    from eatta.compat import import_transformers

    transformers = import_transformers()

    def pretrained_model(name: str, **kw: Any) -> torch.nn.Module:
        config = transformers.ViTConfig(
            image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=32, num_labels=10,
        )  # fmt: skip
        torch.manual_seed(0)
        return transformers.ViTForImageClassification(config).eval()

    def pretrained_processor(name: str, **kw: Any) -> Any:
        return transformers.ViTImageProcessor(size={"height": 32, "width": 32})

    auto = transformers.AutoModelForImageClassification
    monkeypatch.setattr(auto, "from_pretrained", staticmethod(pretrained_model))
    processor = transformers.AutoImageProcessor
    monkeypatch.setattr(processor, "from_pretrained", staticmethod(pretrained_processor))
    g = torch.Generator().manual_seed(0)
    pixels = (torch.rand(16, 32, 32, 3, generator=g) * 255).to(torch.uint8).numpy()
    images = [PIL.Image.fromarray(p) for p in pixels]
    y = torch.randint(0, 10, (16,), generator=g)
    oracle = eatta.GroundTruthOracle()
    oracle.set_labels(y)
    ns.update(images=images, y=y, oracle=oracle)


#: the names a block may ask for with ``<!-- snippet: setup=NAME[,NAME] -->``
SETUPS: dict[str, Callable[[dict[str, Any], pytest.MonkeyPatch], None]] = {
    "model": _setup_model,
    "resnet": _setup_resnet,
    "guard": _setup_guard,
    "stream": _setup_stream,
    "tiny_bench": _setup_tiny_bench,
    "hf": _setup_hf,
}


def test_python_blocks_are_all_run_or_skipped_with_a_reason():
    bad = [b.name for b in PYTHON if b.skip is not None and len(b.skip) < 10]
    unknown = [f"{b.name}: {s}" for b in PYTHON for s in b.setup if s not in SETUPS]
    assert bad == [] and unknown == []


# the setups' batches are 16 samples: small for a BatchNorm model, on purpose (a page's reader
# adapts on their own batches)
@pytest.mark.small_batches
@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.name)
def test_python_block_runs(block: Block, tmp_path, monkeypatch):
    if block.skip is not None:
        pytest.skip(block.skip)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EATTA_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    ns: dict[str, Any] = {"__name__": "__snippet__"}
    for name in block.setup:
        SETUPS[name](ns, monkeypatch)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # registered so that a failure's traceback shows the block's own lines
        linecache.cache[block.name] = (len(block.code), None, block.code.splitlines(True), "")
        code = compile(block.code, block.name, "exec")
        with contextlib.redirect_stdout(None):
            exec(code, ns)
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- shell blocks


def commands(code: str) -> Iterator[list[str]]:
    """The command lines of a shell block: ``\\`` continuations joined, comments dropped, ``&&``
    chains split, a ``for VAR in A ...; do`` loop's body read with its first value; in a block
    with ``$ `` prompts only the prompted lines (the rest is output)."""
    prompted = any(line.startswith("$ ") for line in code.splitlines())
    joined: list[str] = []
    for line in code.splitlines():
        continued = bool(joined) and joined[-1].endswith("\\")
        if prompted and not continued:
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + line.strip()
        else:
            joined.append(line.strip())
    loop: dict[str, str] = {}  # for VAR in A B ...; do: the body is checked with VAR=A
    for line in joined:
        m = re.fullmatch(r"for (\w+) in (\S+).*; do", line)
        if m:
            loop[m[1]] = m[2]
            continue
        if line in ("done", "done;"):
            continue
        for var, value in loop.items():
            line = line.replace("${" + var + "}", value).replace("$" + var, value)
        try:
            words = shlex.split(line, comments=True)
        except ValueError as err:  # pragma: no cover - a broken quote in the docs
            raise AssertionError(f"cannot split {line!r}: {err}") from None
        part: list[str] = []
        for w in [*words, "&&"]:
            if w in ("&&", ";", "||"):
                if part:
                    yield part
                part = []
            else:
                part.append(w)


class _Parsed(Exception):
    pass


def _parse_script(path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``path``'s ``main`` only up to its ``parse_args``, with ``argv``."""
    real = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        real(self, argv)
        raise _Parsed

    monkeypatch.syspath_prepend(str(path.parent))  # as when run as a script
    module = runpy.run_path(str(path), run_name="__docs_check__")
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    main = module["main"]
    with pytest.raises(_Parsed):
        main(argv) if main.__code__.co_argcount else main()


def check_eatta_bench(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """``eatta-bench ARGV`` through its own entry point, stopped where the work would start:
    ``eatta.bench.api.run`` (after every option, method name and ``--hp`` key was checked) or
    ``eatta.bench.sweep.launch`` (whose run options are then checked the same way)."""
    from eatta.bench import api, cli, sweep

    seen: dict[str, Any] = {}

    def stop_run(*args: Any, **kwargs: Any) -> None:
        raise _Parsed

    def stop_launch(run_argv: Any, *args: Any, **kwargs: Any) -> None:
        seen["run_argv"] = list(run_argv or [])
        raise _Parsed

    monkeypatch.setattr(api, "run", stop_run)
    monkeypatch.setattr(sweep, "launch", stop_launch)
    if argv[:1] == ["merge"]:
        cli.main_parser().parse_args(argv)
        return
    try:
        status = cli.main(argv)
    except _Parsed:
        status = None
    if status not in (None, 0):
        raise ValueError(f"exit status {status}: {capsys.readouterr().err.strip()}")
    if "run_argv" in seen:
        check_eatta_bench(["run", *seen.pop("run_argv")], monkeypatch, capsys)


def check_pip(argv: list[str]) -> None:
    extras = importlib.metadata.metadata("eatta").get_all("Provides-Extra") or []
    assert argv[:2] == ["pip", "install"], argv
    assert "-c" in argv and argv[argv.index("-c") + 1] == "constraints.txt", (
        f"every install goes through constraints.txt: {argv}"
    )
    for w in argv[2:]:
        m = re.fullmatch(r"(?:-e\s*)?(?:\.|eatta)\[(?P<x>[\w,]+)\]", w)
        if m:
            assert set(m["x"].split(",")) <= set(extras), f"unknown extra in {w}"


def check_command(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys) -> str | None:
    """Parse one command; returns what was checked (None: a command this test does not know)."""
    prog = argv[0]
    if prog == "eatta-bench":
        check_eatta_bench(argv[1:], monkeypatch, capsys)
        return prog
    if prog == "eatta-annotate":
        from eatta.annotate import cli as annotate_cli

        annotate_cli._parser().parse_args(argv[1:])
        return prog
    if prog == "eatta-serve":
        from eatta.serve import cli as serve_cli

        serve_cli._parser().parse_args(argv[1:])
        return prog
    if prog in ("python", "python3") and argv[1:2] != ["-m"] and len(argv) > 1:
        script = REPO / argv[1]
        assert script.is_file(), f"no such script: {argv[1]}"
        _parse_script(script, argv[2:], monkeypatch)
        return "python script"
    if prog == "pip":
        check_pip(argv)
        return prog
    return None


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.name)
def test_shell_block_parses(block: Block, monkeypatch, capsys):
    if block.skip is not None:
        pytest.skip(block.skip)
    for argv in commands(block.code):
        with monkeypatch.context() as m:
            try:
                check_command(argv, m, capsys)
            except SystemExit:  # argparse's way to refuse
                err = capsys.readouterr().err
                raise AssertionError(f"{block.name}: {shlex.join(argv)}: {err}") from None
            except (ValueError, TypeError) as err:  # a method, --hp key or run option refused
                raise AssertionError(f"{block.name}: {shlex.join(argv)}: {err}") from err


def test_the_shell_checks_can_fail(monkeypatch, capsys):
    def check(*argv: str) -> None:
        with monkeypatch.context() as m:
            check_command(list(argv), m, capsys)

    check("eatta-bench", "--methods", "tent,eatta", "--hp", "tent.lr=1e-3", "--rounds", "2")
    check("eatta-bench", "sweep", "--out", "o", "--shards", "2", "--", "--methods", "tent")
    with pytest.raises(SystemExit):
        check("eatta-bench", "--no-such-option")
    with pytest.raises(ValueError, match="lrr"):
        check("eatta-bench", "--methods", "tent", "--hp", "tent.lrr=1")
    with pytest.raises(ValueError, match="nope"):
        check("eatta-bench", "sweep", "--out", "o", "--", "--methods", "nope")
    with pytest.raises(SystemExit):
        check("eatta-bench", "sweep", "--out", "o", "--", "--no-such-option")
    with pytest.raises(SystemExit):
        check("eatta-annotate", "serve")  # --queue is required
    with pytest.raises(SystemExit):
        check("python", "examples/quickstart.py", "--no-such-option")
    with pytest.raises(AssertionError, match="unknown extra"):
        check("pip", "install", "-c", "constraints.txt", "-e", ".[benchh]")
    assert list(commands("$ eatta-bench list\noutput | x\n$ a \\\n  b && c # note")) == [
        ["eatta-bench", "list"],
        ["a", "b"],
        ["c"],
    ]
    assert list(commands("for lr in 1e-3 5e-3; do\n  x --lr=$lr ${lr}\ndone")) == [
        ["x", "--lr=1e-3", "1e-3"]
    ]


# ----------------------------------------------------------------------------- inline names

_NAME = re.compile(r"`(eatta(?:\.[A-Za-z_]\w*)+)")


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_inline_eatta_names_resolve():
    """`eatta.annotate.AnswerRefused` in a page must be something a user can import."""
    missing = []
    for page in PAGES:
        for m in _NAME.finditer(page.read_text(encoding="utf-8")):
            if not _resolves(m[1]):
                missing.append(f"{page.relative_to(REPO)}: {m[1]}")
    assert missing == []
    assert _resolves("eatta.annotate.queue.AnswerRefused")
    assert not _resolves("eatta.annotate.NoSuchName")


def test_python_blocks_parse():
    """Also the skipped ones: a block must at least be Python."""
    for b in PYTHON:
        ast.parse(b.code, b.name)


# ----------------------------------------------------------------------------- links

_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_relative_links_and_anchors_resolve(site_hooks):
    """Links between the pages; a link to a page the site's hook generates (the API reference,
    the changelog) only needs the page to be generated (`mkdocs build --strict` checks its
    anchors)."""
    generated = {(REPO / "docs" / uri).resolve() for uri in site_hooks.generated_pages()}
    broken = []
    checked = 0
    for page in PAGES:
        for m in _LINK.finditer(page.read_text(encoding="utf-8")):
            target = m["target"]
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            checked += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if dest in generated:
                continue
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == [] and checked >= 10
    assert _slug("Long streams: one label per batch against the field's anchors") == (
        "long-streams-one-label-per-batch-against-the-fields-anchors"
    )
