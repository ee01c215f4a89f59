"""The exact gradient of EATTA's update, ``γ_sup·∇L_sup + γ_unsup·∇L_unsup`` (paper Eq. 2).

The step asks its gradient (:class:`ExactGradient`) for the two gradient norms ``‖∇L_sup‖₂``,
``‖∇L_unsup‖₂`` (the inputs of Eq. 4-5), lets the debiaser turn them into the weights, and asks
for the weighted gradient with those weights (:meth:`ExactGradient.weighted`): both gradients,
their norms over the measured parameters, then the weighted sum (:func:`weighted_sum`). A
debiaser that needs no norms (weights 1, 1) gets ``∇(L_sup + L_unsup)`` in one pass instead.

The two gradients share one autograd graph, and there are three ways to compute them, all giving
the same numbers (a :class:`GradientStrategy`):

* :func:`two_pass_grads`: ``autograd.grad`` of the first loss with ``retain_graph=True``, then of
  the second. Simple and fast, but during the first pass every saved activation stays alive while
  the gradient temporaries of the lowest layers (the largest tensors of a CNN) are allocated on top
  of them: about +19% peak memory over TENT on a ResNet-18 at 64 px, +14% on a ResNet-50 at 224 px.
* :func:`segmented_grads`: the same two passes, run segment by segment between *cut points* of the
  graph (:func:`plan_segments`), so each segment's saved activations are freed as soon as both
  losses went through it. Bitwise identical to the two-pass result, same time, peak memory within
  about 1% of TENT's.
* :func:`batched_grads`: one ``autograd.grad`` call with ``is_grads_batched=True`` (vmap over the
  two cotangents). Low memory too, but PyTorch 2.13's batching rules for convolution and batch-norm
  backward loop over the two cotangents and concatenate, so it is about 10% slower on CPU.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn
from torch.torch_version import TorchVersion

if TYPE_CHECKING:
    from torch.autograd.graph import GradientEdge, Node

__all__ = [
    "EDGES_SUPPORTED",
    "Batched",
    "ExactGradient",
    "GradientStrategy",
    "SegmentPlan",
    "Segmented",
    "TwoPass",
    "batched_grads",
    "dense",
    "global_norm",
    "has_module_hooks",
    "plan_segments",
    "segmented_grads",
    "two_pass_grads",
    "weighted_sum",
]

#: ``torch.autograd.grad`` takes ``GradientEdge`` outputs and inputs from PyTorch 2.4 on.
EDGES_SUPPORTED = TorchVersion(torch.__version__) >= "2.4" and hasattr(
    torch.autograd.graph, "GradientEdge"
)

Grads = list[Tensor | None]


class _VirtualRoot:
    """A graph node whose edges lead to the real roots."""

    def __init__(self, roots: Sequence[object]) -> None:
        self.next_functions = tuple((r, 0) for r in roots)


@dataclass(frozen=True)
class SegmentPlan:
    """Cut points of a backward graph, top (loss side) first, and each parameter's segment.

    Segment ``s`` lies between cut ``s - 1`` (or the losses) and cut ``s`` (or the graph's end);
    ``segment_of[i]`` is the segment holding parameter ``i``'s gradient accumulator, or ``-1`` if
    the losses do not depend on it. ``graph_bytes``: the gradient bytes all nodes receive.
    """

    cuts: tuple[GradientEdge, ...]
    segment_of: tuple[int, ...]
    graph_bytes: float

    @property
    def num_segments(self) -> int:
        return len(self.cuts) + 1


def _grad_bytes(node: object) -> float:
    """Bytes of the gradient a node receives: a cheap proxy for the memory it handles."""
    try:
        meta = node._input_metadata  # type: ignore[attr-defined]
        return float(sum(math.prod(m.shape) * m.dtype.itemsize for m in meta))
    except (AttributeError, TypeError, RuntimeError):
        return 1.0


def plan_segments(
    roots: Sequence[object], params: Sequence[Tensor], segments: int, min_bytes: float = 0.0
) -> SegmentPlan:
    """Find up to ``segments - 1`` cut points of the backward graph below ``roots``.

    A node is a cut when, in a topological order of the graph (Kahn's algorithm from the roots,
    lowest node first, so side branches end before the trunk goes on), every edge leaving the
    nodes already visited points at it: then everything below it is reached
    only through it, and the gradient flowing into it is all the lower part needs. The node must
    receive gradient for one forward output only, and must not be a leaf accumulator. Cuts are
    chosen nearest to equal shares of the graph's "mass" (the gradient bytes its nodes receive,
    a cheap proxy for the activation memory each part holds). Shared parameters, skip
    connections around a candidate, or a second forward pass through the same weights simply
    leave no cut there, so a plan is always exact; with no cut it degenerates to the plain
    two-pass computation, as it does for graphs whose gradients total less than ``min_bytes``
    (where little memory is at stake and the extra ``autograd.grad`` calls cost relatively more).
    """
    roots = [r for r in dict.fromkeys(roots) if r is not None]
    top = _VirtualRoot(roots)  # one entry point, so no cut is taken before every root is seen
    g = _Graph(top)
    mass = sum(g.bytes.values())
    if segments < 2 or mass < min_bytes:
        return _plan(params, [list(g.children)], (), mass)
    left = dict(g.indeg)
    # Kahn's algorithm, the lowest node first: short side branches (a weight's transpose and
    # accumulator, a bias accumulator) are finished before the trunk goes on, so no edge into
    # them stays pending below the layer and the trunk's nodes can be cuts.
    tick = itertools.count()  # ties: first ready, first taken (nodes do not compare)
    ready: list[tuple[int, int, object]] = [(g.height[top], next(tick), top)]
    order: list[object] = []
    mass_before: list[float] = []  # gradient bytes received by the nodes before each position
    done = 0.0
    candidates: list[int] = []
    is_root = set(roots)
    pending = 0  # edges from visited nodes to nodes not yet visited
    while ready:
        node = heapq.heappop(ready)[2]
        incoming = g.indeg.get(node, 0)
        if (
            pending == incoming
            and node not in is_root
            and node is not top
            and len(g.slots[node]) == 1
            and not hasattr(node, "variable")
        ):
            candidates.append(len(order))
        order.append(node)
        mass_before.append(done)
        done += g.bytes[node]
        pending -= incoming
        for child in g.children[node]:
            pending += 1
            left[child] -= 1
            if left[child] == 0:
                heapq.heappush(ready, (g.height[child], next(tick), child))
    chosen: list[int] = []
    for k in range(1, segments) if candidates else ():
        target = k * mass / segments
        best = min(candidates, key=lambda pos: abs(mass_before[pos] - target))
        if best not in chosen:
            chosen.append(best)
    chosen.sort()
    bounds = [0, *chosen, len(order)]
    # a cut is a real backward node, never the virtual root (``top`` is excluded above)
    cuts = tuple(
        torch.autograd.graph.GradientEdge(cast("Node", order[pos]), next(iter(g.slots[order[pos]])))
        for pos in chosen
    )
    parts = [order[a:b] for a, b in itertools.pairwise(bounds)]
    return _plan(params, parts, cuts, mass)


class _Graph:
    """The backward graph below ``top``, walked once (depth first, children before parents):
    each node's children, in-degree, input slots used, gradient bytes and height (its longest
    path down to a node without children)."""

    def __init__(self, top: object) -> None:
        self.children: dict[object, list[object]] = {}
        self.indeg: dict[object, int] = {}
        self.slots: dict[object, set[int]] = {}
        self.bytes: dict[object, float] = {}
        self.height: dict[object, int] = {}
        stack: list[tuple[object, bool]] = [(top, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:  # every child is finished: a DAG has no path back to ``node``
                kids = self.children[node]
                self.height[node] = 1 + max((self.height[c] for c in kids), default=-1)
                continue
            if node in self.children:  # reached again through another parent
                continue
            kids = self.children[node] = []
            self.bytes[node] = _grad_bytes(node)
            stack.append((node, True))
            for child, nr in node.next_functions:  # type: ignore[attr-defined]
                if child is None:
                    continue
                kids.append(child)
                self.indeg[child] = self.indeg.get(child, 0) + 1
                self.slots.setdefault(child, set()).add(nr)
                if child not in self.children:
                    stack.append((child, False))


def _plan(
    params: Sequence[Tensor],
    parts: list[list[object]],
    cuts: tuple[GradientEdge, ...],
    mass: float,
) -> SegmentPlan:
    """The plan whose segment ``s`` holds the nodes ``parts[s]``."""
    segment_of_leaf = {
        id(node.variable): s
        for s, nodes in enumerate(parts)
        for node in nodes
        if hasattr(node, "variable")
    }
    return SegmentPlan(cuts, tuple(segment_of_leaf.get(id(p), -1) for p in params), mass)


def two_pass_grads(first: Tensor, second: Tensor, params: Sequence[Tensor]) -> tuple[Grads, Grads]:
    """``d first / d params`` and ``d second / d params``: two passes, the first retaining."""
    a = torch.autograd.grad(first, params, retain_graph=True, allow_unused=True)
    b = torch.autograd.grad(second, params, allow_unused=True)
    return list(a), list(b)


def segmented_grads(
    first: Tensor,
    second: Tensor,
    params: Sequence[Tensor],
    segments: int,
    plan: SegmentPlan | None = None,
    min_bytes: float = 0.0,
) -> tuple[Grads, Grads]:
    """As :func:`two_pass_grads`, segment by segment so activations are freed early.

    Within each segment the first loss's pass retains the segment's graph and the second's frees
    it; the gradients reaching a cut are the cotangents the next segment starts from. ``plan``
    may come from :func:`plan_segments` run earlier on a node that every path from both losses
    to the parameters passes through (EATTA plans from the logits right after the forward pass,
    while an accelerator is still busy); by default the losses themselves are planned from. Falls
    back to :func:`two_pass_grads` when PyTorch cannot address graph edges (< 2.4) or the plan
    has no cut (see ``min_bytes`` in :func:`plan_segments`).
    """
    if not EDGES_SUPPORTED or segments < 2:
        return two_pass_grads(first, second, params)
    if plan is None:
        plan = plan_segments([first.grad_fn, second.grad_fn], params, segments, min_bytes)
    if not plan.cuts:
        return two_pass_grads(first, second, params)
    grads_a: Grads = [None] * len(params)
    grads_b: Grads = [None] * len(params)
    # what each pass starts from: its loss, then the cut edge above the segment
    out_a: list[Tensor] | list[GradientEdge] | None = [first]
    out_b: list[Tensor] | list[GradientEdge] | None = [second]
    cot_a: list[Tensor] | None = None
    cot_b: list[Tensor] | None = None
    last = plan.num_segments - 1
    for s in range(plan.num_segments):
        where = [i for i, seg in enumerate(plan.segment_of) if seg == s]
        # this segment's parameters and the cut below it: autograd.grad takes tensors and edges
        # mixed in one sequence, though its annotations accept a sequence of one kind only
        inputs: list[Tensor | GradientEdge] = [params[i] for i in where]
        if s < last:
            inputs.append(plan.cuts[s])
        if not inputs:
            continue
        res_a = res_b = None
        if out_a is not None:  # first: keep this segment's graph for the second pass
            res_a = torch.autograd.grad(
                out_a,
                inputs,  # type: ignore[arg-type]  # tensors and an edge mixed (see above)
                cot_a,
                retain_graph=True,
                allow_unused=True,
            )
        if out_b is not None:  # second: frees the segment's saved tensors as it goes
            res_b = torch.autograd.grad(
                out_b,
                inputs,  # type: ignore[arg-type]  # tensors and an edge mixed (see above)
                cot_b,
                allow_unused=True,
            )
        for j, i in enumerate(where):
            grads_a[i] = None if res_a is None else res_a[j]
            grads_b[i] = None if res_b is None else res_b[j]
        if s < last:
            edge = plan.cuts[s]
            ga = None if res_a is None else res_a[-1]
            gb = None if res_b is None else res_b[-1]
            out_a, cot_a = (None, None) if ga is None else ([edge], [ga])
            out_b, cot_b = (None, None) if gb is None else ([edge], [gb])
            if out_a is None and out_b is None:
                break
    return grads_a, grads_b


def batched_grads(first: Tensor, second: Tensor, params: Sequence[Tensor]) -> tuple[Grads, Grads]:
    """Both gradients from one vmapped backward pass (``is_grads_batched=True``)."""
    losses = torch.stack([first, second])
    eye = torch.eye(2, device=losses.device, dtype=losses.dtype)
    g = torch.autograd.grad(losses, params, eye, is_grads_batched=True, allow_unused=True)
    return [None if t is None else t[0] for t in g], [None if t is None else t[1] for t in g]


# -- strategies: which of the above a method uses -----------------------------------------------
_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def has_module_hooks(model: torch.nn.Module) -> bool:
    """Whether any forward/backward hook is registered on ``model``'s modules or globally."""
    registry = torch.nn.modules.module
    if any(getattr(registry, name, None) for name in _GLOBAL_HOOKS):
        return True
    return any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
        for m in model.modules()
    )


