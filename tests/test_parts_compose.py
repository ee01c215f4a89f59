"""The parts compose, from the public API, each on the first batch with no explicit split, on the
packaged digits CNN and on a custom model (a ``features`` / ``classifier`` pair): the window with
the source-model fallback at requests of 1 and 8, and the fallback with the approximate step and an
asynchronous annotator 16 batches late; the class path builds them without assigning anything."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import eatta
from conftest import nested_equal
from eatta.annotate.simulated import SimulatedAnnotator
from eatta.debias.bounded import BoundedGradNormDebiaser
from eatta.methods.eatta import EATTA
from eatta.models.digits_cnn import packaged_digits_source
from eatta.monitor.fallback import SourceFallback, safe_parts
from eatta.normalization import MixedBatchNorm
from eatta.selection.drawn import DisagreementDraw

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


class FeaturesClassifier(nn.Module):
    """A custom classifier as published SVHN CNNs are written: no Sequential to split."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


def custom_model() -> nn.Module:
    torch.manual_seed(0)
    model = FeaturesClassifier()
    model.train()
    with torch.no_grad():  # running statistics of its own, as a trained model has
        model(torch.randn(64, 3, 32, 32) * 1.5 + 0.2)
    return model.eval()


def digits_model() -> nn.Module:
    return packaged_digits_source()[0]


MODELS = {"digits": digits_model, "custom": custom_model}

#: grad_mode="approx" on a model whose split is found only on the first batch (the custom one).
APPROX_MODELS = ["digits", "custom"]


def stream(samples: int, size: int, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 3, 32, 32, generator=g) * 0.8
    y = torch.randint(0, 10, (samples,), generator=g)
    return [(x[i : i + size], y[i : i + size]) for i in range(0, samples, size)]


@pytest.mark.parametrize("size", [1, 8])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_eatta_safe_with_a_window_serves_small_requests(name: str, size: int) -> None:
    """window=64: requests of 1 and 8 are served (by the source model while there is no
    evidence, ``fallback_start="source"``: exactly its logits), a step every 64 samples, the
    fallback deciding at each."""
    model = MODELS[name]()
    given = copy.deepcopy(model)
    method = eatta.create(
        "eatta-safe",
        model,
        oracle=eatta.GroundTruthOracle(),
        window=64,
        fallback_start="source",
    )
    fb = method.fallback
    assert isinstance(fb, SourceFallback) and method.window is not None
    for x, y in stream(160, size):
        out = method(x, labels=y)
        assert out.shape == (x.shape[0], 10)
        torch.testing.assert_close(out, given(x), rtol=0, atol=0)
    assert method.window.steps == 2 and fb.step == 2  # 160 samples: steps at 64 and 128
    assert method.labels_used == 2 and fb.stats()["answers"] == 2


def safe_approx_async(model: nn.Module, window: int | None = None) -> eatta.AdaptiveMethod:
    return eatta.create(
        "eatta-safe",
        model,
        oracle=SimulatedAnnotator(delay=16),
        grad_mode="approx",
        window=window,
    )


@pytest.mark.parametrize("name", APPROX_MODELS)
def test_eatta_safe_with_the_approximate_step_and_answers_16_batches_late(name: str) -> None:
    """Answers come 16 batches after their requests: the fallback scores them then (none before
    the 17th step), and the approximate step adapts on every batch from the first."""
    model = MODELS[name]()
    method = safe_approx_async(model)
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    first = {k: v.clone() for k, v in method.model.state_dict().items()}
    answered = []
    for x, y in stream(24 * 16, 16):
        assert method(x, labels=y).shape == (16, 10)
        answered.append(fb.stats()["answers"])
    assert answered[:16] == [0] * 16  # nothing scored before the first answer arrived
    assert answered[-1] == 24 - 16  # then one a batch, each 16 batches late
    assert not nested_equal(method.model.state_dict(), first)  # it adapted


