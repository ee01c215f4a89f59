"""Backbones of the paper (§6), each wrapped with its own input normalization.

Every loader returns :class:`Normalized` (``model`` + ``normalize_mean`` / ``normalize_std``
buffers), so datasets hand over ``[0, 1]`` images and the wrapper applies the right mean/std:

* ``resnet50_bn``: torchvision ResNet-50, ``IMAGENET1K_V1`` weights, ImageNet mean/std.
* ``resnet50_gn``: timm ``resnet50_gn`` (default pretrained tag), mean/std of its pretrained cfg.
* ``vit_b_16``: timm ``vit_base_patch16_224`` (default tag), mean/std of its pretrained cfg.
* ``resnet18``: torchvision ResNet-18 for PACS, ``num_classes`` outputs (7); with
  ``pretrained=True`` the ImageNet weights initialize everything but the new classifier.

Weights: ``checkpoint=PATH`` loads a local file (a state dict, or a dict holding one under
``"state_dict"`` or ``"model"``; ``module.`` prefixes are stripped). Otherwise ``pretrained=True``
looks in the local caches only (torch hub ``<TORCH_HOME>/hub/checkpoints`` and the Hugging Face hub
cache, i.e. ``HF_HUB_OFFLINE=1`` behaviour, without touching the environment) and raises
:class:`WeightsUnavailableError` at once when the file is absent, instead of waiting for network
retries. ``download=True`` allows fetching them. ``pretrained=False`` gives a random init.
Models are returned in eval mode.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from eatta._compat import import_timm, import_torchvision

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MODELS",
    "Normalized",
    "WeightsUnavailableError",
    "load_checkpoint",
    "load_model",
    "resnet18",
    "resnet50_bn",
    "resnet50_gn",
    "vit_b_16",
]

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


class WeightsUnavailableError(RuntimeError):
    """Pretrained weights are neither in a local cache nor downloadable; the message says how to
    provide them."""


class Normalized(nn.Module):
    """``model((x - mean) / std)`` for inputs in ``[0, 1]``; the inner network is ``.model``.

    Keeping normalization inside the model lets every dataset return plain ``[0, 1]`` tensors and
    lets EATTA's backbone/head splitter find the real network under ``.model``.
    """

    normalize_mean: Tensor
    normalize_std: Tensor

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        m = torch.as_tensor(mean, dtype=torch.float32).flatten()
        s = torch.as_tensor(std, dtype=torch.float32).flatten()
        if m.shape != s.shape or m.numel() == 0:
            raise ValueError(
                f"mean and std need the same non-zero length, got {m.numel()}, {s.numel()}"
            )
        if bool((s <= 0).any()):
            raise ValueError(f"std must be positive, got {s.tolist()}")
        self.model = model
        self.register_buffer("normalize_mean", m.view(1, -1, 1, 1))
        self.register_buffer("normalize_std", s.view(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.model((x - self.normalize_mean) / self.normalize_std)


# ----------------------------------------------------------------------------- checkpoints


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        obj: Any = load_file(str(path), device="cpu")
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise ValueError(
                f"checkpoint {str(path)!r} holds Python objects besides tensors and is not loaded "
                "for safety; re-save it with torch.save(model.state_dict(), path)"
            ) from err
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model"):
            if key in obj and isinstance(obj[key], Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(
            f"checkpoint {str(path)!r} is not a state dict (or a dict with one under "
            "'state_dict' or 'model')"
        )
    out: dict[str, Tensor] = {}
    for key, value in obj.items():
        while key.startswith("module."):
            key = key[len("module.") :]
        out[key] = value
    return out


def _load_strict(module: nn.Module, state: Mapping[str, Tensor], source: str) -> None:
    expected = set(module.state_dict())
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"{source} does not fit {type(module).__name__}: missing keys {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected keys {unexpected[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}"
        )
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as err:  # shape mismatch, e.g. a 1000-class head vs num_classes=7
        raise ValueError(f"{source} does not fit {type(module).__name__}: {err}") from err


def load_checkpoint(model: Normalized, path: str | os.PathLike[str]) -> Normalized:
    """Load local weights into ``model`` (in place) and return it.

    Accepts a state dict of the inner network, one saved from a :class:`Normalized` wrapper (keys
    ``model.*`` plus the normalization buffers), or either under ``"state_dict"`` / ``"model"``;
    ``.safetensors`` files too. ``module.`` prefixes (DataParallel/DDP) are stripped.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {str(p)!r} does not exist")
    state = _read_state_dict(p)
    source = f"checkpoint {str(p)!r}"
    if "normalize_mean" in state:
        _load_strict(model, state, source)
    else:
        _load_strict(model.model, state, source)
    return model


# ----------------------------------------------------------------------------- pretrained weights


def _remedy(name: str, places: Sequence[str]) -> str:
    where = "; ".join(places)
    return (
        f"Pretrained weights for {name!r} are not available offline. Either pass a local file "
        f"with checkpoint=PATH (CLI: --checkpoint PATH), or put the weights in a local cache "
        f"({where}), or pass download=True on a machine that can reach the internet."
    )


def _torchvision_state(weights: Any, name: str, download: bool) -> dict[str, Tensor]:
    filename = os.path.basename(weights.url)
    cached = Path(torch.hub.get_dir()) / "checkpoints" / filename
    if cached.is_file():
        return _read_state_dict(cached)
    if not download:
        raise WeightsUnavailableError(_remedy(name, [f"torch hub cache: {cached}"]))
    try:
        return dict(weights.get_state_dict(progress=False, check_hash=True))
    except Exception as err:
        raise WeightsUnavailableError(
            f"downloading {weights.url} failed ({err}). " + _remedy(name, [str(cached)])
        ) from err


