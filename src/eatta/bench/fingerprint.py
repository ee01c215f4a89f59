"""Fingerprints: a short hash of everything that determines a cell's result, the code included.

Finished results and checkpoints are stored under their fingerprint, so a run with other
arguments, data, source model or edited code never reads back (or resumes) someone else's result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from eatta import __version__
from eatta.bench.grid import CellSpec
from eatta.bench.options import AUTO_WINDOW
from eatta.methods import registry

if TYPE_CHECKING:
    from eatta.bench.benchmark import BenchmarkData
    from eatta.bench.options import RunOptions

__all__ = ["code_digest", "fingerprint", "model_digest", "to_plain"]


def to_plain(value: Any, depth: int = 0) -> Any:
    """JSON-able, stable description of a hyperparameter value: objects by type and configuration,
    so a changed component changes the cell's fingerprint."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [to_plain(v, depth) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_plain(v, depth) for k, v in value.items()}
    if isinstance(value, Tensor):
        digest = hashlib.sha256(_bytes(value)).hexdigest()[:12]
        return f"<tensor {list(value.shape)} {value.dtype} {digest}>"
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, nn.Module):
        return {"type": kind, "state": model_digest(value)}
    if isinstance(value, type) or inspect.isroutine(value):
        name = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
        code = getattr(value, "__code__", None)
        if code is not None:  # a function: its body too (two lambdas differ)
            body = code.co_code + repr(code.co_consts).encode()
            name += " " + hashlib.sha256(body).hexdigest()[:8]
        return f"<{name}>"
    if depth >= 4:
        return f"<{kind}>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        attrs = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    elif hasattr(value, "__dict__"):
        attrs = {k: v for k, v in vars(value).items() if not k.startswith("_")}
    else:
        text = repr(value)
        return f"<{kind}>" if " at 0x" in text else text
    return {"type": kind, **{k: to_plain(v, depth + 1) for k, v in attrs.items()}}


@functools.cache
def code_digest() -> str:
    """Digest of the ``eatta`` package's source files (once per process), so results of edited
    code are never read back as finished."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def fingerprint(spec: CellSpec, data: BenchmarkData, options: RunOptions) -> str:
    """Short hash of everything that determines a cell's result (the code included)."""
    spec_ = registry.get_spec(spec.method)
    window = options.window  # recorded only where it can apply: batch-64 runs' stay as they were
    window_applies = window is not None and (window != "auto" or options.batch_size < AUTO_WINDOW)
    payload = {
        "spec": dataclasses.asdict(spec),
        "config": to_plain(data.config),
        "defaults_key": data.defaults_key,
        "domains": [(name, len(ds)) for name, ds in data.domains],  # type: ignore[arg-type]
        "hparams": to_plain(spec_.hparams(data.defaults_key, options.overrides(spec.method))),
        **{k: getattr(options, k) for k in ("batch_size", "seed", "limit", "rounds", "dirichlet")},
        **({"mixed": True} if options.mixed else {}),
        **({"window": str(window)} if window_applies else {}),
        **({"weight_anchor": options.weight_anchor} if options.weight_anchor is not None else {}),
        **({"online_cost": options.costs[spec.method]} if options.costs is not None else {}),
        **({"annotator": options.annotator.describe()} if options.annotator.simulated else {}),
        **({"monitor": options.monitor.describe()} if options.monitor.active else {}),
        "provenance": to_plain(data.provenance),
        "oracle": "ground-truth" if data.oracle_fn is None else "model",
        "version": __version__,
        "code": code_digest(),
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def model_digest(model: nn.Module) -> str:
    """Digest of a model's ``state_dict()`` (names, dtypes and bytes of its tensors)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        if isinstance(t, Tensor):
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(_bytes(t))
    return h.hexdigest()[:16]


def _bytes(t: Tensor) -> bytes:
    return t.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()
