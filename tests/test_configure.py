"""Model configuration and parameter presets."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import eatta
from conftest import tiny_cnn
from eatta.configure import collect_params
from eatta.golden import TinyResNetLike


def test_configure_sets_eval_batch_stats_and_norm_params():
    model = nn.Sequential(tiny_cnn(), nn.Dropout(0.5))
    model.add_module("ln", nn.LayerNorm(5))
    model.add_module("gn", nn.GroupNorm(1, 5))
    model.train()
    params = eatta.configure(model)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert not any(m.training for m in model.modules() if not isinstance(m, nn.BatchNorm2d))
    assert all(m.training for m in bns)  # training mode on the batch's statistics
    assert bns and all(not m.track_running_stats for m in bns)  # batch statistics
    assert all(m.running_mean is not None for m in bns)  # kept, unused: reset() gives them back
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        "0.1.weight",
        "0.1.bias",
        "0.4.weight",
        "0.4.bias",
        "ln.weight",
        "ln.bias",
        "gn.weight",
        "gn.bias",
    }
    assert len(params) == len(trainable)
    # batch statistics: the output of a sample depends on the rest of the batch
    x = torch.randn(8, 3, 8, 8)
    with torch.no_grad():
        assert not torch.allclose(model[0](x)[:4], model[0](x[:4]))


def test_reference_preset_matches_the_authors_choice():
    model = TinyResNetLike(4, 3)
    params, names = collect_params(model, "reference")
    assert names == [
        "bn1.weight",
        "bn1.bias",
        "layer1.0.weight",
        "layer1.1.weight",
        "layer1.1.bias",
    ]
    assert len({id(p) for p in params}) == len(params)
    with pytest.raises(ValueError, match="layer1"):
        collect_params(tiny_cnn(), "reference")


def test_callable_and_errors():
    model = tiny_cnn()
    _params, names = collect_params(model, lambda mod, m, p: isinstance(m, nn.Linear))
    assert names == ["8.weight", "8.bias"]
    with pytest.raises(ValueError, match="unknown parameter preset"):
        collect_params(model, "bogus")
    with pytest.raises(ValueError, match="matched no parameter"):
        eatta.configure(model, lambda *a: False)
    assert model[1].running_mean is not None  # a failed configure changed nothing
    no_norm = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    with pytest.raises(ValueError, match=r"no normalization layer.*params='all'"):
        eatta.configure(no_norm)
