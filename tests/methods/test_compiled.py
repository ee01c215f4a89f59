"""A compiled model (``torch.compile(model)``, an ``OptimizedModule``) under every method.

Each registered method wraps the compiled model and the eager one (same weights, same stream):
after 20 steps the predictions and the adapted weights agree within 1e-4. ``aot_eager`` runs
aot_autograd as inductor does (its graphs donate buffers to their backward, which EATTA's two
gradient passes met first), with eager kernels, so it compiles in about a second; one test runs
inductor itself. EATTA's split is found on the wrapped module and its backbone is compiled
(``eatta.split``, ``docs/guide/compile.md``).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import Tensor, nn

import eatta
from eatta.methods.registry import get_spec
from eatta.models.digits_cnn import packaged_digits_source
from eatta.split import SplitNotFoundError, is_compiled, split_model

pytestmark = [
    pytest.mark.small_batches,
    # torch's own compile path calls its deprecated torch.jit.script_method (not eatta's code)
    pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning"),
]

STEPS = 20
TOL = 1e-4


class FeaturesClassifier(nn.Module):
    """A ``features`` / ``classifier`` CNN (no rule by class: its split is discovered)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.Conv2d(6, 8, 3, stride=2, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(8, 5)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def stream(size: int, pixels: int, classes: int) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(size, 3, pixels, pixels, generator=g) * 0.8 + 0.1,
            torch.randint(0, classes, (size,), generator=g),
        )
        for _ in range(STEPS)
    ]


def run(name: str, model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> Tensor:
    """The method's predictions over the stream, and the model's weights after it, as one row."""
    method, kw = ("eatta", {"grad_mode": "approx"}) if name == "eatta~approx" else (name, {})
    torch.manual_seed(0)
    if method == "eata":
        x = batches[0][0]
        kw = {
            **kw,
            "fisher_data": [torch.randn(x.shape, generator=torch.Generator().manual_seed(1))],
        }
    active = get_spec(method).active
    if active:
        kw = {**kw, "oracle": eatta.GroundTruthOracle()}
    m = eatta.create(method, model, **kw)  # type: ignore[arg-type]
    outs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x, y in batches:
            outs.append(m(x, labels=y) if active else m(x))
    weights = [t.detach().reshape(-1) for t in model.state_dict().values() if t.is_floating_point()]
    return torch.cat([torch.cat(outs).reshape(-1), *weights])


def compare(
    name: str, make: nn.Module, batches: list[tuple[Tensor, Tensor]], backend: str
) -> float:
    eager = run(name, copy.deepcopy(make), batches)
    compiled = run(name, torch.compile(copy.deepcopy(make), backend=backend), batches)
    return float((eager - compiled).abs().max())


#: EATTA's steps (the split and two gradient passes through the compiled backbone; eatta-safe
#: is eatta-stable's step with a fallback), and TENT for the methods that run the compiled
#: model whole. Every registered method, on both models: ``benchmarks/step_benchmark.py
#: --compile-check`` (about 20 minutes on a loaded 2-core machine; its last run is in
#: ``benchmarks/results/compile_check_aot_eager.json``).
EATTA_STEPS = ["eatta", "eatta-safe", "eatta~approx"]


@pytest.mark.parametrize("name", [*EATTA_STEPS, "tent"])
def test_a_compiled_features_classifier_model_adapts_as_the_eager_one(name: str) -> None:
    torch._dynamo.reset()
    diff = compare(name, FeaturesClassifier(), stream(8, 8, 5), "aot_eager")
    assert diff <= TOL, f"{name}: compiled and eager differ by {diff:.2e} after {STEPS} steps"


@pytest.mark.parametrize("name", ["eatta"])
def test_a_compiled_digits_cnn_adapts_as_the_eager_one(name: str) -> None:
    torch._dynamo.reset()
    diff = compare(name, packaged_digits_source()[0], stream(8, 32, 10), "aot_eager")
    assert diff <= TOL, f"{name}: compiled and eager differ by {diff:.2e} after {STEPS} steps"


def test_inductor_compiled_features_classifier_adapts_as_the_eager_one() -> None:
    torch._dynamo.reset()
    diff = compare("eatta", FeaturesClassifier(), stream(8, 8, 5), "inductor")
    assert diff <= TOL, f"inductor: compiled and eager differ by {diff:.2e} after {STEPS} steps"


def test_without_the_scoped_setting_the_second_gradient_pass_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tests above can fail: with donated buffers left on (the compiled backbone called
    plainly, no scope around the step), EATTA's second gradient pass through the compiled
    backbone is refused on this backend, as it was before the fix."""
    import contextlib

    import eatta.methods.eatta as eatta_module
    from eatta.split import _CompiledFeatures

    monkeypatch.setattr(_CompiledFeatures, "forward", lambda self, x: self.compiled(x))
    monkeypatch.setattr(eatta_module, "backward_twice", lambda model: contextlib.nullcontext())
    torch._dynamo.reset()
    m = eatta.create(
        "eatta-safe", torch.compile(FeaturesClassifier(), backend="aot_eager"),
        oracle=eatta.GroundTruthOracle(),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="donated buffers"):
        for (x, y), n in zip(stream(8, 8, 5)[:4], (8, 6, 8, 6), strict=True):
            m(x[:n], labels=y[:n])  # a second batch size makes the batch dimension dynamic


def test_the_split_of_a_compiled_model_compiles_its_backbone_and_keeps_the_head_eager() -> None:
    model = FeaturesClassifier()
    x = torch.randn(4, 3, 8, 8)
    compiled = torch.compile(model, backend="aot_eager")
    assert is_compiled(compiled) and not is_compiled(model)
    backbone, head = split_model(compiled, example=x)
    assert head is model.classifier
    assert is_compiled(backbone.compiled)  # type: ignore[arg-type]
    # the backbone is the model without its head, sharing every parameter and buffer
    owned = {id(t) for t in [*model.parameters(), *model.buffers()]}
    assert {id(t) for t in [*backbone.parameters(), *backbone.buffers()]} <= owned
    with torch.no_grad():
        assert torch.equal(backbone(x), model.features(x))
        assert torch.equal(head(backbone(x)), model(x))
    # and the model itself was left as it was
    assert isinstance(model.classifier, nn.Linear) and model.classifier is head


def test_a_discovered_backbone_that_needs_its_head_stays_eager() -> None:
    """A forward that reads the head's weight itself cannot run with the head replaced: the
    backbone then runs eagerly (stopping at the head), and the split is still exact."""

    class ReadsHead(FeaturesClassifier):
        def forward(self, x: Tensor) -> Tensor:
            z = self.features(x) + 0 * self.classifier.weight.sum()
            return self.classifier(z)

    model = ReadsHead()
    x = torch.randn(4, 3, 8, 8)
    backbone, head = split_model(torch.compile(model, backend="aot_eager"), example=x)
    assert not hasattr(backbone, "compiled")
    with torch.no_grad():
        assert torch.equal(head(backbone(x)), model(x))


def test_a_compiled_model_without_a_split_says_so() -> None:
    with pytest.raises(SplitNotFoundError):
        split_model(
            torch.compile(nn.Conv2d(3, 3, 1), backend="aot_eager"), example=torch.randn(2, 3, 4, 4)
        )