def _torchvision_model(
    arch: str, weights_enum: str, name: str, num_classes: int, pretrained: bool, download: bool
) -> nn.Module:
    tv = import_torchvision()
    state = None
    if pretrained:  # find the weights before building, so a missing file fails at once
        state = _torchvision_state(getattr(tv.models, weights_enum).IMAGENET1K_V1, name, download)
    model: nn.Module = getattr(tv.models, arch)(weights=None, num_classes=1000)
    if state is not None:
        _load_strict(model, state, f"{name} pretrained weights")
    if num_classes != 1000:
        fc = model.fc
        if not isinstance(fc, nn.Linear):
            raise TypeError(f"{arch} has no Linear classifier to replace")
        model.fc = nn.Linear(fc.in_features, num_classes)
    return model


def _hf_cached_file(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:  # pragma: no cover - timm depends on huggingface_hub
        return None
    for filename in ("model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(repo_id, filename, cache_dir=constants.HF_HUB_CACHE)
        if isinstance(found, str) and os.path.isfile(found):
            return Path(found)
    return None


def _hf_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover
        return "~/.cache/huggingface/hub"


def _timm_model(arch: str, name: str, pretrained: bool, download: bool) -> nn.Module:
    timm = import_timm()
    if not pretrained:
        return timm.create_model(arch, pretrained=False)
    cfg = timm.models.get_pretrained_cfg(arch)
    if cfg is None:
        raise ValueError(f"timm has no pretrained config for {arch!r}")
    hf_id, url = cfg.hf_hub_id, cfg.url
    local: Path | None = _hf_cached_file(hf_id) if hf_id else None
    hub_file = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url) if url else None
    if local is None and hub_file is not None and hub_file.is_file():
        local = hub_file
    if local is not None:
        return timm.create_model(arch, pretrained=True, pretrained_cfg_overlay={"file": str(local)})
    places = []
    if hf_id:
        places.append(
            f"Hugging Face cache {_hf_cache_dir()} (repo {hf_id}: model.safetensors; "
            f"e.g. `hf download {hf_id}` elsewhere, then copy the cache)"
        )
    if hub_file is not None:
        places.append(f"torch hub cache: {hub_file}")
    if not download:
        raise WeightsUnavailableError(_remedy(name, places))
    try:
        return timm.create_model(arch, pretrained=True)
    except Exception as err:
        raise WeightsUnavailableError(f"download failed ({err}). " + _remedy(name, places)) from err


def _timm_mean_std(model: nn.Module) -> tuple[Sequence[float], Sequence[float]]:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    return tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))


def _finish(model: nn.Module, mean: Sequence[float], std: Sequence[float], ckpt: Any) -> Normalized:
    wrapped = Normalized(model, mean, std)
    if ckpt is not None:
        load_checkpoint(wrapped, ckpt)
    return wrapped.eval()


# ----------------------------------------------------------------------------- loaders


def resnet50_bn(
    *,
    pretrained: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    download: bool = False,
) -> Normalized:
    """torchvision ResNet-50 (BatchNorm), ``IMAGENET1K_V1`` weights, ImageNet mean/std."""
    net = _torchvision_model(
        "resnet50",
        "ResNet50_Weights",
        "resnet50_bn",
        1000,
        pretrained and checkpoint is None,
        download,
    )
    return _finish(net, IMAGENET_MEAN, IMAGENET_STD, checkpoint)


def resnet50_gn(
    *,
    pretrained: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    download: bool = False,
) -> Normalized:
    """timm ResNet-50 with GroupNorm (``resnet50_gn``), normalized with its pretrained cfg."""
    net = _timm_model("resnet50_gn", "resnet50_gn", pretrained and checkpoint is None, download)
    return _finish(net, *_timm_mean_std(net), checkpoint)


def vit_b_16(
    *,
    pretrained: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    download: bool = False,
) -> Normalized:
    """timm ViT-B/16 (``vit_base_patch16_224``), normalized with its pretrained cfg (mean 0.5)."""
    net = _timm_model(
        "vit_base_patch16_224", "vit_b_16", pretrained and checkpoint is None, download
    )
    return _finish(net, *_timm_mean_std(net), checkpoint)


def resnet18(
    num_classes: int = 7,
    *,
    pretrained: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    download: bool = False,
) -> Normalized:
    """torchvision ResNet-18 with a ``num_classes`` head (7 for PACS), ImageNet mean/std.

    ``pretrained=True`` starts from the ImageNet ``IMAGENET1K_V1`` weights (the source-training
    starting point); the new head is randomly initialized. A trained PACS model comes from
    ``checkpoint=``.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    net = _torchvision_model(
        "resnet18",
        "ResNet18_Weights",
        "resnet18",
        num_classes,
        pretrained and checkpoint is None,
        download,
    )
    return _finish(net, IMAGENET_MEAN, IMAGENET_STD, checkpoint)


#: Loader per backbone name.
MODELS: dict[str, Callable[..., Normalized]] = {
    "resnet50_bn": resnet50_bn,
    "resnet50_gn": resnet50_gn,
    "vit_b_16": vit_b_16,
    "resnet18": resnet18,
}


def load_model(name: str, **kwargs: Any) -> Normalized:
    """Build the backbone ``name`` (see :data:`MODELS`); ``kwargs`` go to its loader."""
    try:
        loader = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}") from None
    return loader(**kwargs)
