"""Automatic backbone/head split across torchvision and timm families (random init, small).

Each model that wraps must give ``head(backbone(x)) == model(x)`` exactly and take one EATTA step
that changes a parameter; each that cannot (a convolutional head, logits of two heads averaged)
must get SplitNotFoundError naming the remedy. Small members / configurations of each family and
small images keep this fast; the classes (and so the forward code) are the stock ones.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import eatta
from eatta._compat import import_timm, import_torchvision
from eatta.split import SplitNotFoundError, _discover, split_model

Builder = Callable[[], nn.Module]


def _tv_builders() -> dict[str, tuple[Builder, int]]:
    """Family -> (builder of a 10-class model, image size)."""
    models = import_torchvision().models
    eff = models.efficientnet
    cnx = models.convnext
    resnet = models.resnet

    def vit() -> nn.Module:
        return models.VisionTransformer(
            image_size=32,
            patch_size=8,
            num_layers=1,
            num_heads=2,
            hidden_dim=16,
            mlp_dim=32,
            num_classes=10,
        )

    def vgg() -> nn.Module:
        # the stock VGG forward with a narrow classifier of the stock shape (Linear, ReLU, Dropout,
        # Linear, ReLU, Dropout, Linear): the 25088 x 4096 original alone takes seconds to build
        with torch.device("meta"):
            model = models.VGG(nn.Identity(), num_classes=10, init_weights=False)
        model.features = models.vgg.make_layers([8, "M", 16, "M"], batch_norm=True)
        model.classifier = nn.Sequential(
            nn.Linear(16 * 7 * 7, 32),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(32, 32),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(32, 10),
        )
        return model

    return {
        "resnet18": (lambda: models.resnet18(num_classes=10), 32),
        "resnext": (
            lambda: resnet.ResNet(
                resnet.Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=4, num_classes=10
            ),
            32,
        ),
        "wide_resnet": (
            lambda: resnet.ResNet(
                resnet.Bottleneck, [1, 1, 1, 1], width_per_group=128, num_classes=10
            ),
            32,
        ),
        "vgg_bn": (vgg, 32),
        "efficientnet_b0": (lambda: models.efficientnet_b0(num_classes=10), 32),
        "efficientnet_v2": (
            lambda: models.EfficientNet(
                [
                    eff.FusedMBConvConfig(1, 3, 1, 16, 16, 1),
                    eff.FusedMBConvConfig(4, 3, 2, 16, 24, 1),
                    eff.MBConvConfig(4, 3, 2, 24, 32, 1),
                ],
                dropout=0.2,
                last_channel=64,
                num_classes=10,
            ),
            32,
        ),
        "mobilenet_v2": (lambda: models.mobilenet_v2(num_classes=10, width_mult=0.25), 32),
        "mobilenet_v3_small": (lambda: models.mobilenet_v3_small(num_classes=10), 32),
        "convnext": (
            lambda: models.ConvNeXt(
                [cnx.CNBlockConfig(16, 32, 1), cnx.CNBlockConfig(32, None, 1)], num_classes=10
            ),
            32,
        ),
        "densenet": (
            lambda: models.DenseNet(
                growth_rate=8, block_config=(1, 1, 1, 1), num_init_features=16, num_classes=10
            ),
            32,
        ),
        "regnet_x_400mf": (lambda: models.regnet_x_400mf(num_classes=10), 32),
        "regnet_y_400mf": (lambda: models.regnet_y_400mf(num_classes=10), 32),
        "shufflenet_v2_x0_5": (lambda: models.shufflenet_v2_x0_5(num_classes=10), 32),
        "googlenet": (
            lambda: models.googlenet(num_classes=10, aux_logits=False, init_weights=False),
            32,
        ),
        "inception_v3": (
            lambda: models.inception_v3(num_classes=10, aux_logits=False, init_weights=False),
            75,
        ),
        "mnasnet0_5": (lambda: models.mnasnet0_5(num_classes=10), 32),
        "swin": (
            lambda: models.SwinTransformer(
                patch_size=[4, 4],
                embed_dim=16,
                depths=[1, 1],
                num_heads=[1, 2],
                window_size=[2, 2],
                num_classes=10,
            ),
            32,
        ),
        "swin_v2": (
            lambda: models.SwinTransformer(
                patch_size=[4, 4],
                embed_dim=16,
                depths=[1, 1],
                num_heads=[1, 2],
                window_size=[2, 2],
                num_classes=10,
                block=models.swin_transformer.SwinTransformerBlockV2,
                downsample_layer=models.swin_transformer.PatchMergingV2,
            ),
            32,
        ),
        "maxvit": (
            lambda: models.MaxVit(
                input_size=(32, 32),
                stem_channels=8,
                partition_size=2,
                block_channels=[8, 16],
                block_layers=[1, 1],
                head_dim=4,
                stochastic_depth_prob=0.0,
                num_classes=10,
            ),
            32,
        ),
        "vit": (vit, 32),
    }


TORCHVISION = [
    "resnet18",
    "resnext",
    "wide_resnet",
    "vgg_bn",
    "efficientnet_b0",
    "efficientnet_v2",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "convnext",
    "densenet",
    "regnet_x_400mf",
    "regnet_y_400mf",
    "shufflenet_v2_x0_5",
    "googlenet",
    "inception_v3",
    "mnasnet0_5",
    "swin",
    "swin_v2",
    "maxvit",
    "vit",
]

TIMM = [
    "resnet18",
    "efficientnet_b0",
    "convnext_atto",
    "vit_tiny_patch16_224",
    "deit_tiny_patch16_224",
    "mobilenetv3_small_050",
    "regnetx_002",
]


def _timm_model(name: str) -> nn.Module:
    kw = {"img_size": 32} if "patch16" in name else {}
    return import_timm().create_model(name, pretrained=False, num_classes=10, **kw)


def _has_hooks(model: nn.Module) -> bool:
    return any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for m in model.modules()
    )


def check_wraps_and_adapts(model: nn.Module, x: torch.Tensor) -> None:
    """Exact split on ``x`` (found by rule or discovery, and by discovery alone), one EATTA step."""
    model.eval()
    for backbone, head in (split_model(model, example=x), _discover(model, x)):
        with torch.no_grad():
            assert torch.equal(head(backbone(x)), model(x))
        assert {id(p) for p in backbone.parameters()} | {id(p) for p in head.parameters()} == {
            id(p) for p in model.parameters()
        }
    assert not _has_hooks(model)

    with torch.no_grad():  # torchvision's ViT zero-initializes its head (no gradient below it)
        for m in model.modules():
            if isinstance(m, nn.Linear) and not m.weight.any():
                m.weight.normal_(0.0, 0.02)
    params = eatta.configure(model)
    before = [p.detach().clone() for p in params]
    method = eatta.EATTA(
        model,
        torch.optim.SGD(params, lr=0.1),
        oracle=lambda inputs, idx: torch.zeros(len(idx), dtype=torch.long),
        budget=1,
    )
    assert method(x).shape == (x.shape[0], 10)
    assert method.labels_used == 1
    assert any(not torch.equal(b, p) for b, p in zip(before, params, strict=True))
    assert not _has_hooks(model)


@pytest.mark.parametrize("family", TORCHVISION)
def test_torchvision_family_wraps_and_adapts(family):
    build, size = _tv_builders()[family]
    torch.manual_seed(0)
    check_wraps_and_adapts(build(), torch.randn(4, 3, size, size))


@pytest.mark.parametrize("name", TIMM)
def test_timm_family_wraps_and_adapts(name):
    torch.manual_seed(0)
    check_wraps_and_adapts(_timm_model(name), torch.randn(4, 3, 32, 32))


def test_googlenet_and_inception_with_aux_heads_split_in_eval_mode():
    """With auxiliary heads built, eval mode returns one tensor (the aux heads do not run)."""
    models = import_torchvision().models
    for model, size in (
        (models.googlenet(num_classes=10, init_weights=False), 32),
        (models.inception_v3(num_classes=10, init_weights=False), 75),
    ):
        x = torch.randn(2, 3, size, size)
        backbone, head = split_model(model.eval(), example=x)
        with torch.no_grad():
            assert torch.equal(head(backbone(x)), model(x))
    # in train mode GoogLeNet returns GoogLeNetOutputs(logits, aux_logits2, aux_logits1): its
    # ``logits`` field is read, as a ModelOutput's is, and the split is the main head
    model = models.googlenet(num_classes=10, init_weights=False).train()
    backbone, head = split_model(model, example=torch.randn(2, 3, 32, 32))
    assert head is model.fc


@pytest.mark.parametrize(
    "source,build,size,why,when",
    [
        ("torchvision", "squeezenet1_1", 64, "no nn.Linear", "first batch"),
        ("timm", "dla46_c", 32, "no nn.Linear", "first batch"),  # a 1x1 convolution classifier
        # two heads, by its class: refused when the method is built, with no batch
        ("timm", "deit_tiny_distilled_patch16_224", 32, r"combine 2 classifier heads", "built"),
    ],
)
def test_models_without_one_final_linear_get_a_clear_error(source, build, size, why, when):
    if source == "torchvision":
        model = getattr(import_torchvision().models, build)(num_classes=10)
    else:
        kw = {"img_size": size} if "patch16" in build else {}
        model = import_timm().create_model(build, pretrained=False, num_classes=10, **kw)
    model.eval()
    x = torch.randn(2, 3, size, size)
    with pytest.raises(SplitNotFoundError, match=why + r".*split=\(backbone, head\)"):
        split_model(model, example=x)

    # the method raises the same error when it is built or on its first batch, before any
    # state changes
    params = eatta.configure(model, "all")
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def build() -> eatta.EATTA:
        return eatta.EATTA(
            model,
            torch.optim.SGD(params, lr=0.1),
            oracle=lambda inputs, idx: torch.zeros(len(idx), dtype=torch.long),
        )

    if when == "built":
        with pytest.raises(SplitNotFoundError, match=why):
            build()
    else:
        method = build()
        with pytest.raises(SplitNotFoundError, match=why):
            method(x)
        assert method.labels_used == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not _has_hooks(model)
