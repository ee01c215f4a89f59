"""Find a classifier's feature extractor and head (features = what enters the final classifier).

EATTA perturbs the features and runs only the head twice, so it needs the split. It is found
automatically for torchvision ResNets and ViTs, timm models (ResNets with BN or GN, ViTs, anything
with ``forward_features`` / ``forward_head`` / ``get_classifier``), an ``nn.Sequential`` ending in a
``Linear``, and eatta's input-normalization and logit-subset wrappers around any of these. For
other models pass ``split=(backbone, head)`` to the method, with ``head(backbone(x)) == model(x)``.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["ModelSplit", "SplitNotFoundError", "split_model"]


class SplitNotFoundError(TypeError):
    """The backbone/head split of a model could not be found automatically."""


class ModelSplit(NamedTuple):
    """A feature extractor and the classifier head that consumes its output."""

    backbone: nn.Module
    head: nn.Module


class _TorchvisionResNetFeatures(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        n = self.net
        x = n.maxpool(n.relu(n.bn1(n.conv1(x))))
        x = n.layer4(n.layer3(n.layer2(n.layer1(x))))
        return torch.flatten(n.avgpool(x), 1)


class _TorchvisionViTFeatures(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        n = self.net
        x = n._process_input(x)
        cls = n.class_token.expand(x.shape[0], -1, -1)
        x = n.encoder(torch.cat([cls, x], dim=1))
        return x[:, 0]


class _TimmFeatures(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net.forward_head(self.net.forward_features(x), pre_logits=True)


class _Normalize(nn.Module):
    def __init__(self, wrapper: nn.Module) -> None:
        super().__init__()
        self.wrapper = wrapper

    def forward(self, x: Tensor) -> Tensor:
        w = self.wrapper
        return (x - w.normalize_mean) / w.normalize_std


class _SelectLogits(nn.Module):
    def __init__(self, head: nn.Module, wrapper: nn.Module) -> None:
        super().__init__()
        self.head = head
        self.wrapper = wrapper

    def forward(self, z: Tensor) -> Tensor:
        return self.head(z).index_select(1, self.wrapper.indices)


def _is_subset_wrapper(model: nn.Module) -> bool:
    return hasattr(model, "model") and isinstance(getattr(model, "indices", None), Tensor)


def _is_normalized_wrapper(model: nn.Module) -> bool:
    return all(hasattr(model, a) for a in ("model", "normalize_mean", "normalize_std"))


def _torchvision_class(name: str) -> type | None:
    tv = sys.modules.get("torchvision")  # a torchvision model implies torchvision is imported
    models = getattr(tv, "models", None)
    return getattr(models, name, None)


def split_model(model: nn.Module) -> ModelSplit:
    """Return ``(backbone, head)`` sharing ``model``'s parameters, or raise SplitNotFoundError."""
    if _is_normalized_wrapper(model):
        inner = split_model(model.model)
        return ModelSplit(nn.Sequential(_Normalize(model), inner.backbone), inner.head)
    if _is_subset_wrapper(model):  # e.g. ImageNet-R/A: 200 of a 1000-class model's logits
        inner = split_model(model.model)
        return ModelSplit(inner.backbone, _SelectLogits(inner.head, model))
    resnet = _torchvision_class("ResNet")
    if resnet is not None and isinstance(model, resnet):
        return ModelSplit(_TorchvisionResNetFeatures(model), model.fc)
    vit = _torchvision_class("VisionTransformer")
    if vit is not None and isinstance(model, vit):
        return ModelSplit(_TorchvisionViTFeatures(model), model.heads)
    if all(hasattr(model, a) for a in ("forward_features", "forward_head", "get_classifier")):
        return ModelSplit(_TimmFeatures(model), model.get_classifier())
    if isinstance(model, nn.Sequential) and len(model) > 1 and isinstance(model[-1], nn.Linear):
        return ModelSplit(nn.Sequential(*list(model)[:-1]), model[-1])
    raise SplitNotFoundError(
        f"cannot find the feature extractor / classifier head of {type(model).__name__}; "
        "automatic splits cover torchvision ResNet/ViT, timm models and nn.Sequential ending in "
        "nn.Linear. Pass it explicitly: split=(backbone, head), two modules sharing the model's "
        "parameters with head(backbone(x)) == model(x)."
    )
