"""Count what would block the host on an accelerator, on a CPU-only machine.

A step on the CPU never waits for a device, so the count is of what *would* wait: every tensor
is tagged "device" or "host" as it is made (the model's parameters and buffers, the optimizer's
state, the batch and its labels are on the device; an op with a device input makes a device
output; a factory given ``device=`` (a ``torch.device``) makes a device tensor; other factories,
``torch.tensor(data)`` without a device, ``.cpu()`` make host tensors), and these are counted:

* a read of a device tensor on the host: ``item()``/``bool()``/``int()``/``float()``
  (``aten._local_scalar_dense``, ``aten.is_nonzero``), ``aten.equal``, ``tolist()``,
  ``numpy()``, ``cpu()``;
* an op whose output shape depends on a device tensor's values: ``nonzero``,
  ``masked_select``, ``unique*``, boolean-mask indexing (``index``, ``index_put``);
* a blocking copy: ``to(device)`` of a host tensor or ``to("cpu")`` of a device tensor without
  ``non_blocking=True`` (a non-blocking copy to the host is read only after a wait the step
  makes anyway, which the count does not check),
  ``torch.tensor(data, device=...)``, and a host tensor with dimensions met by a device tensor in
  one op (indexing with host indices: the implicit copy).

All tensors live on the CPU here, so a ``torch.device`` argument is read as "the device" and the
string ``"cpu"`` as the host (the library's own convention: ``.to(o.device)``, ``.to("cpu")``).
Each count keeps where it happened (the innermost ``eatta`` frame), for the failure message.
"""

from __future__ import annotations

import collections
import functools
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

import eatta

aten = torch.ops.aten

_READS = {
    aten._local_scalar_dense.default: "item",
    aten.is_nonzero.default: "bool",
    aten.equal.default: "equal",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "masked_select",
}
_UNIQUE = {"unique_dim", "_unique", "_unique2", "unique_consecutive", "unique_dim_consecutive"}
_INDEX = {"index", "index_put", "index_put_", "_index_put_impl_"}
_FACTORIES = ("zeros", "ones", "empty", "full", "randn", "rand", "randint", "arange", "eye")


#: The installed package's folder: a site is a frame in it, whatever the checkout's folder is named.
_PACKAGE = os.path.dirname(os.path.abspath(eatta.__file__)) + os.sep


def _site() -> str:
    """``file:line`` of the innermost frame inside the package, the file relative to it."""
    frames = [f for f in traceback.extract_stack() if f.filename.startswith(_PACKAGE)]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{f.filename[len(_PACKAGE) :]}:{f.lineno}"


class HostSyncCounter(TorchDispatchMode):
    """The counts (``sites``: ``(what, file:line) -> n``) while active; see the module doc."""

    def __init__(self, device_tensors: list[Tensor]) -> None:
        super().__init__()
        self.on_device: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for t in device_tensors:
            self.on_device[t] = True
        self.sites: collections.Counter[tuple[str, str]] = collections.Counter()
        self._quiet = 0

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def table(self) -> str:
        return "; ".join(f"{w} at {s} x{n}" for (w, s), n in sorted(self.sites.items()))

    def count(self, what: str) -> None:
        if not self._quiet:
            self.sites[(what, _site())] += 1

    def is_device(self, t: object) -> bool:
        return isinstance(t, Tensor) and self.on_device.get(t, False)

    def tag(self, t: Tensor, device: bool) -> Tensor:
        self.on_device[t] = device
        return t

    @contextmanager
    def quiet(self) -> Iterator[None]:
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, Tensor)]
        dev = [t for t in tensors if self.is_device(t)]
        name = func.overloadpacket.__name__
        if dev:
            what = _READS.get(func)
            if what is None and name in _UNIQUE:
                what = "unique"
            if what is None and name in _INDEX:
                idx = args[1] if len(args) > 1 else kwargs.get("indices", ())
                if any(isinstance(i, Tensor) and i.dtype == torch.bool for i in idx):
                    what = "boolean-mask index"
            if what is not None:
                self.count(what)
            hosts = [t for t in tensors if not self.is_device(t) and t.dim() > 0]
            if hosts and what is None:
                self.count(f"host tensor into {name}")
        out = func(*args, **kwargs)
        outs, _ = tree_flatten(out)
        for t in outs:
            if isinstance(t, Tensor) and not any(t is u for u in tensors):
                self.on_device[t] = bool(dev)
        return out


