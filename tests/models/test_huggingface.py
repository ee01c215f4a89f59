"""Hugging Face ``transformers`` image classifiers wrap like any other model (issue 66).

Every family is built from a small config with random weights (no download, ``HF_HUB_OFFLINE``)
at 32 px. Each one returns an ``ImageClassifierOutput`` (a ``ModelOutput`` with ``logits``):
every registered method reads it, finds the split at the classifier with no help, returns the
logits tensor, and gives the model back exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import eatta
from _every_method import call, labelled_batches, method_kwargs
from conftest import nested_equal
from eatta.compat import import_transformers

pytest.importorskip("transformers")
T: Any = import_transformers()

CLASSES = 5
SIZE = 32


def _vit_like(model: str, config: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        cfg = getattr(T, config)(
            num_labels=CLASSES, image_size=SIZE, patch_size=8, hidden_size=16,
            num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, **kw,
        )  # fmt: skip
        return getattr(T, model)(cfg)

    return build


#: One tiny member of each family, by name (the class, its config).
FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "vit": _vit_like("ViTForImageClassification", "ViTConfig"),
    "deit": _vit_like("DeiTForImageClassification", "DeiTConfig"),
    "beit": _vit_like("BeitForImageClassification", "BeitConfig", use_mean_pooling=True),
    "resnet": lambda: T.ResNetForImageClassification(
        T.ResNetConfig(num_labels=CLASSES, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])
    ),
    "convnext": lambda: T.ConvNextForImageClassification(
        T.ConvNextConfig(
            num_labels=CLASSES, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=SIZE
        )
    ),
    "swin": lambda: T.SwinForImageClassification(
        T.SwinConfig(
            num_labels=CLASSES,
            image_size=SIZE,
            patch_size=4,
            embed_dim=8,
            depths=[1, 1],
            num_heads=[1, 2],
            window_size=4,
        )
    ),
    "mobilevit": lambda: T.MobileViTForImageClassification(
        T.MobileViTConfig(
            num_labels=CLASSES,
            image_size=SIZE,
            hidden_sizes=[8, 12, 16],
            neck_hidden_sizes=[4, 4, 8, 8, 12, 16, 24],
            patch_size=2,
        )
    ),
    "efficientnet": lambda: T.EfficientNetForImageClassification(
        T.EfficientNetConfig(
            num_labels=CLASSES,
            image_size=SIZE,
            width_coefficient=0.1,
            depth_coefficient=0.1,
            hidden_dim=128,
        )
    ),
}


def _model(family: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return FAMILIES[family]().eval()


def _batches(n: int = 2, size: int = 8, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    return labelled_batches(n, size, side=SIZE, classes=CLASSES, seed=seed)


#: Cheaper settings of the two methods that step many times a batch (what is tested here is how
#: the model is read, not their schedules): SimATTA's 10 steps, HILTTA's 8 candidates.
CHEAP: dict[str, dict[str, Any]] = {"simatta": {"steps": 1}, "hiltta": {"candidates": (1e-3, 1e-4)}}


def _kw(name: str, cheap: bool = False) -> dict[str, Any]:
    kw = method_kwargs(name, side=SIZE)
    if cheap:
        kw.update(CHEAP.get(name, {}))
    return kw


_call = call


def _classifier_input(model: nn.Module, x: Tensor) -> Tensor:
    """What enters the model's classifier ``nn.Linear`` on ``x`` (read with a hook)."""
    head = [m for m in model.classifier.modules() if isinstance(m, nn.Linear)][-1]
    seen: list[Tensor] = []
    handle = head.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_split_is_the_classifier_and_the_tensor_that_enters_it(family: str) -> None:
    model = _model(family)
    x = _batches(1)[0][0]
    backbone, head = eatta.split_model(model)  # no example: the config names the input size
    linear = [m for m in model.classifier.modules() if isinstance(m, nn.Linear)][-1]
    assert head is linear
    with torch.no_grad():
        z = backbone(x)
        torch.testing.assert_close(z, _classifier_input(model, x), rtol=0, atol=0)
        torch.testing.assert_close(head(z), model(x).logits, rtol=0, atol=0)


@pytest.mark.parametrize("name", eatta.available())
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_method_wraps_every_family_with_no_split(family: str, name: str) -> None:
    method = eatta.create(name, _model(family), **_kw(name, cheap=True))
    for x, y in _batches():
        out = _call(method, name, x, y)
        assert type(out) is Tensor and out.shape == (8, CLASSES)  # the logits, not the output
        assert torch.isfinite(out).all()
    assert method.labels_used <= 2 * (3 if name == "hiltta" else 1)


