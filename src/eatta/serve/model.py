"""The model a server serves: ``--model pkg.module:factory``, and the packaged demo.

A factory is a callable without arguments returning the ``nn.Module`` (its weights loaded, as
the user trained it). :func:`digits` is the demo: the packaged digits CNN of the embedded
benchmark (``eatta.models.digits_cnn.packaged_digits_source``: input ``[N, 3, 32, 32]`` in
``[0, 1]``, 10 classes), so ``eatta-serve --state DIR`` runs with nothing else.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from eatta.console import UsageError

__all__ = ["DEMO", "DEMO_SHAPE", "digits", "load_model", "num_classes"]

#: The default ``--model``: the packaged digits CNN.
DEMO = "eatta.serve.model:digits"
#: The demo's input, one sample: ``C, H, W``.
DEMO_SHAPE = (3, 32, 32)


def digits() -> nn.Module:
    """The packaged digits CNN (``packaged_digits_source`` returns the model and its report;
    this gives the model alone, in eval mode)."""
    from eatta.models.digits_cnn import packaged_digits_source

    model, _ = packaged_digits_source()
    return model


def _factory(spec: str) -> Callable[[], object]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            f"--model {spec!r}: give pkg.module:factory (a callable returning the model)"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and module_name.startswith(err.name):
            raise UsageError(f"--model {spec!r}: no module {err.name!r}") from None
        raise
    found: object = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise UsageError(f"--model {spec!r}: {module_name} has no {attr!r}")
        found = getattr(found, part)
    if not callable(found):
        raise UsageError(f"--model {spec!r}: {attr} is not callable")
    return found


def load_model(spec: str) -> nn.Module:
    """The module ``spec`` (``pkg.module:factory``) returns; a :class:`UsageError` when the
    factory cannot be found or does not return an ``nn.Module``."""
    model = _factory(spec)()
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"--model {spec!r} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


@torch.no_grad()
def num_classes(model: nn.Module, sample_shape: tuple[int, ...], device: torch.device) -> int:
    """The classes ``model`` predicts, from one forward of two zero samples in eval mode (the
    model's modes are put back); a :class:`UsageError` when it does not take ``sample_shape``
    or does not return ``[N, K]`` logits."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        out = model(torch.zeros(2, *sample_shape, device=device))
    except RuntimeError as err:
        raise UsageError(
            f"the model does not take inputs of shape [N, {', '.join(map(str, sample_shape))}] "
            f"(--input-shape): {err}"
        ) from None
    finally:
        for m, mode in modes.items():
            m.train(mode)
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UsageError(f"the model must return [N, K] logits; it returned {shape}")
    return int(out.shape[1])
