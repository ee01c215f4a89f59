"""The gradient planner and segmenting: where cuts go, when they apply, how many passes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from eatta.gradients import exact as _grads
from eatta.gradients.exact import (
    Segmented,
    has_module_hooks,
    plan_segments,
    segmented_grads,
    two_pass_grads,
)

DEPTH = 8


def chain(depth: int = DEPTH, bias: bool = False) -> nn.Sequential:
    """``depth`` identical Linear-LayerNorm-Tanh layers: equal gradient mass per layer."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(6, 6, bias=bias), nn.LayerNorm(6), nn.Tanh()]
    return nn.Sequential(*layers)


def losses(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    o = model(torch.randn(4, 6, generator=torch.Generator().manual_seed(1)))
    return o.pow(2).mean(), o.softmax(1).max(1).values.sum()


class CountGrad:
    """``torch.autograd.grad`` that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.grad = torch.autograd.grad

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.grad(*args, **kwargs)


@pytest.fixture
def count_grad(monkeypatch) -> CountGrad:
    counter = CountGrad()
    monkeypatch.setattr(torch.autograd, "grad", counter)
    return counter


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("segments", [2, 4, 8])
def test_cuts_split_a_uniform_chain_into_equal_shares(segments, bias):
    # a trained Linear bias is a second side branch at every layer (its accumulator): the planner
    # finishes side branches before the trunk, or that edge would stay pending and leave no cut
    model = chain(bias=bias)
    params = list(model.parameters())  # 3 or 4 per layer, input side first
    plan = plan_segments([model(torch.randn(4, 6)).grad_fn], params, segments)
    assert plan.num_segments == len(plan.cuts) + 1 == segments
    # segment 0 is at the loss side: the last layers' parameters
    assert list(plan.segment_of) == sorted(plan.segment_of, reverse=True)
    per = len(params) // segments
    assert [plan.segment_of.count(s) for s in range(segments)] == [per] * segments


def test_one_segment_means_no_cut():
    model = chain()
    plan = plan_segments([model(torch.randn(4, 6)).grad_fn], list(model.parameters()), 1)
    assert plan.cuts == () and set(plan.segment_of) == {0}


def test_graph_bytes_are_the_gradient_bytes_every_node_receives():
    w = torch.randn(3, 2, requires_grad=True)
    loss = (torch.randn(5, 3) @ w).sum()
    plan = plan_segments([loss.grad_fn], [w], 2)
    # the virtual entry node (no metadata) counts 1 byte; SumBackward receives a float32
    # scalar, MmBackward the [5, 2] product, w's accumulator a [3, 2] gradient
    assert plan.graph_bytes == 1 + 4 + 5 * 2 * 4 + 3 * 2 * 4


def test_graphs_below_min_bytes_are_not_cut():
    model = chain()
    root, params = model(torch.randn(4, 6)).grad_fn, list(model.parameters())
    mass = plan_segments([root], params, 4).graph_bytes
    assert plan_segments([root], params, 4, min_bytes=mass).num_segments == 4  # at the bound
    assert plan_segments([root], params, 4, min_bytes=mass + 1).cuts == ()


def test_a_plan_is_immutable():
    model = chain(2)
    plan = plan_segments([model(torch.randn(4, 6)).grad_fn], list(model.parameters()), 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.cuts = ()  # type: ignore[misc]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("segments", [2, 4])
def test_segmented_grads_take_two_passes_per_segment_and_match_two_passes(
    count_grad, segments, bias
):
    model = chain(bias=bias)
    params = list(model.parameters())
    want = two_pass_grads(*losses(model), params)
    count_grad.calls = 0
    got = segmented_grads(*losses(model), params, segments)
    assert count_grad.calls == 2 * segments  # it did segment (torch >= 2.4 addresses edges)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("top_first", [False, True], ids=["full-first", "top-first"])
def test_losses_reaching_different_parameters_get_the_two_pass_gradients(top_first):
    """One loss reaches every layer, the other only the top layer and a parameter of its own:
    below the first cut only one loss has gradient left, and each loss leaves some inputs unused."""
    model = chain()
    extra = nn.Parameter(torch.ones(6))
    params = [*model.parameters(), extra]

    def pair() -> tuple[torch.Tensor, torch.Tensor]:
        full = losses(model)[0]
        top = (model[-3].weight.sum(0) * extra).sum()
        return full, top

    full, top = pair()
    plan = plan_segments([full.grad_fn, top.grad_fn], params, 4)  # cuts: edges of this graph
    assert plan.num_segments == 4 and plan.segment_of[-1] == 0
    got = segmented_grads(*((top, full) if top_first else (full, top)), params, 4, plan)
    full, top = pair()
    want = two_pass_grads(*((top, full) if top_first else (full, top)), params)
    for w, g in zip(want[0] + want[1], got[0] + got[1], strict=True):
        assert (w is None and g is None) or torch.equal(w, g)
    # the full loss misses only `extra`; the top one reaches 2 of the 3 * DEPTH + 1 parameters
    assert sum(g is None for g in want[0] + want[1]) == 1 + (3 * DEPTH + 1 - 2)


def test_parameters_outside_the_graph_have_no_segment():
    model = chain(2)
    spare = nn.Parameter(torch.ones(2))
    params = [*model.parameters(), spare]
    plan = plan_segments([model(torch.randn(4, 6)).grad_fn], params, 2)
    assert plan.segment_of[-1] == -1 and min(plan.segment_of[:-1]) >= 0


def test_a_plan_without_cuts_falls_back_to_two_passes(count_grad):
    model = chain()
    got = segmented_grads(*losses(model), list(model.parameters()), 4, min_bytes=float("inf"))
    assert count_grad.calls == 2 and len(got[0]) == 3 * DEPTH


def test_one_segment_is_two_passes(count_grad):
    model = chain()
    segmented_grads(*losses(model), list(model.parameters()), 1)
    assert count_grad.calls == 2


def test_the_segmented_strategy_plans_and_segments_without_hooks(count_grad):
    model = chain()
    strategy = Segmented(4, 0.0, auto=True, model=model)
    assert strategy.active
    params = list(model.parameters())
    plan = strategy.plan(model(torch.randn(4, 6)), params)
    assert plan is not None and plan.num_segments == 4
    count_grad.calls = 0
    strategy.grads(*losses(model), params)  # no plan given: plans from the losses
    assert count_grad.calls == 8


def test_auto_segmenting_stands_down_while_the_model_has_hooks(count_grad):
    model = chain()
    handle = model[4].register_forward_hook(lambda *a: None)
    params = list(model.parameters())
    auto = Segmented(4, 0.0, auto=True, model=model)
    assert not auto.active and auto.plan(model(torch.randn(4, 6)), params) is None
    count_grad.calls = 0
    auto.grads(*losses(model), params)
    assert count_grad.calls == 2
    assert Segmented(4, 0.0, auto=False, model=model).active  # asked for explicitly: it segments
    handle.remove()
    assert auto.active  # hooks can come and go


def test_no_plan_for_a_tensor_outside_autograd():
    strategy = Segmented(4, 0.0, auto=False, model=None)
    assert strategy.plan(torch.randn(4, 6), [torch.randn(2, requires_grad=True)]) is None


def test_global_module_hooks_count_as_hooks():
    model = chain(1)
    assert not has_module_hooks(model)
    handle = nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert has_module_hooks(model)
    finally:
        handle.remove()
    assert not has_module_hooks(model)


def test_edges_are_supported_on_this_torch():
    """The pinned torch (2.13) addresses graph edges, so the segmented paths above are real."""
    assert _grads.EDGES_SUPPORTED is hasattr(torch.autograd.graph, "GradientEdge")