@pytest.mark.parametrize("size", [1, 8, 64])
@pytest.mark.parametrize("name", APPROX_MODELS)
def test_every_part_together_at_any_request_size(name: str, size: int) -> None:
    """Fallback + window + approximate step + an asynchronous annotator, requests of 1, 8 and
    64 samples: a window step every 16 samples, answers arriving 16 window steps late."""
    method = safe_approx_async(MODELS[name](), window=16)
    fb = method.fallback
    assert isinstance(fb, SourceFallback) and method.window is not None
    samples = 20 * 64 if size == 64 else 20 * 16
    for x, y in stream(samples, size):
        assert method(x, labels=y).shape == (size, 10)
    steps = samples // 64 if size == 64 else samples // 16
    assert fb.step == steps
    assert method.labels_used == steps and fb.stats()["answers"] == steps - 16


def test_the_class_path_builds_eatta_safe_without_assigning_anything() -> None:
    """EATTA(..., window=..., **safe_parts()) from the classes, as eatta-safe is registered."""
    model = digits_model()
    given = copy.deepcopy(model).eval()
    params = eatta.configure(model, "norm")
    method = EATTA(
        model,
        torch.optim.SGD(params, lr=0.001),
        oracle=eatta.GroundTruthOracle(),
        debiaser=BoundedGradNormDebiaser(),
        window=64,
        **safe_parts(explore=0.25),
    )
    fallback = method.fallback
    assert isinstance(fallback, SourceFallback) and method.window is not None
    assert isinstance(method.selector, DisagreementDraw)
    for x, y in stream(96, 8):
        torch.testing.assert_close(method(x, labels=y), given(x), rtol=0, atol=0)
    assert method.window.steps == 1 and fallback.step == 1 and fallback.answers == 1


def test_a_fallback_without_drawn_answers_is_refused_before_anything() -> None:
    """The fallback reads the method's own answers only when they are drawn with known
    probabilities: with the plain perturbation selector the first request is refused, the model
    and the parts as they were."""
    model = digits_model()
    params = eatta.configure(model, "norm")
    fallback = SourceFallback()
    method = EATTA(
        model,
        torch.optim.SGD(params, lr=0.001),
        oracle=eatta.GroundTruthOracle(),
        balance=None,
        fallback=fallback,
    )
    before = copy.deepcopy(method.state_dict())
    x, y = stream(16, 16)[0]
    with pytest.raises(ValueError, match="DisagreementDraw"):
        method(x, labels=y)
    assert nested_equal(method.state_dict(), before) and fallback.step == 0


def test_a_window_on_plain_batchnorm_serves_on_ema_statistics_and_gives_the_model_back() -> None:
    """The window swaps each BatchNorm for a MixedBatchNorm (EMA statistics from the running
    ones), so a request of one sample is served; unwrap() gives the plain BatchNorm back."""
    model = digits_model()
    kinds = [type(m) for m in model.modules()]
    state = copy.deepcopy(model.state_dict())
    params = eatta.configure(model, "norm")
    method = EATTA(
        model, torch.optim.SGD(params, lr=0.001), oracle=eatta.GroundTruthOracle(), window=64
    )
    assert any(isinstance(m, MixedBatchNorm) for m in method.model.modules())
    x, y = stream(1, 1)[0]
    assert method(x, labels=y).shape == (1, 10)
    back = method.unwrap()
    assert [type(m) for m in back.modules()] == kinds and nested_equal(back.state_dict(), state)


def test_a_label_free_method_with_a_window_audits_the_windows_older_samples() -> None:
    """TENT with a window and a fallback whose auditor answers 2 batches late, given each
    request's labels (as ``eatta-bench --fallback --label-delay 2`` does): a window step audits
    any of its 64 samples, so the window keeps the auditor's labels with them (before: an
    older sample's unknown label, -1, reached the auditor)."""
    model = digits_model()
    auditor = SimulatedAnnotator(delay=2)
    fallback = SourceFallback(auditor=auditor)
    method = eatta.create("tent", model, window=64, fallback=fallback)
    assert method.window is not None
    for x, y in stream(16 * 16, 16):
        auditor.set_labels(y)
        assert method(x).shape == (16, 10)
    assert method.window.steps == 4 and fallback.step == 4
    assert fallback.requested == 4 and fallback.stats()["answers"] >= 2