class GradientStrategy:
    """How ``∇first`` and ``∇second`` are computed; every strategy gives the same values.

    :meth:`plan` runs right after the forward pass (an accelerator is still busy then) on the
    node every path from both losses passes through; :meth:`grads` uses its plan, or None.
    """

    def plan(self, root: Tensor, params: Sequence[Tensor]) -> SegmentPlan | None:
        return None

    def grads(
        self,
        first: Tensor,
        second: Tensor,
        params: Sequence[Tensor],
        plan: SegmentPlan | None = None,
    ) -> tuple[Grads, Grads]:
        return two_pass_grads(first, second, params)


class TwoPass(GradientStrategy):
    """:func:`two_pass_grads`."""


class Batched(GradientStrategy):
    """:func:`batched_grads`."""

    def grads(
        self,
        first: Tensor,
        second: Tensor,
        params: Sequence[Tensor],
        plan: SegmentPlan | None = None,
    ) -> tuple[Grads, Grads]:
        return batched_grads(first, second, params)


class Segmented(GradientStrategy):
    """:func:`segmented_grads` with ``segments`` segments.

    ``auto``: only for graphs whose gradients total ``min_bytes`` or more, and plain two passes
    when ``model`` has module hooks: a gradient hook registered on a tensor at a cut point would
    run once when the segment above captures its gradient and again when the segment below
    starts from it.
    """

    def __init__(
        self, segments: int, min_bytes: float, *, auto: bool, model: torch.nn.Module | None
    ) -> None:
        self.segments = segments
        self.min_bytes = min_bytes if auto else 0.0
        self.auto = auto
        self.model = model

    @property
    def active(self) -> bool:
        """Whether gradients are computed segment by segment now (hooks can appear later)."""
        if not EDGES_SUPPORTED:
            return False
        return not (self.auto and self.model is not None and has_module_hooks(self.model))

    def plan(self, root: Tensor, params: Sequence[Tensor]) -> SegmentPlan | None:
        if not self.active or root.grad_fn is None:
            return None
        return plan_segments([root.grad_fn], params, self.segments, self.min_bytes)

    def grads(
        self,
        first: Tensor,
        second: Tensor,
        params: Sequence[Tensor],
        plan: SegmentPlan | None = None,
    ) -> tuple[Grads, Grads]:
        if plan is None and not self.active:
            return two_pass_grads(first, second, params)
        return segmented_grads(first, second, params, self.segments, plan, self.min_bytes)


