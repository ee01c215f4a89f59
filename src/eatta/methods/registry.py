"""Methods by name, with typed hyperparameters and per-dataset defaults (method.md §5).

``create("eatta", model, dataset="imagenet-c", oracle=..., budget=1)`` validates the keyword
overrides against the method's config class (:mod:`eatta.methods.config`), then configures the
model, builds the optimizer and returns the method. Keys are strict: an unknown key or a value of
the wrong type raises :class:`TypeError` (a disallowed value :class:`ValueError`) naming the key
and the method's known keys, before the model is touched; :func:`describe` lists them. Values
come from, in increasing priority: the config class's defaults, the dataset's row of
:data:`eatta.methods.presets.DATASET_PRESETS`, and the caller's overrides. The benchmark CLI
lists and builds methods only through this registry.

Registration is eager and acyclic: this module imports no method; each method's module calls
:func:`register` at its bottom, and :mod:`eatta.methods` imports every method module, so the
table is complete once ``eatta`` is imported (Python runs ``eatta.methods`` before any of its
submodules, this one included).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.given import undone_on_error
from eatta.methods.base import AdaptiveMethod, Parts, check_parts
from eatta.methods.config import MethodConfig, OptimizerConfig, check_keys, type_name
from eatta.methods.presets import DATASETS

__all__ = [
    "DATASETS",
    "MethodSpec",
    "available",
    "create",
    "describe",
    "get_spec",
    "make_optimizer",
    "merge_overrides",
    "register",
]

#: ``build(model, config, oracle, budget, **parts)``: the method around ``model``, with the
#: parts (:class:`~eatta.methods.base.Parts`) given to its constructor.
Builder = Callable[..., AdaptiveMethod]


@dataclass
class MethodSpec:
    """How to build one method.

    ``build(model, config, oracle, budget, **parts)`` returns the method; ``config`` is an
    instance of ``config`` (the method's :class:`MethodConfig` subclass: every key it accepts,
    with types and defaults), already validated and merged with the dataset's row of
    ``datasets`` and the caller's overrides; ``parts`` go to the method's constructor as they
    are. ``active`` methods need an oracle. The other fields are what a harness must know of the
    method (:mod:`eatta.bench` reads them, never a method's name).
    """

    name: str
    build: Builder
    active: bool = False
    config: type[MethodConfig] = MethodConfig
    datasets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    summary: str = ""
    #: whether the method adapts (False: its predictions do not depend on the stream)
    adapts: bool = True
    #: what it needs that no key gives, the harness's to provide (``"fisher_data"``)
    needs: tuple[str, ...] = ()
    #: whether it builds its own fallback (no other may be given; its answers measure)
    builds_fallback: bool = False
    #: whether every optimizer step asks anew (its ``steps`` key multiplies the labels a batch)
    labels_each_step: bool = False

    def __post_init__(self) -> None:
        for dataset, row in self.datasets.items():  # a typo in a table fails at registration
            if dataset not in DATASETS:
                raise ValueError(
                    f"method {self.name!r}: unknown dataset key {dataset!r} in its presets; "
                    f"known: {', '.join(DATASETS)}"
                )
            self.config.validate(row, method=f"{self.name} ({dataset} preset)")

    @property
    def keys(self) -> tuple[str, ...]:
        """The hyperparameters the method accepts."""
        return self.config.keys()

    def config_for(self, dataset: str, overrides: Mapping[str, Any]) -> MethodConfig:
        """The validated config for ``dataset`` (a key of :data:`DATASETS` or ``"default"``)."""
        if dataset != "default" and dataset not in DATASETS:
            raise ValueError(
                f"unknown dataset key {dataset!r}; use 'default' or one of {', '.join(DATASETS)}"
            )
        checked = self.config.validate(overrides, method=self.name)
        return self.config.from_dict(
            {**self.datasets.get(dataset, {}), **checked}, method=self.name
        )

    def hparams(self, dataset: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Every key and its effective value for ``dataset`` with ``overrides`` (validated)."""
        return self.config_for(dataset, overrides).to_dict()


_REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method (its name, lower-case, must be new); called at the bottom of its module."""
    key = spec.name.lower()
    if key in _REGISTRY:
        raise ValueError(f"method {spec.name!r} is already registered")
    _REGISTRY[key] = spec
    return spec


def get_spec(name: str) -> MethodSpec:
    """The registered method ``name`` (case-insensitive); :class:`KeyError` if there is none."""
    try:
        return _REGISTRY[name.lower()]
    except (KeyError, AttributeError):
        near = difflib.get_close_matches(str(name).lower().replace("_", "-"), available(), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise KeyError(
            f"unknown method {name!r}; {hint}available: {', '.join(available())}"
        ) from None


def available() -> list[str]:
    """Registered method names."""
    return sorted(_REGISTRY)


def describe(name: str) -> str:
    """The keys of method ``name``: type, default, per-dataset values and meaning, one a line."""
    spec = get_spec(name)
    types, defaults, docs = spec.config.types(), spec.config.defaults(), spec.config.docs()
    lines = [f"{spec.name}{' (active: needs oracle=)' if spec.active else ''}: {spec.summary}"]
    for key in spec.keys:
        per_dataset = [f"{d}: {_short(row[key])}" for d, row in spec.datasets.items() if key in row]
        where = f" [{', '.join(per_dataset)}]" if per_dataset else ""
        lines.append(
            f"  {key}: {type_name(types[key])} = {_short(defaults.get(key))}{where}  {docs[key]}"
        )
    return "\n".join(lines)


def _short(value: Any) -> str:
    return getattr(value, "__name__", None) or repr(value)


def _refuse_label_arguments(
    spec: MethodSpec, oracle: object, budget: object, overrides: Mapping[str, Any]
) -> None:
    """A TypeError when the label-free method ``spec`` is given what only active methods take:
    ``oracle``, ``budget``, or a key every active method has and no label-free one has."""
    specs = [get_spec(n) for n in available()]
    active = [s for s in specs if s.active]
    free_keys = {k for s in specs if not s.active for k in s.keys}
    label_keys = set.intersection(*(set(s.keys) for s in active)) - free_keys if active else set()
    given = [k for k, v in (("oracle", oracle), ("budget", budget)) if v is not None]
    given += [k for k in overrides if k in label_keys]
    if given:
        raise TypeError(
            f"method {spec.name!r} is label-free (it never asks for labels) and takes no "
            f"{', '.join(given)}; the methods that take labels are "
            f"{', '.join(s.name for s in active)}"
        )


def create(
    name: str,
    model: nn.Module,
    *,
    dataset: str = "default",
    oracle: Oracle | None = None,
    budget: int | Budget | None = None,
    **keywords: Any,
) -> AdaptiveMethod:
    """Build method ``name`` around ``model`` with the dataset's defaults and the overrides.

    ``name`` is one of :func:`available` (``eatta.available()``: ``baseline``, ``cema``,
    ``cotta``, ``eata``, ``eatta``, ``eatta-safe``, ``eatta-stable``, ``eta``, ``hiltta``,
    ``rdumb``, ``sar``, ``simatta``, ``source``, ``tent``); :func:`describe` lists its keys.

    What wrapping does to ``model``: it is changed in place and becomes the method's
    ``method.model``: eval mode except BatchNorm, which normalizes with the batch's statistics
    (its running statistics kept, unused), ``requires_grad`` on the adapted parameters only,
    and, with ``window=``, BatchNorm layers swapped for MixedBatchNorm. Its values change only
    as the method adapts; ``method.reset()`` restores them, and ``method.unwrap()`` gives the
    model back exactly as it was given. Pass ``copy.deepcopy(model)`` to keep yours untouched.

    ``dataset`` picks a row of per-dataset defaults (``"default"`` or one of :data:`DATASETS`).
    The other keywords are the method's hyperparameters (:func:`describe`) and its parts, the
    keywords every method's constructor takes too (:class:`~eatta.methods.base.Parts`:
    ``window`` with ``window_every``, ``window_refresh``, ``window_momentum``;
    ``weight_anchor``; ``fallback``; ``monitor``). Everything is checked first: an unknown key
    or a mistyped value raises :class:`TypeError`, a disallowed value :class:`ValueError`, with
    ``model`` untouched; if building fails later, every change to ``model`` is undone.

    ``oracle`` and ``budget`` (default 1 label per batch) are for active methods; a label-free
    method given either, or a key that only the label-taking methods have (``buffer``,
    ``label_expiry``), raises :class:`TypeError` naming the method and the label-taking ones.
    """
    spec = get_spec(name)
    parts: dict[str, Any] = {k: v for k, v in keywords.items() if k in Parts.__annotations__}
    overrides = {k: v for k, v in keywords.items() if k not in parts}
    if not spec.active:
        _refuse_label_arguments(spec, oracle, budget, overrides)
    check_keys(
        spec.name,
        overrides,
        spec.keys,
        also=("dataset", "oracle", "budget", *Parts.__annotations__),
    )
    if spec.active and oracle is None:
        raise ValueError(f"method {spec.name!r} is active: pass oracle=")
    check_parts(parts)  # the parts' own checks, before the model is touched
    config = spec.config_for(dataset, overrides)
    budget = Budget.coerce(1 if budget is None else budget)
    with undone_on_error(model):
        if spec.active:
            return spec.build(model, config, oracle, budget, **parts)
        return spec.build(model, config, None, budget, **parts)


def merge_overrides(
    methods: Iterable[str],
    common: Mapping[str, Any],
    per_method: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Validated overrides per method from keys for all methods and keys for one method.

    A key of ``common`` applies to each method of ``methods`` that declares it and is an error
    (:class:`TypeError`) only if none does; a method's own keys win over ``common``. Every value
    is checked against the type of each method it applies to.
    """
    methods = list(methods)
    specs = {m: get_spec(m) for m in methods}
    for key in common:
        if not any(key in s.keys for s in specs.values()):
            union = sorted({k for s in specs.values() for k in s.keys})
            names = ", ".join(methods)
            check_keys(
                names, [key], union, subject=f"none of the methods {names} has", whose="their"
            )
    out: dict[str, dict[str, Any]] = {}
    for m, spec in specs.items():
        mine = {k: v for k, v in common.items() if k in spec.keys}
        mine.update(per_method.get(m, {}))
        out[m] = spec.config.validate(mine, method=spec.name)
    return out


def make_optimizer(
    params: Iterable[nn.Parameter], hp: OptimizerConfig | Mapping[str, Any]
) -> torch.optim.Optimizer:
    """SGD or Adam from a config's ``optimizer``, ``lr``, ``momentum``, ``nesterov``,
    ``weight_decay`` (``betas`` for Adam); a mapping is read for those keys only."""
    if not isinstance(hp, OptimizerConfig):
        own = OptimizerConfig.keys()
        hp = OptimizerConfig.from_dict(
            {k: v for k, v in hp.items() if k in own}, method="optimizer"
        )
    assert isinstance(hp, OptimizerConfig)
    params = list(params)
    if hp.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=hp.lr,
            momentum=hp.momentum,
            nesterov=hp.nesterov,
            weight_decay=hp.weight_decay,
        )
    return torch.optim.Adam(
        params, lr=hp.lr, betas=(hp.betas[0], hp.betas[1]), weight_decay=hp.weight_decay
    )


def entropy_margin(num_classes: int, factor: float = 0.4) -> float:
    """``factor · ln C``."""
    return factor * math.log(num_classes)
