"""Find a classifier's feature extractor and head (features = what enters the final classifier).

EATTA perturbs the features and runs only the head twice, so it needs ``head(backbone(x)) ==
model(x)`` with both sharing the model's parameters. :func:`split_model` tries, in order:

1. eatta's input-normalization and logit-subset wrappers: split the model inside;
2. precise rules by class: torchvision ResNet (ResNeXt, Wide ResNet) and ViT (features = the
   class token before the head), timm models with ``forward_features`` / ``forward_head`` and an
   ``nn.Linear`` from ``get_classifier()``, an ``nn.Sequential`` ending in ``nn.Linear``;
3. discovery on an example batch (the methods pass their first batch): one forward pass, under
   ``torch.no_grad`` and with the model's state restored afterwards, observes which ``nn.Linear``
   produced the output. If that layer ran once and ``layer(its input)`` equals the output exactly,
   the head is that layer and the features are its input. The backbone is the model's direct
   child that produced that input, when there is one and it gives the same features run alone
   (a ``features`` / ``classifier`` model); else it runs the model and stops as the head is
   entered (a hook lives on the head only during each backbone call). Models whose
   output comes from a convolution, from several layers combined, from a layer run twice, or that
   return a tuple get :class:`SplitNotFoundError`.

Otherwise pass ``split=(backbone, head)`` to the method.

A compiled model (``torch.compile(model)``, an ``OptimizedModule``) is split on the module it
wraps (hooks and a second gradient pass need the eager modules): the backbone is compiled as
the model was (same backend and options), the head, one ``nn.Linear``, runs eagerly. A backbone
found by discovery is compiled as a copy of the model's structure with the head replaced by
``nn.Identity`` (sharing every parameter and buffer), when that copy gives the same features on
the example; otherwise it runs eagerly. The compiled backbone's backward may run twice (EATTA's
two gradients): it is compiled without donated buffers (``docs/guide/compile.md``).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol, TypeGuard

import torch
from torch import Tensor, nn

__all__ = [
    "ModelSplit",
    "SplitNotFoundError",
    "backward_twice",
    "check_split",
    "is_compiled",
    "split_model",
]


class SplitNotFoundError(TypeError):
    """The backbone/head split of a model could not be found automatically."""


class ModelSplit(NamedTuple):
    """A feature extractor and the classifier head that consumes its output."""

    backbone: nn.Module
    head: nn.Module


class _NormalizedWrapper(Protocol):
    """eatta's input-normalization wrapper (``eatta.models.backbones.Normalized``) by attributes."""

    model: nn.Module
    normalize_mean: Tensor
    normalize_std: Tensor


class _SubsetWrapper(Protocol):
    """eatta's logit-subset wrapper (e.g. ImageNet-R/A's 200 of 1000 classes), by its attributes."""

    model: nn.Module
    indices: Tensor


class _TimmModel(Protocol):
    """A timm model, by the methods the split uses."""

    def forward_features(self, x: Tensor) -> Tensor: ...

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor: ...

    def get_classifier(self) -> Any: ...


