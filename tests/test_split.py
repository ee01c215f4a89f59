"""Backbone/head split per model family: head(backbone(x)) == model(x)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import eatta
from conftest import tiny_cnn
from eatta._compat import import_timm, import_torchvision
from eatta.split import SplitNotFoundError, split_model


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
    from eatta.bench.models import Normalized
    from eatta.data import SubsetLogits

    model = SubsetLogits(Normalized(tiny_cnn(num_classes=9), [0.5] * 3, [0.25] * 3), [1, 4, 7])
    model.eval()
    backbone, head = split_model(model)
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        out = head(backbone(x))
        assert out.shape == (4, 3)
        torch.testing.assert_close(out, model(x))
