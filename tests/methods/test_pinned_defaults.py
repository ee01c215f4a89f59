"""The effective default settings of every method on every dataset key, pinned.

``pinned_defaults.json`` was captured from the registry before the hyperparameters became typed
configs (``PYTHONPATH=src:tests python tests/methods/test_pinned_defaults.py``, its output saved
as ``pinned_defaults.json``, on that code); a change of any default lr, optimizer, momentum,
trained parameter set or method setting shows up here as a difference. Re-captured once after
the step refactor moved ``grad_mode`` / ``autocast`` / ``channels_last`` into ``EATTA.options``
(checked value for value against the first capture; nothing else differed), now with public
attributes only. Re-captured after the assembly rework (issue 60): every difference was a moved
attribute with its value unchanged (``options.*`` -> ``autocast``, ``channels_last``,
``grad_mode``; ``gradients.*`` -> ``gradient.strategy.*``; ``buffer``/``late_labels``/
``nearest_replay`` -> ``replay``; eatta-safe's ``fallback.draw`` -> its ``selector``; the
debiaser's bounds, 0 and 2 for the faithful one), or a new attribute (``asking``, ``batch``,
``gradient``'s flags, SimATTA's ``use_teacher``). Re-captured when every method took
``autocast`` and ``channels_last`` and the budget counted what was asked and answered (issue 66):
the only differences were those attributes added, ``autocast`` and ``channels_last`` False on the
70 method/dataset rows that lacked them, the budget's ``asked`` and ``answered`` 0 on the 49 rows
of the active methods.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from conftest import confident_cnn, image_batches
from eatta.annotate.oracle import GroundTruthOracle
from eatta.methods import registry
from eatta.methods.base import AdaptiveMethod

PINNED = Path(__file__).with_name("pinned_defaults.json")
DATASET_KEYS = ("default", *registry.DATASETS)
_SIMPLE = (bool, int, float, str, type(None))


def _plain(v: Any) -> Any:
    if isinstance(v, _SIMPLE):
        return v
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return f"<{type(v).__name__}>"


def _settings(obj: Any, depth: int = 0) -> dict[str, Any]:
    """Plain-valued attributes of ``obj`` and of its parameter-free components (2 levels)."""
    items = dict(vars(obj))
    if isinstance(obj, AdaptiveMethod):  # the parts (properties over private attributes)
        items.update(fallback=obj.fallback, monitor=obj.monitor)
    if isinstance(obj, nn.Module):
        items.update(obj._modules)
    out: dict[str, Any] = {}
    for k, v in sorted(items.items()):
        if k in ("training", "model") or k.startswith("_"):  # private: implementation detail
            continue
        if isinstance(v, _SIMPLE):
            out[k] = v
        elif isinstance(v, tuple) and all(isinstance(x, _SIMPLE) for x in v):
            out[k] = list(v)
        elif (
            depth < 2
            and hasattr(v, "__dict__")
            and not isinstance(v, torch.Tensor | torch.optim.Optimizer | torch.Generator)
            and not (isinstance(v, nn.Module) and any(True for _ in v.parameters()))
        ):
            sub = _settings(v, depth + 1)
            if sub:
                out[k] = {"__type__": type(v).__name__, **sub}
    return out


def effective(name: str, dataset: str) -> dict[str, Any]:
    """What ``create(name, model, dataset=dataset)`` builds: optimizer, trained set, settings."""
    model = confident_cnn()
    kw: dict[str, Any] = {}
    if registry.get_spec(name).active:
        kw["oracle"] = GroundTruthOracle()
    if name == "eata":
        kw["fisher_data"] = image_batches(2)
    m = registry.create(name, model, dataset=dataset, **kw)
    entry: dict[str, Any] = {}
    opt = m.optimizer
    if opt is not None:
        entry["optimizer"] = type(opt).__name__
        if hasattr(opt, "base_optimizer"):
            entry["base_optimizer"] = type(opt.base_optimizer).__name__
        entry["groups"] = [
            {k: _plain(v) for k, v in sorted(g.items()) if k != "params"}
            | {"n_params": len(g["params"])}
            for g in opt.param_groups
        ]
    entry["trainable"] = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    entry["attrs"] = _settings(m)
    return entry


def _cases() -> list[str]:
    return sorted(json.loads(PINNED.read_text()))


@pytest.mark.parametrize("case", _cases())
def test_defaults_unchanged(case):
    name, dataset = case.split("/")
    assert effective(name, dataset) == json.loads(PINNED.read_text())[case]


def test_every_method_and_dataset_is_pinned():
    assert {c.split("/")[0] for c in _cases()} == set(registry.available())
    assert {c.split("/")[1] for c in _cases()} == set(DATASET_KEYS)


if __name__ == "__main__":  # regenerate (only when a default is meant to change)
    rows = {f"{n}/{d}": effective(n, d) for n in registry.available() for d in DATASET_KEYS}
    print("{")
    print(",\n".join(f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in rows.items()))
    print("}")
