"""Backbone/head split per model family: head(backbone(x)) == model(x)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import eatta
from conftest import tiny_cnn
from eatta._compat import import_timm, import_torchvision
from eatta.split import SplitNotFoundError, split_model

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


def check(model: nn.Module, x: torch.Tensor, feature_dim: int) -> None:
    model.eval()
    backbone, head = split_model(model)
    with torch.no_grad():
        z = backbone(x)
        assert z.shape == (x.shape[0], feature_dim)
        torch.testing.assert_close(head(z), model(x), rtol=1e-5, atol=1e-5)
    assert {id(p) for p in backbone.parameters()} | {id(p) for p in head.parameters()} == {
        id(p) for p in model.parameters()
    }


@pytest.mark.parametrize(
    "name,dim",
    [
        ("resnet18", 512),
        ("resnet34", 512),
        ("resnet50", 2048),
        ("resnet101", 2048),
        ("resnet152", 2048),
    ],
)
def test_torchvision_resnets(name, dim):
    tv = import_torchvision()
    check(getattr(tv.models, name)(num_classes=7), torch.randn(2, 3, 32, 32), dim)


def test_torchvision_vit():
    tv = import_torchvision()
    check(tv.models.vit_b_16(image_size=32, num_classes=7), torch.randn(2, 3, 32, 32), 768)


@pytest.mark.parametrize(
    "name,dim", [("resnet50", 2048), ("resnet50_gn", 2048), ("vit_base_patch16_224", 768)]
)
def test_timm_models(name, dim):
    timm = import_timm()
    kw = {"img_size": 32} if name.startswith("vit") else {}
    check(
        timm.create_model(name, pretrained=False, num_classes=7, **kw),
        torch.randn(2, 3, 32, 32),
        dim,
    )


def test_sequential_and_normalized_wrapper():
    check(tiny_cnn(), torch.randn(4, 3, 8, 8), 16)

    class Normalized(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.register_buffer("normalize_mean", torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1))
            self.register_buffer("normalize_std", torch.tensor([0.2, 0.3, 0.4]).view(1, 3, 1, 1))

        def forward(self, x):
            return self.model((x - self.normalize_mean) / self.normalize_std)

    check(Normalized(tiny_cnn()), torch.randn(4, 3, 8, 8), 16)


def test_unknown_model_says_how_to_pass_the_split():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 4)
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.body(x))

    with pytest.raises(SplitNotFoundError, match=r"split=\(backbone, head\)"):
        split_model(Custom())
    model = Custom()
    m = eatta.EATTA(
        model,
        torch.optim.SGD(model.body.parameters(), lr=0.1),
        oracle=lambda x, i: torch.zeros(len(i), dtype=torch.long),
        split=(model.body, model.out),
    )
    assert m(torch.randn(6, 4)).shape == (6, 2) and m.labels_used == 1


def test_eatta_adapts_a_torchvision_resnet():
    tv = import_torchvision()
    model = tv.models.resnet18(num_classes=4)
    oracle = eatta.GroundTruthOracle()
    m = eatta.EATTA(model, torch.optim.SGD(eatta.configure(model), lr=0.01), oracle=oracle)
    oracle.set_labels(torch.tensor([0, 1, 2, 3]))
    before = model.bn1.weight.clone()
    assert m(torch.randn(4, 3, 32, 32)).shape == (4, 4)
    assert not torch.equal(before, model.bn1.weight)


def test_normalized_and_subset_wrappers_from_the_data_and_bench_modules():
    from eatta.data import SubsetLogits
    from eatta.models.backbones import Normalized

    model = SubsetLogits(Normalized(tiny_cnn(num_classes=9), [0.5] * 3, [0.25] * 3), [1, 4, 7])
    model.eval()
    backbone, head = split_model(model)
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        out = head(backbone(x))
        assert out.shape == (4, 3)
        torch.testing.assert_close(out, model(x))


# ------------------------------------------------------------------ discovery on an example batch


class PooledFc(nn.Module):
    """Conv-BN-ReLU, dropout, then functional pooling and flatten in forward, then ``self.fc``."""

    def __init__(self, num_classes: int = 5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.drop(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class PooledFcFeatures(nn.Module):
    """PooledFc's features written out by hand (the explicit split)."""

    def __init__(self, net: PooledFc) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        n = self.net
        x = n.drop(F.relu(n.bn(n.conv(x))))
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)