#: Families not in the repository, one per kind of normalization: BatchNorm in grouped
#: bottlenecks, BatchNorm with squeeze-excitation, LayerNorm over channels, over shifted windows
#: and over tokens.
OTHER_FAMILIES = ["resnext", "mobilenet_v3_small", "convnext", "swin", "vit"]


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_every_part_together_on_other_families(family: str) -> None:
    """The safe composition (fallback + window of 16 + approximate step + answers 2 window
    steps late) from ``create`` alone on stock torchvision families, requests of 4 samples: a
    step every 16 samples, each answer scored when it arrives, the adapted model moving."""
    from test_split_families import _tv_builders

    build, size = _tv_builders()[family]
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():  # torchvision's ViT zero-initializes its head (no gradient below it)
        for m in model.modules():
            if isinstance(m, nn.Linear) and not m.weight.any():
                m.weight.normal_(0.0, 0.02)
    method = eatta.create(
        "eatta-safe", model, oracle=SimulatedAnnotator(delay=2), grad_mode="approx", window=16
    )
    fb = method.fallback
    assert isinstance(fb, SourceFallback) and method.window is not None
    first = {k: v.clone() for k, v in method.model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    for _ in range(24):  # 96 samples: 6 window steps
        x = torch.randn(4, 3, size, size, generator=g)
        y = torch.randint(0, 10, (4,), generator=g)
        assert method(x, labels=y).shape == (4, 10)
    assert fb.step == 6 and method.labels_used == 6 and fb.stats()["answers"] == 4
    assert not nested_equal(method.model.state_dict(), first)


class _HeadWithBatchNorm1d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


class _HeadRegisteredFirst(nn.Module):
    """The head is the first module registered; the features are pooled functionally."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.linear = nn.Linear(16, classes)
        self.conv = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.conv(x).mean((2, 3)))


def _weight_normed_head() -> nn.Module:
    model = custom_model()
    model.classifier[1] = nn.utils.parametrizations.weight_norm(model.classifier[1])
    return model


def _layernorm_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 10)
    )


#: Classifiers as people write them by hand, none in the repository.
HAND_WRITTEN = {
    "batchnorm1d in the head": _HeadWithBatchNorm1d,
    "layernorm mlp": _layernorm_mlp,
    "weight-normed head": _weight_normed_head,
    "head registered first": _HeadRegisteredFirst,
    "two classes": lambda: _HeadRegisteredFirst(classes=2),
    "float64": lambda: custom_model().double(),
    "channels_last": lambda: custom_model().to(memory_format=torch.channels_last),
}


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_every_part_together_on_hand_written_classifiers(name: str) -> None:
    """The safe composition (fallback + window of 16 + approximate step + answers 2 window
    steps late) from ``create`` alone, requests of 4, on each: served in the model's dtype and
    memory format, every answer scored on arrival, the adapted model moving."""
    torch.manual_seed(0)
    model = HAND_WRITTEN[name]().train()
    dtype = next(model.parameters()).dtype
    with torch.no_grad():  # running statistics of its own, as a trained model has
        model(torch.randn(64, 3, 32, 32, dtype=dtype))
    model.eval()
    method = eatta.create(
        "eatta-safe", model, oracle=SimulatedAnnotator(delay=2), grad_mode="approx", window=16
    )
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    first = {k: v.clone() for k, v in method.model.state_dict().items()}
    classes = 2 if name == "two classes" else 10
    g = torch.Generator().manual_seed(0)
    for _ in range(24):  # 96 samples: 6 window steps
        x = torch.randn(4, 3, 32, 32, generator=g, dtype=dtype)
        if name == "channels_last":
            x = x.to(memory_format=torch.channels_last)
        out = method(x, labels=torch.randint(0, classes, (4,), generator=g))
        assert out.shape == (4, classes) and out.dtype == dtype
        assert bool(torch.isfinite(out).all())
    assert fb.step == 6 and method.labels_used == 6 and fb.stats()["answers"] == 4
    assert not nested_equal(method.model.state_dict(), first)