def test_source_serves_the_models_own_logits() -> None:
    model = _model("vit")
    given = copy.deepcopy(model)
    method = eatta.create("source", model)
    for x, _ in _batches():
        with torch.no_grad():
            torch.testing.assert_close(method(x), given(x).logits, rtol=0, atol=0)


class ClassToken(nn.Module):
    """The user's own backbone: the ViT base's class token (not a submodule of the model)."""

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        self.vit = vit

    def forward(self, x: Tensor) -> Tensor:
        return self.vit(x).last_hidden_state[:, 0]


@pytest.mark.parametrize("name", ["eatta-safe", "cotta", "hiltta", "eatta", "tent"])
def test_an_explicit_split_of_the_users_own_modules_is_honoured(name: str) -> None:
    """The split's backbone is a module of the user's own around the model's base: the method,
    the copy of the model as given and CoTTA's teacher all read the logits through it."""
    model = _model("vit")
    backbone = ClassToken(model.vit)
    assert all(m is not backbone for m in model.modules())
    method = eatta.create(name, model, split=(backbone, model.classifier), **_kw(name))
    calls = []
    handle = backbone.register_forward_hook(lambda *_: calls.append(1))
    for x, y in _batches():
        assert _call(method, name, x, y).shape == (8, CLASSES)
    handle.remove()
    assert calls  # the method's own forward went through the user's backbone
    # the given copy reads through a copy of the user's backbone, on the given weights
    given = method.given
    x = _batches(1, seed=5)[0][0]
    expected = given.classifier(given.vit(x).last_hidden_state[:, 0])
    torch.testing.assert_close(method.given_logits(x), expected, rtol=0, atol=0)
    if name == "cotta":  # the teacher too, on its own weights
        teacher = method.teacher
        want = teacher.classifier(teacher.vit(x).last_hidden_state[:, 0])
        with torch.no_grad():
            torch.testing.assert_close(method.logits_of(teacher, x), want, rtol=0, atol=0)


def test_a_backbone_that_returns_a_model_output_is_refused_naming_it() -> None:
    model = _model("vit")
    method = eatta.create("eatta", model, split=(model.vit, model.classifier), **_kw("eatta"))
    before = copy.deepcopy(method.state_dict())
    x, y = _batches(1)[0]
    with pytest.raises(ValueError, match=r"backbone returned a BaseModelOutputWithPooling"):
        method(x, labels=y)
    assert nested_equal(method.state_dict(), before)


def test_a_two_head_deit_is_refused_when_built_saying_what_to_pass() -> None:
    cfg = T.DeiTConfig(
        num_labels=CLASSES, image_size=SIZE, patch_size=8, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T.DeiTForImageClassificationWithTeacher(cfg).eval()
    before = copy.deepcopy(model.state_dict())
    modes = [m.training for m in model.modules()]
    message = r"combine 2 nn.Linear heads \(model.cls_classifier, model.distillation_classifier"
    with pytest.raises(eatta.SplitNotFoundError, match=message + r".*split=\(backbone, head\)"):
        eatta.create("eatta", model, oracle=eatta.GroundTruthOracle())
    assert nested_equal(model.state_dict(), before)
    assert [m.training for m in model.modules()] == modes
    method = eatta.create("tent", model)  # a label-free method reads the logits alone
    assert method(_batches(1)[0][0]).shape == (8, CLASSES)


@pytest.mark.parametrize("name", ["tent", "eatta", "eatta-safe"])
def test_reset_and_unwrap_give_the_hugging_face_model_back_exactly(name: str) -> None:
    model = _model("convnext")
    probe = _batches(1, seed=9)[0][0]
    with torch.no_grad():
        expected = model(probe).logits
    state = copy.deepcopy(model.state_dict())
    modes = [m.training for m in model.modules()]
    grads = [p.requires_grad for p in model.parameters()]
    method = eatta.create(name, model, **_kw(name))
    created = copy.deepcopy(method.model.state_dict())
    for x, y in _batches(3):
        _call(method, name, x, y)
    assert not nested_equal(method.model.state_dict(), created)
    method.reset()
    assert nested_equal(method.model.state_dict(), created)
    back = method.unwrap()
    assert back is model and nested_equal(model.state_dict(), state)
    assert [m.training for m in model.modules()] == modes
    assert [p.requires_grad for p in model.parameters()] == grads
    with torch.no_grad():
        torch.testing.assert_close(model(probe).logits, expected, rtol=0, atol=0)
