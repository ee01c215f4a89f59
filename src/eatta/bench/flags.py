"""Command-line flags declared once, on the option dataclasses' fields.

:func:`flag` stores a field's help and flag in its metadata, :func:`add_flags` turns the fields
into arguments and :func:`values` reads them back as the dataclass's keywords.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadOptions", "RunConfig", "add_flags", "flag", "seed_list", "split_csv", "values"]

_MISSING: Any = dataclasses.MISSING


def flag(
    help: str,
    default: Any = None,
    *,
    name: str | None = None,
    cli_default: Any = _MISSING,
    negate: bool = False,
    **argparse_kw: Any,
) -> Any:
    """A dataclass field with its flag: ``--name`` (default: the field's name), ``cli_default``
    where the command line's default differs, ``negate`` for a flag that turns the field off,
    and argparse's own keywords (``type``, ``metavar``, ``choices``, ``action``, ...)."""
    meta = {"help": help, "name": name, "cli_default": cli_default, "negate": negate}
    meta["argparse"] = argparse_kw
    return field(default=default, metadata=meta)


def _flagged(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def _flag_name(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata["name"] or f.name.replace("_", "-"))


def _dest(f: dataclasses.Field[Any]) -> str:
    return _flag_name(f).replace("-", "_")


def add_flags(
    group: Any, cls: type, *, only: Sequence[str] | None = None, skip: Sequence[str] = ()
) -> None:
    """Add ``cls``'s flagged fields (``only`` those, none of ``skip``) to a parser or group."""
    for f in _flagged(cls):
        if f.name in skip or (only is not None and f.name not in only):
            continue
        meta = f.metadata
        kw = dict(meta["argparse"])
        if meta["negate"] or (f.type in ("bool", bool) and "action" not in kw):
            kw.setdefault("action", "store_true")
        else:
            kw["default"] = f.default if meta["cli_default"] is _MISSING else meta["cli_default"]
        group.add_argument("--" + _flag_name(f), dest=_dest(f), help=meta["help"], **kw)


def values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """``cls``'s flagged fields read back from ``args``, by field name."""
    given = [(f, getattr(args, _dest(f))) for f in _flagged(cls)]
    return {f.name: (not value) if f.metadata["negate"] else value for f, value in given}


def is_int(value: object) -> bool:
    """Whether ``value`` is an int (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_positive(value: object) -> bool:
    """Whether ``value`` is a finite number > 0 (a bool is not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf


def split_csv(text: str) -> list[str]:
    """The comma-separated items of ``text``, stripped, empty ones dropped."""
    return [t.strip() for t in text.split(",") if t.strip()]


def _int(text: str, error: str) -> int:
    """``int(text)``, or an argparse error saying ``error``."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(error) from None


def _ints(text: str) -> list[int]:
    error = f"expected integers separated by commas, got {text!r}"
    return [_int(t, error) for t in split_csv(text)]


def seed_list(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,2,5"`` -> [0, 2, 5]; ranges and lists may mix."""
    error = f"seeds are integers or ranges such as 0-4 or 0,1,2, got {text!r}"
    out: list[int] = []
    for part in split_csv(text):
        lo, sep, hi = part.partition("-")
        if not (sep and lo):
            out.append(_int(part, error))
            continue
        a, b = _int(lo, error), _int(hi, error)
        if b < a:
            raise argparse.ArgumentTypeError(f"empty seed range {part!r}")
        out.extend(range(a, b + 1))
    if not out or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"seeds must be distinct and non-empty, got {text!r}")
    return out


def _buffers(text: str) -> list[int | None]:
    out: list[int | None] = []
    for t in split_csv(text):
        default = t.lower() in ("default", "none", "-")
        out.append(None if default else _int(t, f"buffer sizes are integers, got {t!r}"))
    return out


def _window(text: str) -> int | str:
    if text in ("auto", "off"):
        return text
    size = _int(text, f"--window must be auto, off or a number of samples, got {text!r}")
    if size < 2:
        raise argparse.ArgumentTypeError(f"--window must hold at least 2 samples, got {size}")
    return size


def _severity(text: str) -> int:
    error = f"severity is an integer from 1 to 5, got {text!r}"
    value = _int(text, error)
    if not 1 <= value <= 5:
        raise argparse.ArgumentTypeError(error)
    return value


def _subset(text: str) -> int | str | None:
    if text.lower() == "all":
        return None
    return int(text) if text.isdigit() else text


@dataclass
class RunConfig:
    """:func:`eatta.bench.run`'s grid and execution keywords; flags of ``eatta-bench run``."""

    settings: str | Sequence[str] = flag(
        "ctta (never reset), ftta (reset at each domain change), or both: ctta,ftta",
        ("ctta",),
        name="setting",
        cli_default="ctta",
    )
    labels: int | Sequence[int] = flag(
        "labels per batch for active methods", 1, type=_ints, cli_default="1", metavar="K[,K]"
    )
    every: int | Sequence[int] = flag(
        "label only every N-th batch", 1, type=_ints, cli_default="1", metavar="N[,N]"
    )
    buffers: int | Sequence[int | None] | None = flag(
        "labelled-sample buffer size for active methods (default: 'default', the method's own)",
        name="buffer",
        type=_buffers,
        cli_default="default",
        metavar="N[,N]",
    )
    seeds: int | Sequence[int] = flag(
        "run every cell once per seed and report mean ± std (instead of --seed)",
        0,
        type=seed_list,
        cli_default=None,
        metavar="0-4|0,1,2",
    )
    batch_size: int = flag("images per batch (64 in the paper)", 64, type=int)
    window: int | str | None = flag(
        "batches smaller than N samples are served on robust statistics and adapted on as a "
        "window of the last N, one step every N samples, labels per sample as --labels/--every "
        "give them (docs/small-batches.md); auto: N = 64 for batches under 64 (BatchNorm and "
        "LayerNorm models)",
        "auto",
        type=_window,
        metavar="auto|off|N",
    )
    weight_anchor: float | None = flag(
        "after each step pull the adapted weights toward the given ones, theta <- A theta + "
        "(1 - A) theta_0 (ROID's weight ensembling, e.g. 0.99; eatta.anchor.WeightAnchor)",
        type=float,
        metavar="A",
    )
    realtime: str | None = flag(
        "offline: the stream waits for every step; online (Alfarra et al.): a step costing r "
        "source predictions adapts on one batch in ceil(r), the others served unadapted "
        "(docs/realtime.md); both: side by side (default: offline; both for eatta-bench "
        "without arguments, the main job)",
        choices=("offline", "online", "both"),
        name="protocol",
    )
    speeds: str | None = flag(
        "the online costs r: 'measure' (timed here before the run, kept as speeds.json) or "
        "such a file (the main job: the committed CPU table)",
        metavar="measure|FILE",
    )
    limit: int | None = flag(
        "at most this many images per domain (seeded subset; smoke runs)", type=int
    )
    shard: str | tuple[int, int] | None = flag(
        "run only grid cells j with j mod n == i (0 <= i < n); auto: i and n from a Slurm "
        "job array (sbatch --array=0-<n-1>) or EATTA_SHARD=i/n",
        metavar="i/n|auto",
    )
    out: str | None = flag("output folder (default: runs/NAME, NAME from --name)")
    name: str | None = flag("run name, for runs/NAME (default: the datasets joined by '+')")
    workers: int | None = flag(
        "data-loading worker processes (default: 0 on the CPU, up to 8 on a GPU)", type=int
    )
    device: str = flag("cpu, cuda, cuda:1, or auto", "auto")
    jobs: int | None = flag(
        "cells run in parallel processes of one thread each (default: every core for the "
        "embedded datasets (digits-c, mnist, digits-deployed) on the CPU, else 1); results are "
        "identical to a serial run",
        type=int,
    )
    threads: int | None = flag(
        "torch CPU threads (default: 1 for the embedded datasets on the CPU, whose tiny "
        "convolutions only lose from intra-op parallelism, else torch's own)",
        type=int,
    )
    checkpoint_every: int = flag(
        "save a resumable checkpoint every this many batches (0: never)",
        100,
        type=int,
        metavar="BATCHES",
    )
    reuse: bool = flag(
        "ignore finished cells and checkpoints in the output folder",
        True,
        name="rerun",
        negate=True,
    )
    progress: bool = flag("no progress bar", True, name="no-progress", negate=True)
    plot: bool = flag("skip the PNG plot", True, name="no-plot", negate=True)


@dataclass
class LoadOptions:
    """:func:`eatta.bench.api.load_benchmarks`' keywords; flags of ``eatta-bench run``."""

    roots: Any = flag(
        "dataset folder; repeat as NAME=PATH for several datasets",
        name="root",
        action="append",
        cli_default=[],
        metavar="[DATASET=]PATH",
    )
    sequences: str | Sequence[str] = flag(
        "PACS sequence(s), comma-separated (P-A-C-S, A-C-P-S, C-A-S-P, S-C-P-A)",
        ("P-A-C-S",),
        name="sequence",
        cli_default="P-A-C-S",
    )
    severity: int | None = flag(
        "corruption severity (default: 5 for digits-c and imagenet-c, 2 for digits-deployed; "
        "the other datasets have none)",
        type=_severity,
        metavar="1-5",
    )
    subset: int | str | None = flag(
        "ImageNet-C images per corruption: all (the paper), a count, or a list file",
        type=_subset,
        cli_default="all",
    )
    image_size: int = flag(
        "input size for ImageNet-R/K/A and PACS (smaller for smoke tests)", 224, type=int
    )
    backbone: str | None = flag(
        "the model: digits-cnn (BatchNorm) or digits-vit (LayerNorm) for digits-c, mnist and "
        "digits-deployed; resnet50_bn, resnet50_gn or vit_b_16 for ImageNet; resnet18 for PACS "
        "(default: the first of each)"
    )
    checkpoint: str | None = flag(
        "local weights; for PACS '{source}' becomes the source domain letter"
    )
    pretrained: bool = flag(
        "no pretrained weights (smoke tests only)", True, name="random-init", negate=True
    )
    oracle_backbone: str | None = flag("the annotating model's backbone")
    oracle_checkpoint: str | None = flag("the annotating model's weights")
    fisher_root: str | None = flag("clean ImageNet images (<wnid>/*) for EATA's Fisher regularizer")
    cache_dir: str | None = flag(
        "digits-C cache (default: $EATTA_CACHE/digits-c, else ~/.cache/eatta/digits-c)"
    )
