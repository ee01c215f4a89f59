"""The source model of the embedded digits-C benchmark: a small BatchNorm CNN, trained once, cached.

* Architecture (:func:`digits_cnn`): three conv-BN-ReLU blocks (16, 32, 64 channels; the first
  with stride 2, max-pooling after the second), global average pooling and a ``Linear`` head, all
  in one ``nn.Sequential`` so EATTA's backbone/head split is automatic. Input: ``[N, 3, 32, 32]``
  in ``[0, 1]``, as :mod:`eatta.data.digits` produces.
* Training (:func:`train_digits_cnn`): the clean source split of :func:`eatta.data.digits_source`,
  Adam with a one-cycle learning rate, random shifts of up to 1 pixel, seeded initialization and
  batch order, single-threaded on the CPU (so the result does not depend on the core count).
* Packaged weights (:func:`packaged_digits_source`, what ``eatta-bench`` uses): the recipe's
  result for seed 0 ships inside the package (``digits_source_v<VERSION>.pt``, ~100 KB) with the
  SHA-256 of its tensors (:data:`DIGITS_SOURCE_SHA256`), because retraining is not reproducible
  across CPUs: the same seed, on one thread, gives other weights with other vector kernels
  (``ATEN_CPU_CAPABILITY=default`` vs ``avx2``), hence other benchmark numbers.
  ``tools/train_digits_source.py`` regenerates the file.
* Cache: the state dict and a small report (clean test accuracy, training time) are stored as
  ``digits-source-v<VERSION>-seed<seed>.pt`` in the digits-C cache folder
  (:func:`eatta.data.digits_c_cache_dir`: ``$EATTA_CACHE/digits-c`` or
  ``~/.cache/eatta/digits-c``). Bump :data:`DIGITS_MODEL_VERSION` when the recipe changes.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from eatta.data.digits import digits_c_cache_dir, digits_source, digits_test

__all__ = [
    "DIGITS_MODEL_VERSION",
    "DIGITS_SOURCE_SHA256",
    "PACKAGED_WEIGHTS",
    "digits_cnn",
    "digits_model_path",
    "digits_source_model",
    "fit_digits_source",
    "load_digits_source",
    "packaged_digits_source",
    "state_digest",
    "train_digits_cnn",
]

#: Version of the architecture + training recipe; part of the cache file name.
DIGITS_MODEL_VERSION = "1"

#: The packaged weights (seed 0) and the SHA-256 of their tensors (:func:`state_digest`).
PACKAGED_WEIGHTS = Path(__file__).with_name(f"digits_source_v{DIGITS_MODEL_VERSION}.pt")
DIGITS_SOURCE_SHA256 = "787158ab920a59a6c8bf086f6a057d155db55ead742654f3b234fdf641e59daf"

_EPOCHS = 20
_BATCH = 64
_MAX_LR = 1e-2
_SHIFT = 1

M = TypeVar("M", bound=nn.Module)


def digits_cnn(num_classes: int = 10, width: int = 16) -> nn.Sequential:
    """The untrained digits-C source network (a ``Sequential`` ending in ``nn.Linear``)."""
    w = width
    return nn.Sequential(
        nn.Conv2d(3, w, 3, stride=2, padding=1, bias=False),  # 32 -> 16
        nn.BatchNorm2d(w),
        nn.ReLU(inplace=True),
        nn.Conv2d(w, 2 * w, 3, padding=1, bias=False),
        nn.BatchNorm2d(2 * w),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),  # 16 -> 8
        nn.Conv2d(2 * w, 4 * w, 3, padding=1, bias=False),
        nn.BatchNorm2d(4 * w),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, num_classes),
    )


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _shift(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Translate the whole batch by the same random offset in ``[-_SHIFT, _SHIFT]`` pixels."""
    size = x.shape[-1]
    padded = F.pad(x, (_SHIFT, _SHIFT, _SHIFT, _SHIFT))
    dx, dy = torch.randint(0, 2 * _SHIFT + 1, (2,), generator=g).tolist()
    return padded[..., dy : dy + size, dx : dx + size]


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = sum(
        int((model(x[i : i + 256]).argmax(1) == y[i : i + 256]).sum())
        for i in range(0, len(x), 256)
    )
    return correct / len(x)


