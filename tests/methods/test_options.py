"""One set of keywords (issue 66): every method takes the options every method can honour
(``split``, ``check_finite``, ``autocast``, ``channels_last``, the parts), in ``create`` and in
its constructor; components take names or instances, the same in both ways."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import eatta
from _every_method import call, labelled_batches, method_kwargs
from conftest import confident_cnn, nested_equal
from eatta.buffer import LabelBuffer
from eatta.debias import BoundedGradNormDebiaser, GradNormDebiaser
from eatta.methods.tent import Tent
from eatta.selection.plpd import PLPDSelector
from eatta.selection.uncertainty import RandomSelector

_kw, _call = method_kwargs, call


def _batches(n: int = 2, size: int = 16) -> list[tuple[Tensor, Tensor]]:
    return labelled_batches(n, size)


@pytest.mark.parametrize("name", eatta.available())
def test_every_method_runs_its_forward_passes_under_autocast(name: str) -> None:
    """``autocast=True``: the model's convolutions run in bfloat16, the logits come back in the
    input's dtype."""
    model = confident_cnn()
    dtypes: list[torch.dtype] = []
    model[0].register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    method = eatta.create(name, model, autocast=True, **_kw(name))
    assert method.autocast is True
    dtypes.clear()  # EATA's Fisher information, computed when it is built, is not the stream's
    for x, y in _batches():
        out = _call(method, name, x, y)
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert dtypes and set(dtypes) == {torch.bfloat16}


@pytest.mark.parametrize("name", eatta.available())
def test_every_method_takes_channels_last_and_unwrap_gives_the_format_back(name: str) -> None:
    model = confident_cnn()
    method = eatta.create(name, model, channels_last=True, **_kw(name))
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    for x, y in _batches():
        assert _call(method, name, x, y).shape == (16, 5)
    method.unwrap()
    assert model[0].weight.is_contiguous()


@pytest.mark.filterwarnings("ignore:EATTA skipped a step:RuntimeWarning")  # the NaN batch's
@pytest.mark.parametrize("name", eatta.available())
def test_every_method_takes_check_finite(name: str) -> None:
    x, y = _batches(1)[0]
    x[0, 0, 0, 0] = float("nan")
    checking = eatta.create(name, confident_cnn(), **_kw(name))
    with pytest.raises(eatta.InvalidInputError, match="NaN"):
        _call(checking, name, x, y)
    trusting = eatta.create(name, confident_cnn(), check_finite=False, **_kw(name))
    _call(trusting, name, x, y)  # not checked: the batch goes through


@pytest.mark.parametrize("key", ["autocast", "channels_last", "check_finite"])
def test_an_option_that_is_not_a_bool_is_refused_before_the_model_changes(key: str) -> None:
    model = confident_cnn()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(TypeError, match=key):
        eatta.create("tent", model, **{key: "yes"})
    with pytest.raises(TypeError, match=key):
        Tent(model, torch.optim.SGD(eatta.configure(model), lr=0.1), **{key: 1})
    assert nested_equal(model.state_dict(), before)


def test_a_misspelt_option_is_refused_with_the_right_name() -> None:
    with pytest.raises(TypeError, match="did you mean 'autocast'"):
        eatta.create("cotta", confident_cnn(), autocst=True)


def _eatta(model: nn.Module, **kw: Any) -> eatta.EATTA:
    optimizer = torch.optim.SGD(eatta.configure(model), lr=1e-3)
    return eatta.EATTA(model, optimizer, oracle=eatta.GroundTruthOracle(), **kw)


@pytest.mark.parametrize(
    "key,value,kind",
    [
        ("selector", "plpd", PLPDSelector),
        ("selector", "random", RandomSelector),
        ("debiaser", "bounded", BoundedGradNormDebiaser),
        ("debiaser", "gradnorm", GradNormDebiaser),
    ],
)
def test_a_component_by_name_is_the_same_in_create_and_the_class_api(
    key: str, value: str, kind: type
) -> None:
    by_class = _eatta(confident_cnn(), **{key: value})
    by_name = eatta.create(
        "eatta", confident_cnn(), oracle=eatta.GroundTruthOracle(), **{key: value}
    )
    for method in (by_class, by_name):
        part = getattr(method, key)
        assert type(part) is kind
    for (x, y), _ in zip(_batches(), range(2), strict=False):  # both take steps
        assert by_class(x, labels=y).shape == by_name(x, labels=y).shape == (16, 5)


def test_a_component_instance_is_taken_as_it_is_in_both_ways() -> None:
    selector, debiaser, buffer = RandomSelector(3), BoundedGradNormDebiaser(), LabelBuffer(8)
    method = eatta.create(
        "eatta", confident_cnn(), oracle=eatta.GroundTruthOracle(), selector=selector,
        debiaser=debiaser, buffer=buffer,
    )  # fmt: skip
    assert method.selector is selector and method.debiaser is debiaser
    assert method.replay is not None and method.replay.buffer is buffer
    method2 = _eatta(confident_cnn(), selector=RandomSelector(3), buffer=8)
    assert isinstance(method2.replay.buffer, LabelBuffer) and method2.replay.buffer.capacity == 8


@pytest.mark.parametrize(
    "key,value,error,message",
    [
        ("selector", "plpdd", ValueError, "unknown selector 'plpdd'"),
        ("selector", 3, TypeError, "selector must be a name"),
        ("debiaser", "gnd", ValueError, "unknown debiaser 'gnd'"),
        ("balance", 1, TypeError, "balance must be a name"),
        ("buffer", "300", TypeError, "buffer must be a capacity"),
    ],
)
def test_a_bad_component_is_refused_when_built_before_the_model_changes(
    key: str, value: object, error: type, message: str
) -> None:
    model = confident_cnn()
    optimizer = torch.optim.SGD(eatta.configure(model), lr=1e-3)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(error, match=message):
        eatta.EATTA(model, optimizer, oracle=eatta.GroundTruthOracle(), **{key: value})
    assert nested_equal(model.state_dict(), before)
