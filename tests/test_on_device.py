"""Every method and the composed parts on the model's device: the CPU half runs everywhere, the
CUDA half (marked ``gpu``; ``pytest -m gpu``, as ``benchmarks/gpu_check.py`` runs it) where a
GPU is present. What must follow the model there: outputs, every stored floating-point tensor,
the checkpoint, ``reset()``, bf16 autocast. Ran on one H100: 24 passed
(``benchmarks/results/gpu_check.json``)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import eatta
from conftest import nested_equal
from eatta.annotate.simulated import SimulatedAnnotator
from eatta.methods.registry import available, get_spec
from eatta.models.digits_cnn import packaged_digits_source
from eatta.monitor.fallback import SourceFallback

pytestmark = pytest.mark.small_batches  # tiny batches on purpose: fast checks

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ],
)
DEVICES = ["cpu", CUDA]


def stream(batches: int, size: int, device: str, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    """Shifted digits-shaped batches, drawn on the CPU (the same data on every device)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batches * size, 3, 32, 32, generator=g) * 0.8 + 0.1
    y = torch.randint(0, 10, (batches * size,), generator=g)
    return [
        (x[i : i + size].to(device), y[i : i + size].to(device))
        for i in range(0, batches * size, size)
    ]


def digits(device: str) -> nn.Module:
    return packaged_digits_source()[0].to(device)


def build(name: str, model: nn.Module, **kw: object) -> eatta.AdaptiveMethod:
    torch.manual_seed(0)
    if name == "eata":  # its Fisher regularizer needs clean inputs
        clean = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(1))
        kw.setdefault("fisher_data", [clean.to(next(model.parameters()).device)])
    if get_spec(name).active:
        kw.setdefault("oracle", eatta.GroundTruthOracle())
    return eatta.create(name, model, **kw)  # type: ignore[arg-type]


def adapted_tensors(method: nn.Module) -> list[Tensor]:
    return [t.detach().clone() for t in method.model.state_dict().values() if t.is_floating_point()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", available())
def test_every_method_serves_and_adapts_on_the_models_device(name: str, device: str) -> None:
    """Six batches of 16: logits on the model's device and finite, the stored floats there,
    labels counted, and (but for ``source``) the model moved. Integer bookkeeping (generator
    states, asked indices) may stay on the host."""
    method = build(name, digits(device))
    before = adapted_tensors(method)
    for x, y in stream(6, 16, device):
        out = method(x, labels=y) if get_spec(name).active else method(x)
        assert out.device.type == device and out.shape == (16, 10)
        assert torch.isfinite(out).all()
    state = _tensors(method.state_dict())
    off = [p for p, t in state if t.is_floating_point() and t.device.type != device]
    assert [p for p in off if not p.endswith(CPU_BY_DESIGN)] == []
    moved = not all(torch.equal(a, b) for a, b in zip(before, adapted_tensors(method), strict=True))
    assert moved == (name != "source")
    if get_spec(name).active:
        assert 1 <= method.labels_used <= 6


#: state kept on the CPU on purpose: an optimizer's step count (PyTorch's Adam, unless
#: capturable) and HILTTA's score average (float64, one value a candidate, decided on the host).
CPU_BY_DESIGN = (".step", "hiltta.scores")


def _tensors(state: object, path: str = "") -> list[tuple[str, Tensor]]:
    """(dotted path, tensor) for every tensor in a nested state."""
    if isinstance(state, Tensor):
        return [(path, state)]
    items: list[tuple[object, object]] = []
    if isinstance(state, dict):
        items = list(state.items())
    elif isinstance(state, list | tuple):
        items = list(enumerate(state))
    return [pt for k, v in items for pt in _tensors(v, f"{path}.{k}" if path else str(k))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [1, 8, 64])
def test_the_safe_composition_on_the_models_device(size: int, device: str) -> None:
    """eatta-safe with a 16-sample window, the approximate step and answers 16 window steps
    late: every request served on the device, a step every 16 samples, the answers scored."""
    method = build(
        "eatta-safe",
        digits(device),
        oracle=SimulatedAnnotator(delay=16),
        grad_mode="approx",
        window=16,
    )
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    samples = 20 * 64 if size == 64 else 20 * 16
    for x, y in stream(samples // size, size, device):
        out = method(x, labels=y)
        assert out.device.type == device and torch.isfinite(out).all()
    steps = samples // 64 if size == 64 else samples // 16
    assert fb.step == steps and method.labels_used == steps
    assert fb.stats()["answers"] == steps - 16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["eatta", "eatta-safe", "tent"])
def test_a_checkpoint_continues_the_stream_and_reset_restores(name: str, device: str) -> None:
    """state_dict() after 4 batches, loaded into a fresh method, gives the same next 4 outputs
    (to float tolerance: CUDA kernels may reduce in another order); reset() restores the model."""
    xs = stream(8, 16, device)
    a = build(name, digits(device))
    given = copy.deepcopy(a.model.state_dict())
    active = get_spec(name).active
    for x, y in xs[:4]:
        a(x, labels=y) if active else a(x)
    state = copy.deepcopy(a.state_dict())
    tail_a = [(a(x, labels=y) if active else a(x)).detach() for x, y in xs[4:]]
    b = build(name, digits(device))
    b.load_state_dict(state)
    tail_b = [(b(x, labels=y) if active else b(x)).detach() for x, y in xs[4:]]
    for p, q in zip(tail_a, tail_b, strict=True):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-4)
    a.reset()
    assert nested_equal(a.model.state_dict(), given)


@pytest.mark.parametrize("grad_mode", ["auto", "approx"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_autocast_steps_in_fp32_weights(grad_mode: str) -> None:
    """``autocast=True``: the forward in bf16, the weights and the optimizer state stay fp32,
    every output finite, and the model adapts."""
    method = build("eatta", digits("cuda"), autocast=True, grad_mode=grad_mode)
    before = adapted_tensors(method)
    for x, y in stream(6, 32, "cuda"):
        out = method(x, labels=y)
        assert torch.isfinite(out).all()
    assert all(p.dtype == torch.float32 for p in method.model.parameters())
    after = adapted_tensors(method)
    assert not all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eatta_on_cuda_follows_the_cpu_step() -> None:
    """The faithful step on CUDA tracks the CPU's over 5 batches: same labels asked for, logits
    within float tolerance."""
    cpu = build("eatta", digits("cpu"))
    gpu = build("eatta", digits("cuda"))
    for x, y in stream(5, 32, "cpu"):
        p = cpu(x, labels=y)
        q = gpu(x.cuda(), labels=y.cuda())
        torch.testing.assert_close(q.cpu(), p, rtol=1e-3, atol=1e-3)
    assert cpu.labels_used == gpu.labels_used
