"""How EATTA's update gradient is computed: one object, chosen once (``grad_mode``).

- :mod:`eatta.gradients.exact`: :class:`ExactGradient`, both gradients by two backward passes
  (two-pass, segmented or batched: every ``grad_mode`` but ``"approx"``, the same numbers at
  different memory and speed), their exact norms, the weighted sum;
- :mod:`eatta.gradients.approx`: :class:`ApproxGradient` (``grad_mode="approx"``), the norms
  estimated cheaply, then one backward pass on the weighted sum (``docs/approx-step.md``);

:func:`make_gradient` builds the one for a ``grad_mode``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, get_args

from torch import nn

from eatta.gradients.approx import ApproxGradient, NormCalibration, ProxyName, check_proxy
from eatta.gradients.exact import Batched, ExactGradient, Segmented, TwoPass
from eatta.split import SplitNotFoundError

__all__ = [
    "GRAD_MODES",
    "ApproxGradient",
    "ExactGradient",
    "GradMode",
    "check_gradient",
    "make_gradient",
]

#: How the two gradients are computed.
GradMode = Literal["auto", "two-pass", "segmented", "batched", "approx"]
GRAD_MODES: tuple[str, ...] = get_args(GradMode)


def check_gradient(
    mode: object,
    proxy: object = "auto",
    refresh: object = None,
    segments: int = 4,
    segment_min_bytes: int = 32 * 2**20,
) -> None:
    """A clear error for options :func:`make_gradient` would refuse, before anything changes."""
    if mode not in GRAD_MODES:
        raise ValueError(f"grad_mode must be one of {GRAD_MODES}, got {mode!r}")
    check_proxy(proxy)  # type: ignore[arg-type]  # checked here
    NormCalibration(refresh)  # type: ignore[arg-type]  # checks the period
    if segments < 1 or segment_min_bytes < 0:
        raise ValueError(
            "grad_segments must be >= 1 and segment_min_bytes >= 0, got "
            f"{segments}, {segment_min_bytes}"
        )


def make_gradient(
    mode: GradMode,
    model: nn.Module,
    train: Sequence[nn.Parameter],
    measure: Sequence[nn.Parameter],
    *,
    needs_norms: bool = True,
    proxy: ProxyName = "auto",
    refresh: int | None = None,
    backbone: Callable[[], nn.Module] | None = None,
    segments: int = 4,
    segment_min_bytes: int = 32 * 2**20,
) -> ExactGradient:
    """The gradient for ``mode``:

    - ``"segmented"``: the two backward passes run segment by segment between cut points of the
      graph, as fast as ``"two-pass"`` with about TENT's peak memory (a gradient hook on a
      tensor at a cut point runs twice per pass);
    - ``"two-pass"``: one pass retaining the whole graph, then one freeing it (+14-19 % peak
      memory over TENT on ResNets);
    - ``"batched"``: one vmapped pass (``is_grads_batched``); low memory, slower in PyTorch 2.13;
    - ``"auto"``: ``"segmented"``, or ``"two-pass"`` when the model has module hooks or its
      graph's gradients total less than ``segment_min_bytes`` (digits-C CNN: 12 MiB);
    - ``"approx"``: not exact: ONE backward pass on ``γ_sup·L_sup + γ_unsup·L_unsup``, the
      weights from norms estimated at ``proxy`` (``backbone()`` gives the split's feature
      extractor, where ``"last-norm"`` is looked for), exact every ``refresh`` steps (as
      ``"auto"``; None: never).

    ``train``: the updated parameters; ``measure``: those the norms are measured over;
    ``needs_norms``: whether the debiaser reads them.
    """
    check_gradient(mode, proxy, refresh, segments, segment_min_bytes)
    calibration = NormCalibration(refresh) if mode == "approx" else None
    if mode == "two-pass":
        strategy: TwoPass | Batched | Segmented = TwoPass()
    elif mode == "batched":
        strategy = Batched()
    else:  # approx: its exact refresh steps run as auto
        auto = mode in ("auto", "approx")
        strategy = Segmented(segments, segment_min_bytes, auto=auto, model=model)
    if calibration is None:
        return ExactGradient(strategy, train, measure, needs_norms)
    if backbone is None:
        raise TypeError("grad_mode='approx' needs backbone= (the split's feature extractor)")
    gradient = ApproxGradient(strategy, train, measure, needs_norms, proxy, calibration, backbone)
    if proxy != "head":  # found now where the split is known without a batch (an early error)
        try:
            gradient.find_proxy()
        except SplitNotFoundError:
            pass  # the split, and the proxy with it, are found on the first batch
    return gradient
