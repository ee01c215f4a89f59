"""TENT: whole-batch entropy minimization of the norm-layer affine parameters."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from conftest import BAD_BATCHES, check_rejects_without_change
from eatta import configure
from eatta.losses import entropy
from eatta.methods.registry import create
from eatta.methods.tent import Tent

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

BN_PARAMS = {"1.weight", "1.bias", "4.weight", "4.bias"}


def build(make_confident_model, lr: float = 0.1, momentum: float = 0.9) -> Tent:
    model = make_confident_model(seed=0)
    params = configure(model)
    return Tent(model, torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=momentum > 0))


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def test_only_norm_affine_parameters_change(make_confident_model, make_image_batches):
    tent = build(make_confident_model)
    before = snapshot(tent.model)
    for x in make_image_batches(2):
        tent(x)
    changed = {k for k, v in snapshot(tent.model).items() if not torch.equal(v, before[k])}
    assert changed == BN_PARAMS


def test_one_step_is_the_hand_computed_entropy_sgd_step(make_confident_model, make_image_batches):
    tent = build(make_confident_model, lr=0.5, momentum=0.0)
    ref = copy.deepcopy(tent.model)
    (x,) = make_image_batches(1)
    logits_ref = ref(x)
    loss = entropy(logits_ref).mean()  # mean over the whole batch, no filtering
    names = sorted(BN_PARAMS)
    named = dict(ref.named_parameters())
    grads = torch.autograd.grad(loss, [named[n] for n in names])
    out = tent(x)
    assert torch.allclose(out, logits_ref.detach(), atol=1e-6)  # logits before the update
    now = dict(tent.model.named_parameters())
    for n, g in zip(names, grads, strict=True):
        assert g.abs().sum() > 0
        torch.testing.assert_close(now[n].detach(), named[n].detach() - 0.5 * g)


def test_reset_restores_model_and_optimizer_exactly(
    make_confident_model, make_image_batches, assert_nested_equal
):
    tent = build(make_confident_model)
    model0 = copy.deepcopy(tent.model.state_dict())
    opt0 = copy.deepcopy(tent.optimizer.state_dict())
    xs = make_image_batches(3)
    first = tent(xs[0])
    tent(xs[1])
    assert tent.optimizer.state_dict()["state"]  # momentum buffers exist
    tent.reset()
    assert_nested_equal(tent.model.state_dict(), model0)
    assert_nested_equal(tent.optimizer.state_dict(), opt0)
    assert torch.equal(tent(xs[0]), first)


def test_state_dict_round_trip_continues_identically(
    make_confident_model, make_image_batches, checkpoint_round_trip
):
    a = build(make_confident_model)
    xs = make_image_batches(4)
    for x in xs[:2]:
        a(x)
    b = build(make_confident_model)
    b.load_state_dict(checkpoint_round_trip(a.state_dict()))
    for x in xs[2:]:
        assert torch.equal(a(x), b(x))
    for (na, pa), (nb, pb) in zip(
        a.model.named_parameters(), b.model.named_parameters(), strict=True
    ):
        assert na == nb and torch.equal(pa, pb)
    assert len(a.optimizer.state_dict()["state"]) == len(b.optimizer.state_dict()["state"])


@pytest.mark.parametrize("bad", sorted(BAD_BATCHES))
def test_bad_input_raises_and_changes_nothing(make_confident_model, make_image_batches, bad):
    check_rejects_without_change(build(make_confident_model), make_image_batches(1)[0], bad)


def test_registry_defaults(make_model):
    tent = create("tent", make_model())
    assert isinstance(tent, Tent)
    opt = tent.optimizer
    assert isinstance(opt, torch.optim.SGD)
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (2.5e-4, 0.9, True)
    names = {n for n, p in tent.model.named_parameters() if p.requires_grad}
    assert names == BN_PARAMS
    pacs = create("tent", make_model(), dataset="pacs")
    assert isinstance(pacs.optimizer, torch.optim.Adam)
    assert pacs.optimizer.param_groups[0]["lr"] == 5e-3
    assert create("tent", make_model(), dataset="imagenet-a").optimizer.param_groups[0]["lr"] == (
        2.5e-4
    )


def test_rejects_bad_steps(make_model):
    model = make_model()
    with pytest.raises(ValueError, match="steps"):
        Tent(model, torch.optim.SGD(configure(model), lr=0.1), steps=0)
