"""Put a model into test-time-adaptation mode and choose its trainable parameters.

The whole model goes into eval mode, every BatchNorm normalizes with the statistics of the current
batch, and only the chosen parameters stay trainable (docs/method.md §1). The BatchNorm part is
TENT's (``configure_model`` in its public ``tent.py``); the mode is not: TENT calls
``model.train()``, so dropout and stochastic depth stay active during its adaptation, while here
they are off (eval mode). For a model without dropout or stochastic depth the two agree.

The model is changed in place, and only in its modes: every BatchNorm layer is put in training
mode with ``track_running_stats=False`` (it normalizes with the batch's statistics and never
updates its running statistics, which stay in its ``state_dict()`` with their values); the other
modules go to eval mode; ``requires_grad`` is set on the chosen parameters only. The model as it
was is recorded first (:mod:`eatta.given`): a method's ``unwrap()`` gives it back bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

from eatta.given import record

__all__ = [
    "NORM_TYPES",
    "ParamFilter",
    "batch_statistics_of",
    "collect_params",
    "configure",
    "configure_model",
    "norm_params",
    "reference_params",
]

#: Normalization layers whose affine parameters are adapted by default.
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm,
)

#: A callable choosing parameters: ``(qualified_name, module, param_name) -> bool``.
ParamFilter = Callable[[str, nn.Module, str], bool]


def configure_model(model: nn.Module) -> nn.Module:
    """Eval mode everywhere but BatchNorm, which normalizes with the batch's statistics (training
    mode, ``track_running_stats=False``: its running statistics are kept, unused and unchanged);
    in place, the model as given recorded first; returns ``model``."""
    record(model)
    model.eval()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train()
            module.track_running_stats = False
    return model


@contextmanager
def batch_statistics_of(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within (when ``enabled``), every BatchNorm of ``model`` normalizes with the statistics of
    its input, as :func:`configure_model` sets it, its running statistics unused and unchanged;
    the modes are restored after (e.g. a frozen model as given, evaluated like a configured
    one)."""
    layers = [
        (m, m.training, m.track_running_stats)
        for m in (model.modules() if enabled else ())
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    for m, _, _ in layers:
        m.train()
        m.track_running_stats = False
    try:
        yield
    finally:
        for m, training, track in layers:
            m.training, m.track_running_stats = training, track


def _named_selected(model: nn.Module, keep: ParamFilter) -> list[tuple[str, nn.Parameter]]:
    chosen: list[tuple[str, nn.Parameter]] = []
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            if id(p) in seen or not keep(mod_name, module, p_name):
                continue
            seen.add(id(p))
            chosen.append((f"{mod_name}.{p_name}" if mod_name else p_name, p))
    return chosen


def _is_norm_affine(mod_name: str, module: nn.Module, p_name: str) -> bool:
    return isinstance(module, NORM_TYPES) and p_name in ("weight", "bias")


def norm_params(model: nn.Module) -> tuple[list[nn.Parameter], list[str]]:
    """Affine weight and bias of every BatchNorm / LayerNorm / GroupNorm / InstanceNorm."""
    named = _named_selected(model, _is_norm_affine)
    return [p for _, p in named], [n for n, _ in named]


def _in(prefix: str, name: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _reference_filter(mod_name: str, module: nn.Module, p_name: str) -> bool:
    if _in("layer1", mod_name) or _in("model.layer1", mod_name):
        return True
    if _in("layer4", mod_name) or _in("model.layer4", mod_name):
        return False
    return _is_norm_affine(mod_name, module, p_name)


def reference_params(model: nn.Module) -> tuple[list[nn.Parameter], list[str]]:
    """The authors' ImageNet choice (method.md §4).

    Norm affine parameters outside ``layer4`` plus every parameter of modules under ``layer1``
    (convolution weights too), each parameter once. Only meaningful for ResNet-style models.
    """
    if not any(_in("layer1", n) or _in("model.layer1", n) for n, _ in model.named_modules()):
        raise ValueError(
            "the 'reference' preset selects parameters under 'layer1' and outside 'layer4' "
            "(ResNet naming); this model has no 'layer1' module"
        )
    named = _named_selected(model, _reference_filter)
    return [p for _, p in named], [n for n, _ in named]


def _all_params(model: nn.Module) -> tuple[list[nn.Parameter], list[str]]:
    named = _named_selected(model, lambda *_: True)
    return [p for _, p in named], [n for n, _ in named]


_PRESETS: dict[str, Callable[[nn.Module], tuple[list[nn.Parameter], list[str]]]] = {
    "norm": norm_params,
    "reference": reference_params,
    "all": _all_params,
}


def collect_params(
    model: nn.Module, select: str | ParamFilter = "norm"
) -> tuple[list[nn.Parameter], list[str]]:
    """Parameters to adapt and their qualified names, by preset name or filter callable.

    Presets: ``"norm"`` (default; affine parameters of normalization layers), ``"reference"``
    (the authors' ImageNet set, docs/method.md §4) and ``"all"``. A callable receives
    ``(module_name, module, param_name)`` and returns whether to adapt that parameter.
    """
    if callable(select):
        named = _named_selected(model, select)
        params, names = [p for _, p in named], [n for n, _ in named]
    elif select in _PRESETS:
        params, names = _PRESETS[select](model)
    else:
        raise ValueError(f"unknown parameter preset {select!r}; choose one of {sorted(_PRESETS)}")
    if not params:
        hint = (
            " (it has no normalization layer with affine parameters: pass params='all' or a "
            "callable choosing the parameters to adapt)"
            if select == "norm"
            else ""
        )
        raise ValueError(
            f"parameter selection {select!r} matched no parameter of {type(model).__name__}{hint}"
        )
    return params, names


def configure(model: nn.Module, select: str | ParamFilter = "norm") -> list[nn.Parameter]:
    """Configure ``model`` for adaptation in place and return the parameters to optimize.

    Eval mode, BatchNorm on batch statistics, ``requires_grad`` only for the selection
    (see :func:`collect_params`); what it was is recorded (:mod:`eatta.given`).
    """
    params, _ = collect_params(model, select)
    record(model)
    configure_model(model)
    model.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    return params
