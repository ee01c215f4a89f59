"""Typed, validated hyperparameters of the registered methods.

Every registered method declares the keys it accepts as a frozen dataclass deriving from
:class:`MethodConfig`: each field is one key, with its type (the annotation), its default (the
method's ``"default"`` row) and a one-line description (:func:`hparam`). What differs per dataset
lives in one table, :data:`eatta.methods.presets.DATASET_PRESETS`. ``create()`` and
``eatta-bench --hp`` check the caller's keys and values against the dataclass before anything is
built or the model is touched:

* an unknown key, or a value of the wrong type, raises :class:`TypeError` (as Python does for an
  unexpected or mistyped keyword argument), naming the key, the method and the known keys (with a
  close match: ``did you mean 'lr'?``);
* a value of the right type that is not allowed (not one of the listed choices, below a minimum)
  raises :class:`ValueError` naming the key.

An ``int`` is accepted where a ``float`` is declared (and converted), a list where a tuple is
declared; a ``bool`` is never taken for a number.
"""

from __future__ import annotations

import collections.abc
import difflib
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

from torch import nn
from typing_extensions import Self

from eatta.annotate.asking import DEFAULT_LABEL_EXPIRY
from eatta.configure import ParamFilter
from eatta.split import ModelSplit

__all__ = [
    "ActiveConfig",
    "MethodConfig",
    "OptimizerConfig",
    "ParamSelection",
    "check_keys",
    "hparam",
    "type_name",
]

#: Parameters to adapt: a preset of :func:`eatta.configure` or a filter callable.
ParamSelection = Literal["norm", "reference", "all"] | ParamFilter


def hparam(default: Any, doc: str, *, min: float | None = None, max: float | None = None) -> Any:
    """A config field: its default, a one-line description and optional inclusive bounds."""
    return field(default=default, metadata={"doc": doc, "min": min, "max": max})


def type_name(tp: Any) -> str:
    """A type annotation as error messages and :func:`~eatta.methods.registry.describe` show it."""
    if tp is Any:
        return "any"
    if tp is type(None):
        return "None"
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp))
    if origin is collections.abc.Callable or tp is Callable:
        return "callable"
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else type_name(a) for a in get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


_NO = object()  # "does not match"


def _convert(value: Any, tp: Any) -> Any:
    """``value`` as an instance of ``tp`` (int -> float, list -> tuple), or ``_NO``."""
    if tp is Any:
        return value
    if tp is type(None):
        return value if value is None else _NO
    origin = get_origin(tp)
    if origin is Literal:
        ok = any(type(value) is type(a) and value == a for a in get_args(tp))
        return value if ok else _NO
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):  # exact matches first, so 1 stays an int in ``int | float``
            if get_origin(arg) is None and isinstance(arg, type) and type(value) is arg:
                return value
        for arg in get_args(tp):
            out = _convert(value, arg)
            if out is not _NO:
                return out
        return _NO
    if tp is bool:
        return value if isinstance(value, bool) else _NO
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return _NO
        return float(value)
    if origin is collections.abc.Callable or tp is Callable:
        return value if callable(value) else _NO
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return _NO
        args = get_args(tp)
        if not args:
            return tuple(value)
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        if len(args) != len(value):
            return _NO
        items = [_convert(v, a) for v, a in zip(value, args, strict=True)]
        if any(i is _NO for i in items):
            return _NO
        return tuple(items)
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, Mapping):
            return _NO
        args = get_args(tp) or (Any, Any)
        for k, v in value.items():
            if _convert(k, args[0]) is _NO or _convert(v, args[1]) is _NO:
                return _NO
        return value
    if origin is not None:  # Iterable[...], Sequence[...]: the container kind only
        return value if isinstance(value, origin) else _NO
    if isinstance(tp, type):
        return value if isinstance(value, tp) else _NO
    return value