# -- the gradient of the update --------------------------------------------------------------
def global_norm(grads: Sequence[Tensor | None]) -> Tensor:
    """``‖(g_1, ..., g_n)‖₂`` over the present gradients (fused per-tensor norms)."""
    present = [g for g in grads if g is not None]
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(present)))


def weighted_sum(a: Tensor, xs: list[Tensor], b: Tensor, ys: list[Tensor]) -> list[Tensor]:
    """``a·x_i + b·y_i`` for every pair, in two fused calls."""
    out = list(torch._foreach_mul(xs, a))
    torch._foreach_add_(out, torch._foreach_mul(ys, b))
    return out


def dense(grads: Sequence[Tensor | None], params: Sequence[nn.Parameter]) -> list[Tensor]:
    """Each parameter's gradient, zeros where a loss does not reach it."""
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=False)]


class ExactGradient:
    """The exact norms and weighted gradient (see the module docstring).

    ``train``: the updated parameters; ``measure``: those the two norms are measured over (the
    optimizer's, or e.g. all normalization layers for the reference preset); ``needs_norms``:
    whether the debiaser reads the norms (else its weights are 1, 1 and one pass suffices).
    """

    #: whether the norms are estimates (:class:`~eatta.gradients.approx.ApproxGradient`)
    approximate = False

    def __init__(
        self,
        strategy: GradientStrategy,
        train: Sequence[nn.Parameter],
        measure: Sequence[nn.Parameter],
        needs_norms: bool = True,
    ) -> None:
        self.strategy = strategy
        self.train = list(train)
        self.needs_norms = needs_norms
        train_ids = {id(p) for p in train}
        unique = list({id(p): p for p in measure}.values())
        measure_ids = {id(p) for p in unique}
        self.params = self.train + [p for p in unique if id(p) not in train_ids]
        self.measure_pos = [i for i, p in enumerate(self.params) if id(p) in measure_ids]
        #: whether the two norms already saw every gradient of the update (no extra check)
        self.covers_update = train_ids <= measure_ids
        self.measured = False  # whether the last norms were computed (else the debiaser's 1, 1)
        self.estimated = False  # whether the last norms were estimates
        self._sup: list[Tensor] = []
        self._unsup: list[Tensor] = []
        self._losses: tuple[Tensor, Tensor] | None = None

    def plan(self, o: Tensor) -> SegmentPlan | None:
        """Cut points below the logits ``o`` for the two passes (None: no plan needed)."""
        return self.strategy.plan(o, self.params) if self.needs_norms else None

    def entropy_only(self, loss_unsup: Tensor) -> list[Tensor]:
        """``∇L_unsup`` alone (a step without a label: weight 1)."""
        self.measured = self.estimated = False
        return dense(torch.autograd.grad(loss_unsup, self.train, allow_unused=True), self.train)

    def norms(
        self,
        loss_sup: Tensor,
        loss_unsup: Tensor,
        plan: SegmentPlan | None = None,
        features: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(‖∇L_sup‖₂, ‖∇L_unsup‖₂)`` over the measured parameters; zeros when the debiaser
        does not need them (its weights are then 1, 1)."""
        self.measured = self.estimated = False
        if not self.needs_norms:
            self._losses = (loss_sup, loss_unsup)
            zero = loss_sup.new_zeros(())
            return zero, zero
        self._losses = None
        gs, gu = self.strategy.grads(loss_sup, loss_unsup, self.params, plan)
        zero = loss_sup.new_zeros(())
        g_sup = global_norm([gs[i] for i in self.measure_pos] + [zero])
        g_unsup = global_norm([gu[i] for i in self.measure_pos] + [zero])
        self._sup, self._unsup = dense(gs, self.train), dense(gu, self.train)
        self.measured = True
        return g_sup, g_unsup

    def weighted(self, w_sup: Tensor, w_unsup: Tensor) -> list[Tensor]:
        """``γ_sup·∇L_sup + γ_unsup·∇L_unsup`` for the updated parameters."""
        if self._losses is not None:  # weights 1, 1: the sum's gradient in one pass
            loss_sup, loss_unsup = self._losses
            self._losses = None
            g = torch.autograd.grad(loss_sup + loss_unsup, self.train, allow_unused=True)
            return dense(g, self.train)
        sup, unsup = self._sup, self._unsup
        self._sup, self._unsup = [], []
        return weighted_sum(w_sup, sup, w_unsup, unsup)

    def finite(
        self,
        grads: list[Tensor],
        weights: tuple[Tensor, Tensor] | None,
        norms: tuple[Tensor, Tensor],
    ) -> Tensor:
        """A 0-d flag on the device: whether the update (and its weights) is finite, read from
        the norms when they saw every gradient (no extra reduction)."""
        if weights is not None and (self.measured or self.estimated):
            if self.covers_update:  # the norms already saw every gradient
                return torch.isfinite(norms[0] + norms[1] + weights[0] + weights[1])
            return torch.isfinite(global_norm(grads) + weights[0] + weights[1])
        return torch.isfinite(global_norm(grads))