class _TorchvisionResNetFeatures(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        n: Any = self.net  # a torchvision ResNet: its layers by name (torchvision is untyped)
        x = n.maxpool(n.relu(n.bn1(n.conv1(x))))
        x = n.layer4(n.layer3(n.layer2(n.layer1(x))))
        return torch.flatten(n.avgpool(x), 1)


class _TorchvisionViTFeatures(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        n: Any = self.net  # a torchvision VisionTransformer (torchvision is untyped)
        x = n._process_input(x)
        cls = n.class_token.expand(x.shape[0], -1, -1)
        x = n.encoder(torch.cat([cls, x], dim=1))
        return x[:, 0]


class _TimmFeatures(nn.Module):
    def __init__(self, net: _TimmModel) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net.forward_head(self.net.forward_features(x), pre_logits=True)


class _Normalize(nn.Module):
    def __init__(self, wrapper: _NormalizedWrapper) -> None:
        super().__init__()
        self.wrapper = wrapper

    def forward(self, x: Tensor) -> Tensor:
        w = self.wrapper
        return (x - w.normalize_mean) / w.normalize_std


class _SelectLogits(nn.Module):
    def __init__(self, head: nn.Module, wrapper: _SubsetWrapper) -> None:
        super().__init__()
        self.head = head
        self.wrapper = wrapper

    def forward(self, z: Tensor) -> Tensor:
        return self.head(z).index_select(1, self.wrapper.indices)


def _is_subset_wrapper(model: nn.Module) -> TypeGuard[_SubsetWrapper]:
    return hasattr(model, "model") and isinstance(getattr(model, "indices", None), Tensor)


def _is_normalized_wrapper(model: nn.Module) -> TypeGuard[_NormalizedWrapper]:
    return all(hasattr(model, a) for a in ("model", "normalize_mean", "normalize_std"))


def _is_timm_model(model: nn.Module) -> TypeGuard[_TimmModel]:
    return all(hasattr(model, a) for a in ("forward_features", "forward_head", "get_classifier"))


def _torchvision_class(name: str) -> type | None:
    tv = sys.modules.get("torchvision")  # a torchvision model implies torchvision is imported
    models = getattr(tv, "models", None)
    return getattr(models, name, None)


class _FeaturesReady(BaseException):
    """Private control flow: the head was entered, the features are captured, stop the pass.

    A BaseException so that an ``except Exception`` inside a model's forward cannot swallow it.
    """

    def __init__(self, token: object) -> None:
        super().__init__()
        self.token = token


def _first_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs.get("input")


class _LinearInputFeatures(nn.Module):
    """The input of ``model``'s final ``nn.Linear``: runs ``model`` and stops as that layer starts.

    During each call (only) a forward pre-hook on the head records its input, with its autograd
    graph, and raises a private exception that ends the pass, so the head and what follows it
    never run and the model carries no hook between calls. The hook is prepended and tagged per
    call and per thread, so nested calls and other threads' forward passes are left alone.
    """

    def __init__(self, model: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._head = (head,)  # inside ``model`` already: a tuple, so it is not registered twice

    def forward(self, x: Tensor) -> Tensor:
        head = self._head[0]
        token = object()
        thread = threading.get_ident()
        found: list[Any] = []

        def capture(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if threading.get_ident() != thread:
                return None
            found.append(_first_input(args, kwargs))
            raise _FeaturesReady(token)

        handle = head.register_forward_pre_hook(capture, prepend=True, with_kwargs=True)
        try:
            self.model(x)
        except _FeaturesReady as stop:
            if stop.token is not token:
                raise
        finally:
            handle.remove()
        if not found:
            raise SplitNotFoundError(
                f"{type(self.model).__name__}'s forward pass returned without calling the head "
                "found when the split was discovered (does it take another path now?); pass "
                "split=(backbone, head) explicitly"
            )
        return found[0]


def _not_found(model: nn.Module, why: str) -> SplitNotFoundError:
    return SplitNotFoundError(
        f"cannot find the feature extractor / classifier head of {type(model).__name__}: {why}. "
        "Automatic splits need the output to come from one final nn.Linear (see "
        "eatta.split). Pass it explicitly: split=(backbone, head), two modules sharing the "
        "model's parameters with head(backbone(x)) == model(x)."
    )


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


@contextlib.contextmanager
def _state_restored(model: nn.Module) -> Iterator[None]:
    """Undo what a forward pass may change: buffers (BatchNorm statistics and counters), the
    modules' training flags and the torch CPU and CUDA random number generators."""
    buffers = [
        (module, name, buf, None if buf is None else buf.clone())
        for module in model.modules()
        for name, buf in list(module._buffers.items())
    ]
    modes = [(module, module.training) for module in model.modules()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, buf, saved in buffers:
                module._buffers[name] = buf
                if buf is not None and saved is not None and not torch.equal(buf, saved):
                    buf.copy_(saved)
        for module, training in modes:
            module.training = training
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _same_tensor(a: Any, b: Tensor) -> bool:
    return isinstance(a, Tensor) and a.shape == b.shape and torch.equal(a, b)


def _autocast_off(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    available = getattr(torch.amp, "is_autocast_available", None)  # torch >= 2.4
    if available(device.type) if available else device.type in ("cpu", "cuda"):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


def _discover(model: nn.Module, example: Tensor) -> ModelSplit:
    """Find the final ``nn.Linear`` by observing one forward pass on ``example`` (state kept)."""
    if not isinstance(example, Tensor):
        raise TypeError(f"example must be a torch.Tensor, got {type(example).__name__}")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise _not_found(model, "it has no nn.Linear layer")
    calls: list[tuple[nn.Module, Any, Any]] = []
    children: list[tuple[nn.Module, Any]] = []  # each direct child's output, in order

    def record(
        module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        calls.append((module, _first_input(args, kwargs), output))

    def child_output(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        children.append((module, output))

    with _state_restored(model), torch.no_grad(), _autocast_off(example.device):
        handles = [m.register_forward_hook(record, with_kwargs=True) for m in linears]
        handles += [m.register_forward_hook(child_output) for m in model.children()]
        try:
            out = model(example)
        finally:
            for handle in handles:
                handle.remove()
        if not isinstance(out, Tensor) or out.dim() != 2:
            raise _not_found(model, f"it returns {_describe(out)}, not [batch, classes] logits")
        match = next((c for c in reversed(calls) if c[2] is out), None)
        if match is None:  # the output passed through no-op modules (flatten, dropout in eval)
            match = next((c for c in reversed(calls) if _same_tensor(c[2], out)), None)
        if match is None:
            raise _not_found(
                model,
                "no nn.Linear produced its output (a convolutional or functional head, several "
                "layers' outputs combined, or the logits changed after the last nn.Linear)",
            )
        head, features, _ = match
        runs = sum(1 for c in calls if c[0] is head)
        if runs != 1:
            raise _not_found(model, f"its final nn.Linear runs {runs} times per forward pass")
        if not isinstance(features, Tensor) or not torch.equal(head(features), out):
            raise _not_found(model, "its final nn.Linear does not reproduce the output alone")
        # the head's input is a direct child's output (``features`` then ``classifier``): that
        # child is the backbone, if it gives the same features run alone
        child = next((m for m, o in children if o is features and m is not head), None)
        if child is not None and sum(1 for m, _ in children if m is child) == 1:
            again = child(example)
            if isinstance(again, Tensor) and torch.equal(again, features):
                return ModelSplit(child, head)
    return ModelSplit(_LinearInputFeatures(model, head), head)


def _normalized_example(wrapper: _NormalizedWrapper, example: Tensor | None) -> Tensor | None:
    if example is None:
        return None
    with torch.no_grad():
        return (example - wrapper.normalize_mean) / wrapper.normalize_std


def _optimized_module_type() -> type | None:
    dynamo = sys.modules.get("torch._dynamo.eval_frame")  # loaded by torch.compile
    return getattr(dynamo, "OptimizedModule", None)


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper (an ``OptimizedModule``)."""
    cls = _optimized_module_type()
    return cls is not None and isinstance(model, cls)


def backward_twice(model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """A context in which the compiled graphs of ``model`` may run their backward twice
    (``retain_graph=True``): aot_autograd's donated buffers are off inside it (graphs compiled
    there donate none, and the check made at each backward, which reads the setting then, is
    not raised; a backward compiled lazily at a first ``retain_graph=True`` pass donates none
    either). Nothing for an eager model; nothing global changes."""
    if not is_compiled(model):
        return contextlib.nullcontext()
    from torch._functorch import config as functorch_config

    patch: contextlib.AbstractContextManager[Any] = functorch_config.patch(donated_buffer=False)
    return patch


class _CompiledFeatures(nn.Module):
    """``backbone`` compiled as ``compiled`` (an ``OptimizedModule``) was: same dynamo context.

    Its graphs are compiled without donated buffers, so that their backward may run twice
    (``retain_graph=True``: EATTA's two gradients); the setting is scoped to this module's calls
    (compilation happens inside them), nothing global changes.
    """

    def __init__(self, backbone: nn.Module, compiled: nn.Module) -> None:
        super().__init__()
        cls = type(compiled)
        self.compiled = cls(backbone, compiled.dynamo_ctx)

    def forward(self, x: Tensor) -> Tensor:
        from torch._functorch import config as functorch_config

        with functorch_config.patch(donated_buffer=False):
            out: Tensor = self.compiled(x)
        return out


def _without_head(model: nn.Module, head: nn.Module) -> nn.Module | None:
    """A shallow copy of ``model`` whose ``head`` is ``nn.Identity``: the modules on the path to
    the head are copied (their submodule tables too), every other module, parameter and buffer
    is shared. None if the head is not a submodule of ``model``."""
    path = next((name for name, m in model.named_modules() if m is head and name), None)
    if path is None:
        return None
    *parents, last = path.split(".")
    root = copy.copy(model)
    root._modules = dict(model._modules)
    node = root
    for name in parents:
        child = node._modules[name]
        assert child is not None
        child = copy.copy(child)
        child._modules = dict(child._modules)
        node._modules[name] = child
        node = child
    node._modules[last] = nn.Identity()
    return root


def _compiled_split(model: nn.Module, inner: ModelSplit, example: Tensor | None) -> ModelSplit:
    """The split of a compiled ``model`` from its inner module's split (see the module doc)."""
    backbone = inner.backbone
    if isinstance(backbone, _LinearInputFeatures):
        plain = _without_head(backbone.model, inner.head)
        if plain is None or example is None:
            return inner
        with _state_restored(backbone.model), torch.no_grad(), _autocast_off(example.device):
            try:
                same = _same_tensor(plain(example), backbone(example))
            except Exception:  # the model's forward needs its head: keep the eager backbone
                same = False
        if not same:
            return inner
        backbone = plain
    return ModelSplit(_CompiledFeatures(backbone, model), inner.head)


def split_model(model: nn.Module, example: Tensor | None = None) -> ModelSplit:
    """Return ``(backbone, head)`` sharing ``model``'s parameters, or raise SplitNotFoundError.

    ``example`` (an input batch, e.g. the first batch of the stream) lets models that no rule by
    class covers be split by observing one forward pass; the model's buffers, training flags and
    the random number generators are left as they were. Methods pass their first batch.
    A compiled model (``torch.compile``) is split on the module it wraps, its backbone compiled
    as the model was (see the module doc).
    """
    if is_compiled(model):
        inner_model: nn.Module = model._orig_mod  # type: ignore[assignment]  # OptimizedModule
        return _compiled_split(model, split_model(inner_model, example), example)
    if _is_normalized_wrapper(model):
        inner = split_model(model.model, _normalized_example(model, example))
        return ModelSplit(nn.Sequential(_Normalize(model), inner.backbone), inner.head)
    if _is_subset_wrapper(model):  # e.g. ImageNet-R/A: 200 of a 1000-class model's logits
        inner = split_model(model.model, example)
        return ModelSplit(inner.backbone, _SelectLogits(inner.head, model))
    resnet = _torchvision_class("ResNet")
    if resnet is not None and isinstance(model, resnet):
        return ModelSplit(_TorchvisionResNetFeatures(model), model.get_submodule("fc"))
    vit = _torchvision_class("VisionTransformer")
    if vit is not None and isinstance(model, vit):
        return ModelSplit(_TorchvisionViTFeatures(model), model.get_submodule("heads"))
    if _is_timm_model(model):
        classifier = model.get_classifier()
        if isinstance(classifier, nn.Linear):  # a conv or tuple classifier: discovery decides
            return ModelSplit(_TimmFeatures(model), classifier)
    if isinstance(model, nn.Sequential) and len(model) > 1 and isinstance(model[-1], nn.Linear):
        return ModelSplit(nn.Sequential(*list(model)[:-1]), model[-1])
    if example is not None:
        return _discover(model, example)
    raise SplitNotFoundError(
        f"cannot find the feature extractor / classifier head of {type(model).__name__} without "
        "an example batch: rules by class cover torchvision ResNet/ViT, timm models and "
        "nn.Sequential ending in nn.Linear; any model whose output comes from one final "
        "nn.Linear is split on an example (split_model(model, example=x); the methods use their "
        "first batch). Or pass it explicitly: split=(backbone, head), two modules sharing the "
        "model's parameters with head(backbone(x)) == model(x)."
    )


def _tensors(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, tuple | list):
        return [t for item in out for t in _tensors(item)]
    return []


def check_split(model: nn.Module, split: ModelSplit, example: Tensor) -> None:
    """Refuse an explicit ``split`` that is not the model's, before anything changes: the
    backbone's and the head's parameters must be the model's, and on ``example`` (the first
    batch) ``head(backbone(x))`` must be ``[batch, classes]`` logits equal to the model's output
    (or to one of the tensors it returns). One forward pass of each, under ``torch.no_grad``,
    the model's buffers, modes and random generators left as they were."""
    if is_compiled(model):  # compiled: compared on the eager modules it wraps
        model = model._orig_mod  # type: ignore[assignment]  # OptimizedModule
    own = {id(p) for p in model.parameters()}
    for name, part in (("backbone", split.backbone), ("head", split.head)):
        if not isinstance(part, nn.Module):
            raise TypeError(f"split's {name} must be an nn.Module, got {type(part).__name__}")
        foreign = [p for p in part.parameters() if id(p) not in own]
        if foreign:
            raise ValueError(
                f"split's {name} holds {len(foreign)} parameter(s) that are not the model's: "
                "give two modules of the model itself, split=(backbone, head)"
            )
    with _state_restored(model), torch.no_grad(), _autocast_off(example.device):
        out = model(example)
        logits = split.head(split.backbone(example))
    if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[0] != len(example):
        raise ValueError(
            f"split's head(backbone(x)) returned {_describe(logits)}, not [batch, classes] logits"
        )
    if not any(t.shape == logits.shape and torch.allclose(t, logits) for t in _tensors(out)):
        raise ValueError(
            f"split's head(backbone(x)) (shape {tuple(logits.shape)}) differs from the model's "
            f"output ({_describe(out)}): give the model's own feature extractor and classifier "
            "head, whose composition is the model's logits"
        )