def fit_digits_source(
    build: Callable[[], M],
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
    *,
    max_lr: float,
    epochs: int,
    seed: int,
    version: str,
) -> tuple[M, dict[str, Any]]:
    """The digits source models' recipe: ``build()`` (seeded), trained by ``optimizer`` with a
    one-cycle learning rate up to ``max_lr`` on the clean source split, batches of 64 in a seeded
    order, each shifted by up to 1 pixel, on one thread; returns the model (eval mode) and its
    report ``{"clean_test_accuracy", "source_accuracy", "train_seconds", "epochs", "seed",
    "version"}``."""
    x, y = digits_source(seed=seed).tensors
    start = time.perf_counter()
    with _one_thread():
        g = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build()
        opt = optimizer(model.parameters())
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=max_lr, total_steps=epochs * -(-len(x) // _BATCH)
        )
        model.train()
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=g)
            for i in range(0, len(x), _BATCH):
                idx = order[i : i + _BATCH]
                if len(idx) < 2:  # BatchNorm cannot train on a batch of one
                    continue
                loss = F.cross_entropy(model(_shift(x[idx], g)), y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
        seconds = time.perf_counter() - start
        xt, yt = digits_test(seed=seed).tensors
        report = {
            "clean_test_accuracy": _accuracy(model, xt, yt),
            "source_accuracy": _accuracy(model, x, y),
            "train_seconds": seconds,
            "epochs": epochs,
            "seed": seed,
            "version": version,
        }
    return model.eval(), report


def train_digits_cnn(
    seed: int = 0, epochs: int | None = None
) -> tuple[nn.Sequential, dict[str, Any]]:
    """Train :func:`digits_cnn` on the clean source split (``epochs`` default: the recipe's 20;
    Adam, :func:`fit_digits_source`); returns the model (eval mode) and its report."""
    epochs = _EPOCHS if epochs is None else epochs
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    return fit_digits_source(
        digits_cnn,
        lambda params: torch.optim.Adam(params, lr=_MAX_LR),
        max_lr=_MAX_LR,
        epochs=epochs,
        seed=seed,
        version=DIGITS_MODEL_VERSION,
    )


def digits_model_path(cache_dir: str | os.PathLike[str] | None = None, seed: int = 0) -> Path:
    """Where the trained weights are cached (see the module docstring)."""
    return digits_c_cache_dir(cache_dir) / f"digits-source-v{DIGITS_MODEL_VERSION}-seed{seed}.pt"


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        state, report = blob["state_dict"], dict(blob["report"])
    except (
        OSError,
        KeyError,
        TypeError,
        RuntimeError,
        EOFError,
        ValueError,
        pickle.UnpicklingError,
    ):
        return None
    if report.get("version") != DIGITS_MODEL_VERSION:
        return None
    return state, report


def _write(path: Path, model: nn.Module, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"state_dict": model.state_dict(), "report": report}, f)
        os.replace(tmp, path)  # atomic: concurrent readers see the old file or the new one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_digits_source(
    cache_dir: str | os.PathLike[str] | None = None, retrain: bool = False, seed: int = 0
) -> tuple[nn.Sequential, dict[str, Any]]:
    """The trained digits-C source model (eval mode) and its report, trained on first use.

    The report holds ``clean_test_accuracy`` (on the uncorrupted test split), ``source_accuracy``,
    ``train_seconds``, ``epochs``, ``seed``, ``version``, ``cached`` (whether it was read from the
    cache) and ``path``. ``retrain=True`` ignores and overwrites the cached file.
    """
    path = digits_model_path(cache_dir, seed)
    found = None if retrain else _read(path)
    if found is not None:
        state, report = found
        model = digits_cnn()
        model.load_state_dict(state)
        model.eval()
        report["cached"] = True
    else:
        model, report = train_digits_cnn(seed=seed)
        _write(path, model, report)
        report["cached"] = False
    report["path"] = str(path)
    return model, report


def digits_source_model(
    cache_dir: str | os.PathLike[str] | None = None, retrain: bool = False
) -> nn.Module:
    """The digits-C source model (trained and cached on first call); see :func:`load_digits_source`
    for its report (clean test accuracy)."""
    return load_digits_source(cache_dir, retrain)[0]


def state_digest(model_or_state: nn.Module | dict[str, torch.Tensor]) -> str:
    """SHA-256 over a state dict's names, dtypes, shapes and bytes (identical weights, identical
    digest, whatever file format stored them)."""
    import hashlib

    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        h.update(t.flatten().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def packaged_digits_source() -> tuple[nn.Sequential, dict[str, Any]]:
    """The source model shipped with the package (eval mode) and its report (as
    :func:`load_digits_source`, plus ``"packaged": True`` and ``"sha256"``).

    Raises ``RuntimeError`` if the file is missing or its weights do not match
    :data:`DIGITS_SOURCE_SHA256` (a damaged installation).
    """
    found = _read(PACKAGED_WEIGHTS) if PACKAGED_WEIGHTS.is_file() else None
    if found is None:
        raise RuntimeError(
            f"the packaged digits source weights {str(PACKAGED_WEIGHTS)!r} are "
            "missing or unreadable; reinstall eatta"
        )
    state, report = found
    digest = state_digest(state)
    if digest != DIGITS_SOURCE_SHA256:
        raise RuntimeError(
            f"the packaged digits source weights are damaged (SHA-256 {digest[:16]}..., "
            f"expected {DIGITS_SOURCE_SHA256[:16]}...); reinstall eatta"
        )
    model = digits_cnn()
    model.load_state_dict(state)
    model.eval()
    report.update(cached=True, packaged=True, sha256=digest, path=str(PACKAGED_WEIGHTS))
    return model, report
