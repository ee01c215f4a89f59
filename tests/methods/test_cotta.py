"""CoTTA: mean teacher, anchor-gated augmentation averaging, stochastic restore."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import BAD_BATCHES, check_rejects_without_change
from eatta import configure
from eatta.methods.cotta import CoTTA, TTAAugment, cotta_param_filter, symmetric_cross_entropy
from eatta.methods.registry import create

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

ALL_PARAMS = {
    "0.weight",
    "1.weight",
    "1.bias",
    "3.weight",
    "4.weight",
    "4.bias",
    "8.weight",
    "8.bias",
}


def build(make_confident_model, lr=0.05, momentum=0.9, **kwargs) -> CoTTA:
    model = make_confident_model(seed=0)
    params = configure(model, cotta_param_filter)
    kwargs.setdefault("num_augmentations", 2)
    return CoTTA(model, torch.optim.SGD(params, lr=lr, momentum=momentum), **kwargs)


def params_of(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def test_all_weights_adapt_and_the_anchor_stays(make_confident_model, make_image_batches):
    cotta = build(make_confident_model, restore_prob=0.0, ap_threshold=1.01)
    student0, teacher0, anchor0 = (params_of(m) for m in (cotta.model, cotta.teacher, cotta.anchor))
    for x in make_image_batches(2):
        cotta(x)
    assert cotta.last_step.augmented
    changed = {k for k, v in params_of(cotta.model).items() if not torch.equal(v, student0[k])}
    assert changed == ALL_PARAMS
    assert all(not torch.equal(v, teacher0[k]) for k, v in params_of(cotta.teacher).items())
    assert all(torch.equal(v, anchor0[k]) for k, v in params_of(cotta.anchor).items())


def test_teacher_is_the_ema_of_the_student(make_confident_model, make_image_batches):
    m = 0.9
    cotta = build(make_confident_model, ema_momentum=m, restore_prob=0.0)
    xs = make_image_batches(2)
    cotta(xs[0])
    teacher_before = params_of(cotta.teacher)
    cotta(xs[1])
    student_after = params_of(cotta.model)
    for k, v in params_of(cotta.teacher).items():
        want = m * teacher_before[k] + (1 - m) * student_after[k]
        torch.testing.assert_close(v, want, rtol=0, atol=1e-7)


def test_student_step_minimizes_the_symmetric_cross_entropy(
    make_confident_model, make_image_batches
):
    lr = 0.5
    cotta = build(make_confident_model, lr=lr, momentum=0.0, restore_prob=0.0, ap_threshold=0.0)
    (x,) = make_image_batches(1)
    student = copy.deepcopy(cotta.model)
    with torch.no_grad():
        teacher = copy.deepcopy(cotta.teacher)(x)
    named = dict(student.named_parameters())
    names = sorted(ALL_PARAMS)
    s = student(x)
    manual = (
        -0.5 * (teacher.softmax(1) * s.log_softmax(1)).sum(1)
        - 0.5 * (s.softmax(1) * teacher.log_softmax(1)).sum(1)
    ).mean()
    torch.testing.assert_close(symmetric_cross_entropy(s, teacher).mean(), manual)
    grads = torch.autograd.grad(manual, [named[n] for n in names])
    out = cotta(x)
    assert not cotta.last_step.augmented
    torch.testing.assert_close(out, teacher)  # the teacher's prediction is returned
    now = dict(cotta.model.named_parameters())
    for n, g in zip(names, grads, strict=True):
        torch.testing.assert_close(now[n].detach(), named[n].detach() - lr * g)


def test_restore_with_probability_one_returns_the_source_weights(
    make_confident_model, make_image_batches
):
    cotta = build(make_confident_model, restore_prob=1.0, ema_momentum=0.5)
    source = params_of(cotta.model)
    cotta(make_image_batches(1)[0])
    assert all(torch.equal(v, source[k]) for k, v in params_of(cotta.model).items())
    # the teacher averaged the student before the restore, so it moved
    assert any(not torch.equal(v, source[k]) for k, v in params_of(cotta.teacher).items())


def test_partial_restore_touches_roughly_the_requested_fraction(
    make_confident_model, make_image_batches
):
    cotta = build(make_confident_model, restore_prob=0.3, lr=0.5)
    source = params_of(cotta.model)
    cotta(make_image_batches(1)[0])
    now = params_of(cotta.model)
    restored = sum(int((now[k] == source[k]).sum()) for k in ALL_PARAMS)
    total = sum(v.numel() for v in now.values())
    assert 0.15 < restored / total < 0.45


def test_low_anchor_confidence_averages_seeded_augmentations(
    make_confident_model, make_image_batches
):
    cotta = build(make_confident_model, ap_threshold=1.01, num_augmentations=3, seed=7)
    teacher = copy.deepcopy(cotta.teacher)
    (x,) = make_image_batches(1)
    g = torch.Generator().manual_seed(7)
    aug = TTAAugment()
    with torch.no_grad():
        want = sum(teacher(aug(x, g)) for _ in range(3)) / 3
    out = cotta(x)
    assert cotta.last_step.augmented
    torch.testing.assert_close(out, want)
    with torch.no_grad():
        assert not torch.allclose(out, teacher(x), atol=1e-4)


def test_augmentation_is_seeded_shaped_and_in_range():
    x = torch.rand(4, 3, 8, 8)
    aug = TTAAugment()
    a = aug(x, torch.Generator().manual_seed(1))
    b = aug(x, torch.Generator().manual_seed(1))
    c = aug(x, torch.Generator().manual_seed(2))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    gray = aug(torch.rand(2, 1, 8, 8), torch.Generator().manual_seed(1))
    assert gray.shape == (2, 1, 8, 8)


def test_reset_restores_everything_exactly(
    make_confident_model, make_image_batches, assert_nested_equal
):
    cotta = build(make_confident_model, ap_threshold=1.01)
    model0 = copy.deepcopy(cotta.model.state_dict())
    opt0 = copy.deepcopy(cotta.optimizer.state_dict())
    gen0 = cotta.generator.get_state().clone()
    xs = make_image_batches(3)
    first = cotta(xs[0])
    cotta(xs[1])
    cotta.reset()
    assert_nested_equal(cotta.model.state_dict(), model0)
    assert_nested_equal(cotta.teacher.state_dict(), model0)
    assert_nested_equal(cotta.anchor.state_dict(), model0)
    assert_nested_equal(cotta.optimizer.state_dict(), opt0)
    assert torch.equal(cotta.generator.get_state(), gen0)
    assert torch.equal(cotta(xs[0]), first)


def test_state_dict_round_trip_continues_identically(
    make_confident_model, make_image_batches, checkpoint_round_trip
):
    a = build(make_confident_model, ap_threshold=1.01)
    xs = make_image_batches(4)
    for x in xs[:2]:
        a(x)
    b = build(make_confident_model, ap_threshold=1.01)
    b.load_state_dict(checkpoint_round_trip(a.state_dict()))
    for x in xs[2:]:
        assert torch.equal(a(x), b(x))
    for module in ("model", "teacher"):
        pa, pb = params_of(getattr(a, module)), params_of(getattr(b, module))
        assert all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.parametrize("bad", sorted(BAD_BATCHES))
def test_bad_input_raises_and_changes_nothing(make_confident_model, make_image_batches, bad):
    check_rejects_without_change(
        build(make_confident_model, ap_threshold=1.01), make_image_batches(1)[0], bad
    )


def test_failed_forward_keeps_the_generator(make_confident_model, make_image_batches):
    cotta = build(make_confident_model, ap_threshold=1.01)
    state = cotta.generator.get_state().clone()
    params = params_of(cotta.model)

    def boom(x, g):
        torch.rand((), generator=g)
        raise RuntimeError("augmentation failed")

    cotta.augment = boom
    with pytest.raises(RuntimeError, match="augmentation failed"):
        cotta(make_image_batches(1)[0])
    assert torch.equal(cotta.generator.get_state(), state)
    assert all(torch.equal(v, params[k]) for k, v in params_of(cotta.model).items())


def test_registry_defaults(make_model):
    cotta = create("cotta", make_model())
    assert isinstance(cotta, CoTTA)
    group = cotta.optimizer.param_groups[0]
    assert isinstance(cotta.optimizer, torch.optim.SGD)
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.01, 0.9, True)
    assert (cotta.ema_momentum, cotta.restore_prob, cotta.ap_threshold) == (0.999, 0.01, 0.1)
    assert cotta.num_augmentations == 32
    names = {n for n, p in cotta.model.named_parameters() if p.requires_grad}
    assert names == ALL_PARAMS
    pacs = create("cotta", make_model(), dataset="pacs", num_augmentations=2)
    assert isinstance(pacs.optimizer, torch.optim.Adam)
    assert pacs.optimizer.param_groups[0]["lr"] == 0.01
    assert (pacs.ap_threshold, pacs.num_augmentations) == (0.72, 2)
    assert pacs(torch.rand(4, 3, 8, 8)).shape == (4, 5)