def _describe_value(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def check_keys(
    method: str,
    given: Iterable[str],
    known: Iterable[str],
    *,
    subject: str = "",
    whose: str = "its",
    also: Iterable[str] = (),
) -> None:
    """Raise :class:`TypeError` naming every key of ``given`` that is not in ``known``.

    The message starts with ``subject`` (default ``"method 'NAME' has no"``), names each unknown
    key with its closest known key (or closest name of ``also``, e.g. a function's own
    arguments), and lists the known keys (``whose`` keys).
    """
    known = sorted(known)
    unknown = [k for k in given if k not in known]
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, [*known, *also], n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    noun = "hyperparameter" if len(unknown) == 1 else "hyperparameters"
    subject = subject or f"method {method!r} has no"
    raise TypeError(
        f"{subject} {noun} {', '.join(hints)}; "
        f"{whose} keys are: {', '.join(known) if known else '(none)'}"
    )


@dataclass(frozen=True)
class MethodConfig:
    """Base of every method's hyperparameters; the keys every method accepts.

    Subclasses are frozen dataclasses whose fields (made with :func:`hparam`) are the method's
    keys. Build one with :meth:`from_dict`, which validates.
    """

    split: ModelSplit | tuple[nn.Module, nn.Module] | None = hparam(
        None, "(backbone, head) for models whose split is not found automatically"
    )
    check_finite: bool = hparam(True, "refuse batches with NaN or infinite values")
    autocast: bool = hparam(
        False, "bf16 autocast of the model's forward passes (the feature extractor, if split)"
    )
    channels_last: bool = hparam(False, "channels-last memory format (model and batches)")

    #: The keys every method's constructor takes as they are (``eatta.methods.base.Options``).
    OPTIONS: ClassVar[tuple[str, ...]] = ("split", "check_finite", "autocast", "channels_last")

    #: Keys another key expands into (``{key: {value: {key: value, ...}}}``), e.g. a preset.
    EXPANSIONS: ClassVar[Mapping[str, Mapping[Any, Mapping[str, Any]]]] = {}

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The accepted keys, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def types(cls) -> dict[str, Any]:
        """Each key's declared type."""
        hints = get_type_hints(cls)
        return {k: hints[k] for k in cls.keys()}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each key's default (the method's values when no dataset row applies)."""
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Each key's one-line description."""
        return {f.name: f.metadata.get("doc", "") for f in fields(cls)}

    @classmethod
    def validate(cls, values: Mapping[str, Any], *, method: str = "") -> dict[str, Any]:
        """``values`` checked against the declared keys, types and bounds (a converted copy).

        Raises :class:`TypeError` for an unknown key or a value of the wrong type and
        :class:`ValueError` for a value outside the allowed choices or bounds.
        """
        method = method or cls.__name__
        check_keys(method, values, cls.keys())
        types_ = cls.types()
        bounds = {f.name: f.metadata for f in fields(cls)}
        out: dict[str, Any] = {}
        for key, value in values.items():
            tp = types_[key]
            converted = _convert(value, tp)
            if converted is _NO:
                choices = _literal_choices(tp)
                if isinstance(value, str) and choices and all(isinstance(c, str) for c in choices):
                    raise ValueError(
                        f"hyperparameter {key!r} of method {method!r} must be one of "
                        f"{', '.join(map(repr, choices))}; got {value!r}"
                    )
                raise TypeError(
                    f"hyperparameter {key!r} of method {method!r} must be {type_name(tp)}; "
                    f"got {_describe_value(value)}"
                )
            _check_bounds(method, key, converted, bounds[key].get("min"), bounds[key].get("max"))
            out[key] = converted
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, method: str = "") -> Self:
        """A validated config from ``values`` (missing keys take the defaults)."""
        checked = cls.validate(values, method=method)
        for key, table in cls.EXPANSIONS.items():
            extra = table.get(checked.get(key))
            if extra:
                checked = {**extra, **checked}  # the caller's own values win
        return cls(**checked)

    def to_dict(self) -> dict[str, Any]:
        """Every key and its value (values are not copied)."""
        return {k: getattr(self, k) for k in self.keys()}

    def options(self) -> dict[str, Any]:
        """The keys every method's constructor takes as they are (:data:`OPTIONS`): a builder
        passes them on, ``Method(model, optimizer, ..., **cfg.options(), **parts)``."""
        return {k: getattr(self, k) for k in self.OPTIONS}


def _check_bounds(method: str, key: str, value: Any, low: Any, high: Any) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    if low is not None and not value >= low:
        want = f">= {low}"
    elif high is not None and not value <= high:
        want = f"<= {high}"
    else:
        return
    raise ValueError(f"hyperparameter {key!r} of method {method!r} must be {want}; got {value!r}")


def _literal_choices(tp: Any) -> tuple[Any, ...]:
    if get_origin(tp) is Literal:
        return get_args(tp)
    if get_origin(tp) in (Union, types.UnionType):
        return tuple(c for a in get_args(tp) for c in _literal_choices(a))
    return ()


@dataclass(frozen=True)
class OptimizerConfig(MethodConfig):
    """Keys of the methods that build an SGD or Adam optimizer (:func:`make_optimizer`)."""

    optimizer: Literal["sgd", "adam"] = hparam("sgd", "optimizer")
    lr: float = hparam(2.5e-4, "learning rate", min=0.0)
    momentum: float = hparam(0.9, "SGD momentum", min=0.0)
    nesterov: bool = hparam(False, "SGD Nesterov momentum")
    weight_decay: float = hparam(0.0, "L2 weight decay", min=0.0)
    betas: tuple[float, float] = hparam((0.9, 0.999), "Adam betas")


@dataclass(frozen=True)
class ActiveConfig(OptimizerConfig):
    """The keys every method that asks for labels shares, beside its optimizer's."""

    label_expiry: int = hparam(
        DEFAULT_LABEL_EXPIRY,
        "steps an asynchronous annotator's request waits before it expires",
        min=0,
    )