def _target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """``"device"``, ``"host"`` or None (a dtype-only ``to``) for ``Tensor.to``'s arguments."""
    for a in (*args, kwargs.get("device")):
        if isinstance(a, str):
            return "host" if a == "cpu" else "device"
        if isinstance(a, torch.device):
            return "device"
        if isinstance(a, Tensor):
            return "device"
    return None


@contextmanager
def counting(device_tensors: list[Tensor]) -> Iterator[HostSyncCounter]:
    """Count host synchronisations (see the module doc) while the block runs."""
    mode = HostSyncCounter(device_tensors)
    saved: dict[tuple[object, str], Callable[..., Any]] = {}

    def patch(
        owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        orig = getattr(owner, name)
        saved[(owner, name)] = orig
        setattr(owner, name, functools.wraps(orig)(wrap(orig)))

    def reading(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
            def read(self: Tensor, *a: Any, **k: Any) -> Any:
                if mode.is_device(self):
                    mode.count(what)
                with mode.quiet():
                    return orig(self, *a, **k)

            return read

        return wrap

    def to_host(orig: Callable[..., Any]) -> Callable[..., Any]:
        def cpu(self: Tensor, *a: Any, **k: Any) -> Tensor:
            if not mode.is_device(self):
                return self
            mode.count("cpu()")
            with mode.quiet():
                return mode.tag(self.clone(), False)

        return cpu

    def to(orig: Callable[..., Any]) -> Callable[..., Any]:
        def moved(self: Tensor, *a: Any, **k: Any) -> Tensor:
            target = _target(a, k)
            with mode.quiet():
                out = orig(self, *a, **k)
            if target is None or (target == "device") == mode.is_device(self):
                return out
            if not k.get("non_blocking", False):
                mode.count("to(host)" if target == "host" else "to(device), blocking")
            with mode.quiet():
                copy = out.clone() if out is self else out
            return mode.tag(copy, target == "device")

        return moved

    def factory(orig: Callable[..., Any], copies: bool) -> Callable[..., Any]:
        def made(*a: Any, **k: Any) -> Any:
            with mode.quiet():
                out = orig(*a, **k)
            if a and isinstance(a[0], Tensor) and k.get("device") is None:  # as it is
                return mode.tag(out, mode.is_device(a[0])) if isinstance(out, Tensor) else out
            device = _target((), {"device": k.get("device")}) == "device"
            if device and copies and not (a and isinstance(a[0], Tensor)):
                mode.count("torch.tensor(data, device=)")
            if isinstance(out, Tensor):
                mode.tag(out, device)
            return out

        return made

    patch(torch.Tensor, "tolist", reading("tolist()"))
    patch(torch.Tensor, "numpy", reading("numpy()"))
    patch(torch.Tensor, "cpu", to_host)
    patch(torch.Tensor, "to", to)
    patch(torch, "tensor", lambda orig: factory(orig, True))
    patch(torch, "as_tensor", lambda orig: factory(orig, True))
    for name in _FACTORIES:
        patch(torch, name, lambda orig: factory(orig, False))
    try:
        with mode:
            yield mode
    finally:
        for (owner, name), orig in saved.items():
            setattr(owner, name, orig)


def device_tensors(root: object, depth: int = 5) -> list[Tensor]:
    """What lives on the device in a method: every parameter and buffer of every module reachable
    from ``root``'s attributes (its model, kept copies, teachers), and every floating-point
    tensor held there (EMA states, anchors). Integer and byte tensors (indices, generator states)
    are host bookkeeping."""
    found: dict[int, Tensor] = {}
    seen: set[int] = set()

    def walk(obj: object, level: int) -> None:
        if id(obj) in seen or level > depth:
            return
        seen.add(id(obj))
        if isinstance(obj, Tensor):
            if obj.is_floating_point():
                found[id(obj)] = obj
            return
        if isinstance(obj, torch.nn.Module):
            for t in [*obj.parameters(), *obj.buffers()]:
                found[id(t)] = t
        if isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                walk(state, level + 1)
            return
        if isinstance(obj, dict):
            for v in obj.values():
                walk(v, level + 1)
        elif isinstance(obj, (list, tuple, set)):
            for v in obj:
                walk(v, level + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            for v in vars(obj).values():
                walk(v, level + 1)

    walk(root, 0)
    return list(found.values())
