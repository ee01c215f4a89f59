"""Backbone loaders: normalization wrapper, offline failure, local checkpoints and caches."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn

from eatta.models import backbones as M
from eatta.models.backbones import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Normalized,
    WeightsUnavailableError,
    load_checkpoint,
    load_model,
    resnet18,
)


@pytest.fixture
def empty_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the torch hub and Hugging Face caches at empty folders."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path


def test_normalized_applies_mean_std_and_exposes_model() -> None:
    inner = nn.Conv2d(3, 2, 1)
    wrapped = Normalized(inner, IMAGENET_MEAN, IMAGENET_STD)
    x = torch.rand(2, 3, 4, 4)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.allclose(wrapped(x), inner((x - mean) / std))
    assert wrapped.model is inner
    assert wrapped.normalize_mean.shape == (1, 3, 1, 1)
    assert {"normalize_mean", "normalize_std"} <= set(wrapped.state_dict())
    with pytest.raises(ValueError, match="std must be positive"):
        Normalized(inner, (0.5,) * 3, (0.5, 0.0, 0.5))
    with pytest.raises(ValueError, match="same non-zero length"):
        Normalized(inner, (0.5,) * 3, (0.5,) * 2)


@pytest.mark.parametrize("name", ["resnet50_gn", "resnet50_bn"])
def test_missing_weights_fail_fast_with_the_remedy(name: str, empty_caches: Path) -> None:
    from eatta._compat import import_timm

    import_timm()  # time the failure, not the first import
    start = time.monotonic()
    with pytest.raises(WeightsUnavailableError) as err:
        load_model(name)
    assert time.monotonic() - start < 10
    msg = str(err.value)
    assert "--checkpoint PATH" in msg and "checkpoint=PATH" in msg
    assert str(empty_caches / "torch" / "hub" / "checkpoints") in msg
    if name == "resnet50_gn":
        assert "timm/resnet50_gn" in msg and str(empty_caches / "hf") in msg


def test_checkpoint_loads_a_saved_random_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = resnet18(7, pretrained=False)
    state = {"module." + k: v for k, v in source.model.state_dict().items()}
    path = tmp_path / "pacs_source.pth"
    torch.save({"state_dict": state, "epoch": 40}, path)
    torch.manual_seed(1)
    loaded = resnet18(7, checkpoint=path)  # pretrained=True is ignored when a checkpoint is given
    assert not loaded.training
    x = torch.rand(2, 3, 64, 64)
    assert torch.equal(loaded(x), source.eval()(x))

    wrapper_file = tmp_path / "wrapper.pt"
    torch.save({"model": source.state_dict()}, wrapper_file)
    again = load_checkpoint(resnet18(7, pretrained=False), wrapper_file)
    assert torch.equal(again.model.fc.weight, source.model.fc.weight)


def test_bad_checkpoints_are_explained(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resnet18(7, checkpoint=tmp_path / "none.pth")
    wrong_head = tmp_path / "ten.pth"
    torch.save(resnet18(10, pretrained=False).model.state_dict(), wrong_head)
    with pytest.raises(ValueError, match="does not fit"):
        resnet18(7, checkpoint=wrong_head)
    not_weights = tmp_path / "odd.pth"
    torch.save({"weights": [1, 2]}, not_weights)
    with pytest.raises(ValueError, match="not a state dict"):
        resnet18(7, checkpoint=not_weights)


def test_pretrained_found_in_torch_hub_cache(empty_caches: Path) -> None:
    torch.manual_seed(3)
    fake = resnet18(1000, pretrained=False).model
    hub = empty_caches / "torch" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    torch.save(fake.state_dict(), hub / "resnet18-f37072fd.pth")
    full = resnet18(1000)
    assert torch.equal(full.model.conv1.weight, fake.conv1.weight)
    pacs = resnet18(7)  # ImageNet backbone, fresh 7-class head
    assert torch.equal(pacs.model.layer4[1].conv2.weight, fake.layer4[1].conv2.weight)
    assert pacs.model.fc.out_features == 7


def test_timm_weights_found_in_hugging_face_cache(empty_caches: Path) -> None:
    from safetensors.torch import save_file

    timm = pytest.importorskip("timm")
    torch.manual_seed(4)
    fake = timm.create_model("resnet10t", pretrained=False)
    snapshot = empty_caches / "hf" / "models--timm--resnet10t.c3_in1k"
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text("abc123")
    (snapshot / "snapshots" / "abc123").mkdir(parents=True)
    weights = {k: v.contiguous() for k, v in fake.state_dict().items()}
    save_file(weights, str(snapshot / "snapshots" / "abc123" / "model.safetensors"))
    net = M._timm_model("resnet10t", "resnet10t", pretrained=True, download=False)
    assert torch.equal(net.state_dict()["fc.weight"], fake.state_dict()["fc.weight"])


def test_random_init_backbones_use_their_own_normalization() -> None:
    gn = load_model("resnet50_gn", pretrained=False)
    assert isinstance(gn, Normalized)
    assert any(isinstance(m, nn.GroupNorm) for m in gn.modules())
    assert torch.allclose(gn.normalize_std.flatten(), torch.tensor(IMAGENET_STD))
    vit = load_model("vit_b_16", pretrained=False)
    assert torch.equal(vit.normalize_mean.flatten(), torch.full((3,), 0.5))
    assert vit(torch.rand(1, 3, 224, 224)).shape == (1, 1000)
    bn = load_model("resnet50_bn", pretrained=False)
    assert any(isinstance(m, nn.BatchNorm2d) for m in bn.modules())
    with pytest.raises(ValueError, match="unknown model 'resnet99'"):
        load_model("resnet99")
