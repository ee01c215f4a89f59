"""Reading a classifier's output: the one place every method, copy and part reads logits from.

A classifier's forward may return its ``[batch, classes]`` logits as

- a tensor (torchvision, timm, most models);
- a mapping with a ``"logits"`` entry: Hugging Face ``transformers`` models return a
  ``ModelOutput`` (an ordered dict whose ``.logits`` is that entry, e.g.
  ``ImageClassifierOutput``), and a plain ``dict`` reads the same way;
- an object with a tensor attribute ``logits`` (a dataclass of one's own).

:func:`logits_in` finds them (None if the output holds none); :func:`read_logits` returns them or
refuses the output in one message naming what came out and the model's own classifier, so that
every method refuses a model the same way. A method always returns the logits tensor, whatever the
model returns (``docs/guide/huggingface.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

__all__ = [
    "OutputError",
    "SplitNotFoundError",
    "classifier_names",
    "describe_output",
    "logits_in",
    "read_logits",
]

#: The entry (or attribute) that holds the logits in a structured output.
LOGITS_KEY = "logits"


class SplitNotFoundError(TypeError):
    """The backbone/head split of a model could not be found automatically (the remedy:
    ``split=(backbone, head)``); :mod:`eatta.split` raises it."""


class OutputError(SplitNotFoundError):
    """A model's output holds no ``[batch, classes]`` logits that eatta can read (the remedy is
    the same: ``split=(backbone, head)``)."""


def _is_logits(value: Any) -> bool:
    return isinstance(value, Tensor) and value.dim() == 2


def logits_in(out: Any) -> Tensor | None:
    """The ``[batch, classes]`` logits in ``out``: ``out`` itself, its ``"logits"`` entry (a
    mapping, a ``ModelOutput``), or its ``logits`` attribute; None where there are none."""
    if isinstance(out, Tensor):
        return out if out.dim() == 2 else None
    if isinstance(out, Mapping):
        found = out.get(LOGITS_KEY)
    else:
        found = getattr(out, LOGITS_KEY, None)
    return found if _is_logits(found) else None


def describe_output(out: Any) -> str:
    """What a forward returned, in a few words (for error messages)."""
    if isinstance(out, Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    if isinstance(out, Mapping):
        keys = ", ".join(repr(k) for k in out)
        return f"a {type(out).__name__} (keys {keys})" if keys else f"an empty {type(out).__name__}"
    if isinstance(out, tuple | list):
        return f"a {type(out).__name__} of {len(out)}"
    return f"a {type(out).__name__}"


def classifier_names(model: nn.Module) -> list[str]:
    """The attribute paths of ``model``'s last ``nn.Linear`` layers that output the most
    features (its classifier heads, by their place), last first; empty without an ``nn.Linear``."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and name]
    if not linears:
        return []
    classes = linears[-1][1].out_features
    return [name for name, m in reversed(linears) if m.out_features == classes][:2]


def _advice(model: nn.Module) -> str:
    heads = classifier_names(model)
    if not heads:
        return (
            "pass split=(backbone, head): two modules of the model, head(backbone(x)) its "
            "[batch, classes] logits"
        )
    return (
        f"pass split=(backbone, model.{heads[0]}), backbone a module of your own that returns "
        f"the tensor model.{heads[0]} reads (its in_features per sample), sharing the model's "
        "parameters"
    )


def read_logits(out: Any, model: nn.Module, *, what: str = "the model") -> Tensor:
    """The ``[batch, classes]`` logits in ``out``, what ``what`` (``model`` or a part of it)
    returned (:func:`logits_in`); else an :class:`OutputError` saying what came out and what to
    pass, naming the model's own classifier."""
    found = logits_in(out)
    if found is not None:
        return found
    raise OutputError(
        f"{what} ({type(model).__name__}) returned {describe_output(out)}, not [batch, classes] "
        f"logits (a tensor, or a mapping or ModelOutput with 'logits'): {_advice(model)}"
    )
