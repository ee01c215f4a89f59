"""Miniature benchmark data for the harness tests: tiny tensors and tiny JPEG folder trees.

The folder trees follow the real layouts (ImageNet-C ``<corruption>/<severity>/<wnid>/*.JPEG``,
ImageNet-R/A/Sketch ``<wnid>/*.jpg``, PACS ``<domain>/<class>/*.jpg``) with a few small images per
class, so the real dataset classes, the CLI and the reproduction scripts run end to end in seconds.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import TensorDataset

from eatta.bench.benchmark import BenchmarkData

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_thread():
    """Run each test with one torch thread (restored afterwards): the tiny models gain nothing
    from more, and on a busy 2-core machine intra-op threads slow them down many times over."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_net(num_classes: int = 4, seed: int = 0) -> nn.Sequential:
    """conv-BN-ReLU, pool, Linear on 3x8x8 inputs; the head is scaled so entropies are low."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(6, num_classes),
    )
    with torch.no_grad():
        net[-1].weight.mul_(6.0)
    return net.eval()


def tensor_domains(
    names: Sequence[str] = ("a", "b", "c"), n: int = 20, num_classes: int = 4, seed: int = 0
) -> list[tuple[str, TensorDataset]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, name in enumerate(names):
        x = torch.randn(n, 3, 8, 8, generator=g) * (1 + k) + 0.3 * k
        y = torch.randint(0, num_classes, (n,), generator=g)
        out.append((name, TensorDataset(x, y)))
    return out


def tiny_benchmark(name: str = "toy", n: int = 20, oracle_fn=None) -> BenchmarkData:
    base = tiny_net()
    return BenchmarkData(
        name=name,
        defaults_key="default",
        domains=tensor_domains(n=n),
        model_fn=lambda: __import__("copy").deepcopy(base),
        fisher_data=lambda device: [torch.randn(8, 3, 8, 8)],
        oracle_fn=oracle_fn,
        config={"toy": n},
    )


def fake_digits_c(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Replace the digits-C benchmark by a tiny stand-in for one test (the real one:
    tests/models/test_digits_cnn); returns the list of the cache folders it was asked for."""
    from eatta.bench import suites

    calls: list[str | None] = []

    def fake(cache_dir=None, *, log=None, gradual=False, ccc=None, severity=5, backbone=None):
        calls.append(cache_dir)
        b = tiny_benchmark(name=suites.digits_grid_name(backbone))
        b.defaults_key = "digits-c"
        b.config["severity"] = None if gradual or ccc else severity
        b.provenance = {"data_sha256": "d1", "model_sha256": "m1"}
        b.expected_provenance = dict(b.provenance)
        return b

    monkeypatch.setattr(suites, "digits_c_benchmark", fake)
    return calls


def _jpeg(path: Path, rng: np.random.Generator, size: int, tint: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    img[..., tint % 3] = np.clip(img[..., tint % 3].astype(int) + 80, 0, 255).astype(np.uint8)
    Image.fromarray(img).save(path, quality=90)


def make_imagenet_c(
    root: Path, wnids: Sequence[str], per_class: int = 2, size: int = 16, severity: int = 5
) -> Path:
    from eatta.data.imagenet import CORRUPTIONS

    rng = np.random.default_rng(0)
    for c in CORRUPTIONS:
        for k, w in enumerate(wnids):
            for i in range(per_class):
                _jpeg(
                    root / c / str(severity) / w / f"ILSVRC2012_val_{k:04d}{i:04d}.JPEG",
                    rng,
                    size,
                    k,
                )
    return root


def make_wnid_folders(root: Path, wnids: Sequence[str], per_class: int = 2, size: int = 20) -> Path:
    rng = np.random.default_rng(1)
    for k, w in enumerate(wnids):
        for i in range(per_class):
            _jpeg(root / w / f"img_{i}.jpg", rng, size, k)
    return root


def make_pacs(root: Path, per_class: int = 2, size: int = 20) -> Path:
    from eatta.data.pacs import PACS_CLASSES, PACS_DOMAINS

    rng = np.random.default_rng(2)
    for d in PACS_DOMAINS:
        for k, c in enumerate(PACS_CLASSES):
            for i in range(per_class):
                _jpeg(root / d / c / f"pic_{i:03d}.jpg", rng, size, k)
    return root


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module."""
    path = REPO / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def assert_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 1000
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] > 100 and img.size[1] > 100


class Interrupted(Exception):
    """Raised by :func:`cli_run_interrupted` to stop a run in the middle of a cell."""


def cli_run_interrupted(
    argv: list[str], out: Path, monkeypatch: pytest.MonkeyPatch, stop_after: int
) -> None:
    """Run ``eatta-bench run ARGV --out OUT`` once, stopped after batch ``stop_after`` of the
    first cell (its checkpoint stays), then again to the end (one process: ``--jobs 1``)."""
    import eatta.bench.api as api
    import eatta.bench.cli as cli

    real = api.run_grid

    def interrupting(*args: Any, **kwargs: Any) -> Any:
        def callback(t: int, info: Any) -> None:
            if t == stop_after:
                raise Interrupted

        return real(*args, **kwargs, callback=callback)

    monkeypatch.setattr(api, "run_grid", interrupting)
    with pytest.raises(Interrupted):
        cli.main([*argv, "--out", str(out)])
    assert len(list((out / "checkpoints").glob("*.pt"))) == 1
    monkeypatch.setattr(api, "run_grid", real)
    assert cli.main([*argv, "--out", str(out)]) == 0


def assert_cli_fails_before_any_work(
    argv: Sequence[str], message: str, out: Path, err: Any, loaded: list[Any]
) -> None:
    """``eatta-bench argv --out out`` exits with 2, prints ``message``, writes nothing and loads
    no data (``loaded``: the calls :func:`fake_digits_c` recorded; ``err``: capsys)."""
    import eatta.bench.cli as cli

    try:
        code = cli.main([*argv, "--out", str(out)])
    except SystemExit as e:  # argparse's own checks
        code = e.code
    assert code == 2
    assert message in err.readouterr().err
    assert not out.exists() and loaded == []