class FeaturesClassifier(nn.Module):
    """``features`` then ``classifier = Sequential(Flatten, Dropout, Linear)``."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(8, 5))

    def forward(self, x):
        return self.classifier(self.features(x))


class ResidualNet(nn.Module):
    """Two residual blocks, a projection Linear inside the body, ``self.fc(features)`` last."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            for _ in range(2)
        )
        self.proj = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 5)
        self.out = nn.Identity()

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        features = F.gelu(self.proj(x.mean(dim=(2, 3))))
        return self.out(self.fc(features))


def _head_input(model: nn.Module, head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What ``head`` receives in a plain forward pass of ``model`` (captured by the test)."""
    seen = []
    handle = head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        model(x)
    finally:
        handle.remove()
    return seen[0]


def _hooked(model: nn.Module) -> bool:
    return any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for m in model.modules()
    )


CUSTOM = {
    "pooled_fc": (PooledFc, "fc"),
    "features_classifier": (FeaturesClassifier, "classifier.2"),
    "residual": (ResidualNet, "fc"),
}


@pytest.mark.parametrize("name", CUSTOM)
def test_custom_models_split_on_an_example(name):
    build, head_name = CUSTOM[name]
    model = build().eval()
    x = torch.randn(4, 3, 8, 8)
    with pytest.raises(SplitNotFoundError, match=r"example.*split=\(backbone, head\)"):
        split_model(model)
    backbone, head = split_model(model, example=x)
    assert head is model.get_submodule(head_name)
    with torch.no_grad():
        z = backbone(x)
        assert torch.equal(z, _head_input(model, head, x))
        assert torch.equal(head(z), model(x))
    assert not _hooked(model)

    params = eatta.configure(model)
    before = [p.detach().clone() for p in params]
    m = eatta.EATTA(
        model,
        torch.optim.SGD(params, lr=0.1),
        oracle=lambda inputs, idx: torch.zeros(len(idx), dtype=torch.long),
    )
    assert m._split is None  # found lazily, on the first batch
    assert m(x).shape == (4, 5) and m.labels_used == 1
    assert m.split.head is head
    assert any(not torch.equal(b, p) for b, p in zip(before, params, strict=True))
    assert not _hooked(model)


def test_a_bare_linear_and_a_normalized_wrapper_split_on_an_example():
    model = nn.Linear(6, 3)
    x = torch.randn(4, 6)
    backbone, head = split_model(model, example=x)
    assert head is model and torch.equal(backbone(x), x)

    class Normalized(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.register_buffer("normalize_mean", torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1))
            self.register_buffer("normalize_std", torch.tensor([0.2, 0.3, 0.4]).view(1, 3, 1, 1))

        def forward(self, x):
            return self.model((x - self.normalize_mean) / self.normalize_std)

    wrapped = Normalized(ResidualNet()).eval()
    x = torch.randn(4, 3, 8, 8)
    backbone, head = split_model(wrapped, example=x)
    assert head is wrapped.model.fc
    with torch.no_grad():
        assert torch.equal(head(backbone(x)), wrapped(x))


def test_discovered_split_gives_the_same_step_as_the_explicit_one():
    x = torch.randn(8, 3, 8, 8)
    runs = []
    for explicit in (False, True):
        torch.manual_seed(3)
        model = PooledFc()
        params = eatta.configure(model)
        split = (PooledFcFeatures(model), model.fc) if explicit else None
        m = eatta.EATTA(
            model,
            torch.optim.SGD(params, lr=0.1, momentum=0.9),
            oracle=lambda inputs, idx: torch.ones(len(idx), dtype=torch.long),
            split=split,
        )
        logits = [m(x), m(x.flip(0))]
        runs.append((logits, [p.detach().clone() for p in params], m.gradient.strategy.active))  # type: ignore[union-attr]
    (la, pa, sa), (lb, pb, sb) = runs
    assert all(torch.equal(a, b) for a, b in zip(la + pa, lb + pb, strict=True))
    assert sa and sb  # no hook stays on the model, so "auto" still segments the gradients


@pytest.mark.parametrize(
    "forward,why",
    [
        (lambda m, z: m.fc(m.sq(z)) + m.fc2(z), r"combine 2 nn.Linear heads \(model.fc, "),
        (lambda m, z: m.sq(m.sq(z)), "runs 2 times"),
        (lambda m, z: (m.fc(z), z), "returns a tuple"),
        (lambda m, z: 2 * m.fc(z), "no nn.Linear produced its output"),
        (lambda m, z: m.fc(z)[:, :, None], r"returns a tensor of shape \(4, 3, 1\)"),
    ],
    ids=["two-linears-summed", "linear-twice", "tuple", "scaled-logits", "3d-output"],
)
def test_discovery_refuses_outputs_not_from_one_final_linear(forward, why):
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 4)
            self.sq = nn.Linear(4, 4)
            self.fc = nn.Linear(4, 3)
            self.fc2 = nn.Linear(4, 3)

        def forward(self, x):
            return forward(self, self.body(x))

    model = Odd()
    with pytest.raises(SplitNotFoundError, match=why + r".*split=\(backbone, head\)"):
        split_model(model, example=torch.randn(4, 4))
    assert not _hooked(model)


def test_the_probe_changes_no_state():
    model = PooledFc().train()  # raw model: BatchNorm tracks running stats, dropout is active
    model.conv.weight.requires_grad_(False)
    x = torch.randn(4, 3, 8, 8)

    def snapshot():
        return (
            {k: v.clone() for k, v in model.state_dict().items()},
            torch.get_rng_state(),
            [m.training for m in model.modules()],
            [p.requires_grad for p in model.parameters()],
        )

    before = snapshot()
    head = split_model(model, example=x).head
    after = snapshot()
    assert before[0].keys() == after[0].keys()
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert torch.equal(before[1], after[1]) and before[2:] == after[2:]
    assert not _hooked(model)
    assert head is model.fc
    # ... while a plain forward pass changes both statistics and the generator
    with torch.no_grad():
        model(x)
    assert int(model.bn.num_batches_tracked) == int(before[0]["bn.num_batches_tracked"]) + 1
    assert not torch.equal(torch.get_rng_state(), before[1])


def test_discovered_backbone_is_differentiable_stops_at_the_head_and_nests():
    torch.manual_seed(0)
    model = ResidualNet().eval()
    x, x2 = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    backbone, head = split_model(model, example=x)

    head_runs = []
    counter = head.register_forward_hook(lambda *a: head_runs.append(1))
    z = backbone(x)
    counter.remove()
    assert head_runs == [] and not _hooked(model)  # the head never ran; no hook stays
    z.sum().backward()
    assert model.stem.weight.grad is not None and model.fc.weight.grad is None

    with torch.autocast("cpu", dtype=torch.bfloat16):
        z16 = backbone(x)
        assert z16.dtype == torch.bfloat16
        assert torch.equal(z16, _head_input(model, head, x))

    # a call nested inside another (here from a hook inside the model) gets its own features
    inner: list[torch.Tensor] = []
    entered: list[bool] = []

    def nested_call(*args):
        if not entered:  # once: the nested pass runs this hook too
            entered.append(True)
            inner.append(backbone(x2))

    nest = model.proj.register_forward_hook(nested_call)
    with torch.no_grad():
        z_outer = backbone(x)
    nest.remove()
    with torch.no_grad():
        assert torch.equal(z_outer, backbone(x)) and torch.equal(inner[0], backbone(x2))
    assert not _hooked(model)


def test_the_split_is_found_once(monkeypatch):
    import eatta.methods.base as base

    calls = []

    def counting(model, example=None):
        calls.append(example)
        return split_model(model, example=example)

    monkeypatch.setattr(base, "split_model", counting)
    model = FeaturesClassifier()
    m = eatta.EATTA(
        model,
        torch.optim.SGD(eatta.configure(model), lr=0.1),
        oracle=lambda inputs, idx: torch.zeros(len(idx), dtype=torch.long),
    )
    x = torch.randn(4, 3, 8, 8)
    z, o = m.features_and_logits(x)
    assert torch.equal(z, _head_input(model, model.classifier[2], x))
    assert torch.equal(o, model(x))
    m(x)
    m(x)
    assert len(calls) == 1 and calls[0] is x


def test_the_split_is_found_inside_eattas_autocast_region():
    model = ResidualNet()
    params = eatta.configure(model)
    before = [p.detach().clone() for p in params]
    m = eatta.EATTA(
        model,
        torch.optim.SGD(params, lr=0.1),
        oracle=lambda inputs, idx: torch.zeros(len(idx), dtype=torch.long),
        autocast=True,  # the first backbone call, which finds the split, runs under autocast
    )
    assert m(torch.randn(4, 3, 8, 8)).dtype == torch.float32
    assert m.split.head is model.fc and m.labels_used == 1
    assert any(not torch.equal(b, p) for b, p in zip(before, params, strict=True))
    assert not _hooked(model)
