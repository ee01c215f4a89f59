"""Shared helpers of the benchmark scripts: machine facts, results files, page templates, the
studies' streams, runs and options (the timing benchmarks' own: ``_timing.py``).

Not part of the package; the scripts run from this folder import it (it is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import string
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import eatta.bench
from eatta.bench import StreamProtocol
from eatta.bench.flags import seed_list
from eatta.bench.report import table_text
from eatta.bench.results import CellResult, atomic_write_text
from eatta.losses import default_entropy_margin, entropy

RESULTS = Path(__file__).resolve().parent / "results"


def scale_head(model: nn.Module, head: nn.Linear, x: Tensor, num_classes: int, tries: int) -> float:
    """Double ``head`` until at least half of ``x`` passes the entropy margin ``0.4 ln C`` (a
    random network is uniformly unsure, and EATTA would drop every sample), at most ``tries``
    times; returns the factor. A zero head (torchvision's ViT) is drawn from N(0, 0.02²) first."""
    margin = default_entropy_margin(num_classes)
    scale = 1.0
    with torch.no_grad():
        if not head.weight.any():
            nn.init.normal_(head.weight, std=0.02)
        for _ in range(tries):
            if float((entropy(model(x).float()) < margin).float().mean()) >= 0.5:
                break
            scale *= 2.0
            head.weight.mul_(2.0)
            if head.bias is not None:
                head.bias.mul_(2.0)
    return scale


def host(device: torch.device) -> dict[str, Any]:
    """The facts every timing records: versions, CPU, threads, device, command."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def machine(device: torch.device) -> dict[str, Any]:
    """Facts that make timings comparable: :func:`host`'s, the allocator, load, date, GPU."""
    info = host(device) | {
        "torch_interop_threads": torch.get_num_interop_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "malloc_env": {
            k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "LD_PRELOAD"))
        },
        "loadavg_start": _loadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cudnn_benchmark"] = torch.backends.cudnn.benchmark
    return info


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _loadavg() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def finish_meta(meta: dict[str, Any], started: float) -> None:
    meta["loadavg_end"] = _loadavg()
    meta["wall_s"] = round(time.perf_counter() - started, 1)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON, written atomically (an interrupted write leaves the last one)."""
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def fmt_mean_std(values: Sequence[float], digits: int = 1, empty: str = "-") -> str:
    """``"36.0 ± 0.2"`` over seeds (sample std); one seed: its value; none: ``empty``."""
    if not values:
        return empty
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], left: bool = False
) -> str:
    """A markdown table, the first column left-aligned, the others right (``left``: all left)."""
    return table_text(header, rows, len(header) if left else 1)


def replace_section(doc: Path, begin: str, end: str, text: str) -> None:
    """Replace what lies between the markers ``begin`` and ``end`` in ``doc`` by ``text`` (a
    study's generated section); a :class:`SystemExit` naming them if ``doc`` lacks either."""
    page = doc.read_text(encoding="utf-8")
    if begin not in page or end not in page:
        raise SystemExit(f"{doc} has no {begin} ... {end} section")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{text}\n{end}{tail}", encoding="utf-8")


def save_study(out: Path, data: dict[str, Any]) -> None:
    """A study so far as ``out/study.json``, written atomically (an interrupted write leaves the
    last complete one; ``--report-only`` renders from it)."""
    atomic_write_text(out / "study.json", json.dumps(data, indent=1))


def load_study(out: Path) -> dict[str, Any]:
    """The study saved in ``out`` (``out/study.json``), to resume; a new one if there is none."""
    path = out / "study.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"streams": {}}


TEMPLATES = Path(__file__).resolve().parent / "templates"
_FRAGMENT = re.compile(r"^<!-- fragment: ([\w-]+) -->\n", re.MULTILINE)


class Template:
    """The prose of a generated page: ``templates/<name>.md``, ``$placeholders`` filled by
    :class:`string.Template`. The text before the first ``<!-- fragment: KEY -->`` line is the
    page; each such line starts a fragment (a sentence or paragraph the page may hold or not,
    or repeat), its trailing newlines dropped."""

    def __init__(self, name: str) -> None:
        parts = _FRAGMENT.split((TEMPLATES / f"{name}.md").read_text(encoding="utf-8"))
        self.parts = {"page": string.Template(parts[0])}
        for key, text in zip(parts[1::2], parts[2::2], strict=True):
            self.parts[key] = string.Template(text.rstrip("\n"))

    def __call__(self, part: str = "page", /, **values: object) -> str:
        return self.parts[part].substitute(values)


#: The long streams the studies share (digits-C, but ``mnist``), by name.
STREAMS = {
    "recurring": StreamProtocol(rounds=10),
    "mixed": StreamProtocol(rounds=2, mixed=True),
    "ccc": StreamProtocol(rounds=5, ccc="slow"),
    "dirichlet": StreamProtocol(rounds=2, dirichlet=0.1),
    "mnist": StreamProtocol(rounds=5),
}
#: Their short versions, for smoke runs (``--quick``).
QUICK = {
    "recurring": StreamProtocol(rounds=2),
    "mixed": StreamProtocol(rounds=1, mixed=True),
    "ccc": StreamProtocol(rounds=1, ccc="fast"),
    "dirichlet": StreamProtocol(rounds=1, dirichlet=0.1),
    "mnist": StreamProtocol(rounds=1),
}


def streams(*names: str, quick: bool = False, **own: StreamProtocol) -> dict[str, StreamProtocol]:
    """The named streams in the order given (``quick``: their short versions); ``own``: a
    study's own version of a stream (``recurring=StreamProtocol(rounds=3)``), full runs only."""
    return {n: QUICK[n] if quick else own.get(n, STREAMS[n]) for n in names}


def run_part(
    out: Path,
    part: str,
    protocol: StreamProtocol,
    methods: Sequence[str],
    seeds: Sequence[int],
    *,
    dataset: str = "digits-c",
    jobs: int = 1,
    **options: Any,
) -> list[CellResult]:
    """One part of a study: :func:`eatta.bench.run` of ``methods`` on ``dataset`` streamed by
    ``protocol``, into ``out/part`` (finished cells read back), one thread a job, quiet; the
    other keywords are :func:`eatta.bench.run`'s (``annotator``, ``monitor``, ``hparams``...)."""
    started = time.perf_counter()
    fixed = dict(protocol=protocol, seeds=list(seeds), jobs=jobs, threads=1, progress=False)
    done = eatta.bench.run(dataset, list(methods), out=out / part, plot=False, **fixed, **options)
    print(f"  {part}: {len(done.results)} runs, {time.perf_counter() - started:.0f} s", flush=True)
    return done.results


def study_parser(
    doc: str | None, out: str, *, plan: Sequence[str] = (), parts: Sequence[str] = ()
) -> argparse.ArgumentParser:
    """The options every study shares: ``--seeds`` (``0-2``, ``0,2``), ``--out`` (the runs'
    folder; with ``--report-only`` folders, comma-separated, merged where the study can) and,
    for a study run in parts, ``--plan`` (``PART:STREAM`` items in order)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    p.add_argument("--seeds", type=seed_list, default="0-2", help="seeds, e.g. 0-2 or 1,2")
    p.add_argument("--out", default=out, help="folder of the runs")
    p.add_argument(
        "--report-only", action="store_true", help="render from the saved results, run nothing"
    )
    if plan:
        p.add_argument(
            "--plan", default=",".join(plan), help=f"PART:STREAM items in order (parts: {parts})"
        )
    return p


def parse_plan(text: str, parts: Sequence[str], names: Sequence[str]) -> list[tuple[str, str]]:
    """``--plan``'s ``PART:STREAM`` items; a SystemExit naming any unknown one."""
    plan = [tuple(x.split(":", 1)) for x in text.split(",") if x]
    if bad := [x for x in plan if len(x) != 2 or x[0] not in parts or x[1] not in names]:
        raise SystemExit(f"unknown plan items {bad}: PART:STREAM with PART in {parts}")
    return plan  # type: ignore[return-value]  # pairs, checked above


def write_tables(text: str, data: dict[str, Any], tables: str | Path) -> None:
    """A study's tables (``tables``, Markdown) and its numbers (the same name, ``.json``)."""
    path = Path(tables)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    path.with_suffix(".json").write_text(json.dumps(data, indent=1), encoding="utf-8")
