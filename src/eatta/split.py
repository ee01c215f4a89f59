"""Find a classifier's feature extractor and head (features = what enters the final classifier).

EATTA perturbs the features and runs only the head twice, so it needs ``head(backbone(x)) ==
model(x)`` with both sharing the model's parameters. :func:`split_model` tries, in order:

1. eatta's input-normalization and logit-subset wrappers: split the model inside;
2. precise rules by class: torchvision ResNet (ResNeXt, Wide ResNet) and ViT (features = the
   class token before the head), timm models with ``forward_features`` / ``forward_head`` and an
   ``nn.Linear`` from ``get_classifier()``, an ``nn.Sequential`` ending in ``nn.Linear``;
3. discovery on an example batch (the methods pass their first batch, or an input built from
   the model's own configuration at construction, :func:`example_input`): one forward pass, under
   ``torch.no_grad`` and with the model's state restored afterwards, observes which ``nn.Linear``
   produced the output. If that layer ran once and ``layer(its input)`` equals the output exactly,
   the head is that layer and the features are its input. The backbone is the model's direct
   child that produced that input, when there is one and it gives the same features run alone
   (a ``features`` / ``classifier`` model); else it runs the model and stops as the head is
   entered (a hook lives on the head only during each backbone call). The logits are read as
   every method reads them (:mod:`eatta.outputs`: a tensor, or a mapping or Hugging Face
   ``ModelOutput`` with ``logits``), so a ``transformers`` classifier (ViT, DeiT, BEiT, ResNet,
   ConvNeXt, Swin, MobileViT, EfficientNet, ...) is split at its classifier, the features being
   the tensor that enters it. Models whose logits come from a convolution, from several layers
   combined (a distilled two-head DeiT or LeViT), from a layer run twice, or that return a tuple
   get :class:`SplitNotFoundError`.

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

from eatta.outputs import SplitNotFoundError, classifier_names, describe_output, logits_in

__all__ = [
    "ModelSplit",
    "SplitNotFoundError",
    "backward_twice",
    "check_split",
    "example_input",
    "find_split",
    "is_compiled",
    "split_model",
]


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


#: What to pass for a model whose logits combine two heads.
_TWO_HEADS = (
    "EATTA perturbs the features its head reads: give it one feature tensor and a head that "
    "computes the logits from it (for a distilled model, both tokens concatenated and the mean "
    "of both heads; docs/guide/huggingface.md)"
)


def _head_advice(model: nn.Module) -> str:
    """``split=(...)`` spelled with the model's own classifier attribute, where it has one."""
    heads = classifier_names(model)
    if not heads:
        return "split=(backbone, head)"
    return f"split=(backbone, head), e.g. head=model.{heads[0]}"


def _not_found(model: nn.Module, why: str) -> SplitNotFoundError:
    return SplitNotFoundError(
        f"cannot find the feature extractor / classifier head of {type(model).__name__}: {why}. "
        "Automatic splits need the logits to come from one final nn.Linear applied to one "
        f"feature tensor (see eatta.split). Pass it explicitly: {_head_advice(model)}, two "
        "modules sharing the model's parameters, backbone(x) the tensor the head reads and "
        "head(backbone(x)) the model's logits; or use a label-free method (it reads the logits "
        "alone)."
    )


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
        logits = logits_in(out)  # a tensor, or a mapping / ModelOutput's "logits"
        if logits is None:
            raise _not_found(
                model, f"it returns {describe_output(out)}, not [batch, classes] logits"
            )
        out = logits
        match = next((c for c in reversed(calls) if c[2] is out), None)
        if match is None:  # the output passed through no-op modules (flatten, dropout in eval)
            match = next((c for c in reversed(calls) if _same_tensor(c[2], out)), None)
        if match is None:
            raise _not_found(model, _no_linear_output(model, calls, out))
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


def _no_linear_output(
    model: nn.Module, calls: list[tuple[nn.Module, Any, Any]], out: Tensor
) -> str:
    """Why no ``nn.Linear`` produced ``out``: several heads of its shape combined, or none."""
    names = {id(m): name for name, m in model.named_modules()}
    heads = list(
        dict.fromkeys(
            names.get(id(m), "?")
            for m, _, o in calls
            if isinstance(o, Tensor) and o.shape == out.shape
        )
    )
    if len(heads) > 1:
        listed = ", ".join(f"model.{h}" for h in heads)
        return (
            f"its logits combine {len(heads)} nn.Linear heads ({listed}), so they are not one "
            f"linear map of one feature vector (a distilled two-head model). {_TWO_HEADS}"
        )
    return (
        "no nn.Linear produced its output (a convolutional or functional head, several "
        "layers' outputs combined, or the logits changed after the last nn.Linear)"
    )


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
            out = self.compiled(x)
        if isinstance(out, Tensor):
            return out
        features = logits_in(out)  # a model whose head is replaced: its "logits" are features
        assert features is not None, "checked on the example when the split was made"
        return features


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
                same = _same_tensor(logits_in(plain(example)), backbone(example))
            except Exception:  # the model's forward needs its head: keep the eager backbone
                same = False
        if not same:
            return inner
        backbone = plain
    return ModelSplit(_CompiledFeatures(backbone, model), inner.head)


def _configured_shape(model: nn.Module) -> tuple[int, ...] | None:
    """``(channels, height, width)`` of the images ``model`` says it takes in its own
    configuration: a Hugging Face model's ``config.num_channels`` and ``config.image_size``
    (224 where a convolutional model's config names none); None where it says nothing."""
    config = getattr(model, "config", None)
    channels = getattr(config, "num_channels", None)
    if not isinstance(channels, int) or isinstance(channels, bool) or channels < 1:
        return None
    size = getattr(config, "image_size", 224)
    if isinstance(size, int) and not isinstance(size, bool):
        size = (size, size)
    if not isinstance(size, tuple | list) or len(size) != 2:
        return None
    if not all(isinstance(v, int) and v > 0 for v in size):
        return None
    return (channels, int(size[0]), int(size[1]))


def example_input(model: nn.Module, batch: int = 2) -> Tensor | None:
    """A batch of ``batch`` images in [0, 1] of the size the model's own configuration names
    (:func:`_configured_shape`: Hugging Face ``transformers`` vision models), on the model's
    device and in its floating dtype, drawn from a generator of its own (the global random
    state is left alone); None where the model names no input size. It lets a split be found,
    or refused, when a method is built, before the first batch."""
    shape = _configured_shape(model)
    if shape is None:
        return None
    ref = next((p for p in model.parameters() if p.is_floating_point()), None)
    g = torch.Generator().manual_seed(0)
    x = torch.rand((batch, *shape), generator=g)
    return x if ref is None else x.to(device=ref.device, dtype=ref.dtype)


def split_model(model: nn.Module, example: Tensor | None = None) -> ModelSplit:
    """Return ``(backbone, head)`` sharing ``model``'s parameters, or raise SplitNotFoundError.

    ``example`` (an input batch, e.g. the first batch of the stream) lets models that no rule by
    class covers be split by observing one forward pass (without one, a model that names its
    input size in its configuration, a Hugging Face one, is observed on
    :func:`example_input`); the model's buffers, training flags and
    the random number generators are left as they were. Methods pass their first batch.
    A compiled model (``torch.compile``) is split on the module it wraps, its backbone compiled
    as the model was (see the module doc).
    """
    found = find_split(model, example)
    if found is None:
        raise SplitNotFoundError(
            f"cannot find the feature extractor / classifier head of {type(model).__name__} "
            "without an example batch: rules by class cover torchvision ResNet/ViT, timm models "
            "and nn.Sequential ending in nn.Linear; any model whose output comes from one final "
            "nn.Linear is split on an example (split_model(model, example=x); the methods use "
            "their first batch). Or pass it explicitly: split=(backbone, head), two modules "
            "sharing the model's parameters with head(backbone(x)) == model(x)."
        )
    return found


def find_split(model: nn.Module, example: Tensor | None = None) -> ModelSplit | None:
    """:func:`split_model`, but None where only an example batch could tell (no rule by class
    applies, the model names no input size and ``example`` is None); a model refused by a rule
    or on an example raises :class:`SplitNotFoundError` as there. A method calls it when it is
    built, so that a model it cannot split is refused then."""
    if is_compiled(model):
        inner_model: nn.Module = model._orig_mod  # type: ignore[assignment]  # OptimizedModule
        inner = find_split(inner_model, example)
        if inner is None:
            return None
        return _compiled_split(
            model, inner, example_input(inner_model) if example is None else example
        )
    if _is_normalized_wrapper(model):
        inner = find_split(model.model, _normalized_example(model, example))
        if inner is None:
            return None
        return ModelSplit(nn.Sequential(_Normalize(model), inner.backbone), inner.head)
    if _is_subset_wrapper(model):  # e.g. ImageNet-R/A: 200 of a 1000-class model's logits
        inner = find_split(model.model, example)
        return (
            None if inner is None else ModelSplit(inner.backbone, _SelectLogits(inner.head, model))
        )
    resnet = _torchvision_class("ResNet")
    if resnet is not None and isinstance(model, resnet):
        return ModelSplit(_TorchvisionResNetFeatures(model), model.get_submodule("fc"))
    vit = _torchvision_class("VisionTransformer")
    if vit is not None and isinstance(model, vit):
        return ModelSplit(_TorchvisionViTFeatures(model), model.get_submodule("heads"))
    if _is_timm_model(model):
        classifier = model.get_classifier()
        if isinstance(classifier, nn.Linear):  # a conv classifier: discovery decides
            return ModelSplit(_TimmFeatures(model), classifier)
        if isinstance(classifier, tuple | list) and len(classifier) > 1:  # distilled: 2 heads
            plain: nn.Module = model  # type: ignore[assignment]  # a timm model is a Module
            names = {id(m): n for n, m in plain.named_modules()}
            listed = ", ".join(f"model.{names.get(id(c), '?')}" for c in classifier)
            raise _not_found(
                plain,
                f"its logits combine {len(classifier)} classifier heads ({listed}), so they are "
                f"not one linear map of one feature vector (a distilled two-head model). "
                f"{_TWO_HEADS}",
            )
    if isinstance(model, nn.Sequential) and len(model) > 1 and isinstance(model[-1], nn.Linear):
        return ModelSplit(nn.Sequential(*list(model)[:-1]), model[-1])
    if example is None:
        example = example_input(model)
    if example is not None:
        return _discover(model, example)
    return None


def split_for_copy(split: ModelSplit, model: nn.Module, twin: nn.Module) -> ModelSplit:
    """``split`` made to run ``twin``, a copy of ``model`` (the model as given, a method's
    teacher): each of its modules, and each module, parameter and buffer of ``model`` it holds,
    is replaced by the one at the same place in ``twin``; a module of the user's own (a wrapper
    that calls parts of the model, not a submodule of it) is copied that way, so the copy reads
    ``twin``'s values and nothing of ``model``. What has no place in ``twin`` is copied as it is."""
    twin_modules = dict(twin.named_modules(remove_duplicate=False))
    twin_tensors: dict[str, Tensor] = dict(twin.named_parameters(remove_duplicate=False))
    twin_tensors.update(twin.named_buffers(remove_duplicate=False))
    memo: dict[int, Any] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if name in twin_modules:
            memo.setdefault(id(m), twin_modules[name])
    for name, t in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        if name in twin_tensors:
            memo.setdefault(id(t), twin_tensors[name])
    backbone, head = (
        memo[id(part)] if id(part) in memo else copy.deepcopy(part, memo) for part in split
    )
    return ModelSplit(backbone, head)


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
        z = split.backbone(example)
        if not isinstance(z, Tensor):
            raise ValueError(
                f"split's backbone returned {describe_output(z)}, not a tensor of features: give "
                "a module that returns the tensor the head reads (e.g. one that runs the model's "
                "base and picks the pooled features or the class token out of its output)"
            )
        try:
            raw = split.head(z)
        except Exception as err:
            raise ValueError(
                f"split's head cannot read what the backbone returned ({describe_output(z)}): "
                f"{type(err).__name__}: {err}"
            ) from err
    logits = logits_in(raw)
    if logits is None or logits.shape[0] != len(example):
        raise ValueError(
            f"split's head(backbone(x)) returned {describe_output(raw)}, not [batch, classes] "
            "logits"
        )
    model_logits = logits_in(out)
    candidates = [model_logits] if model_logits is not None else _tensors(out)
    if not any(t.shape == logits.shape and torch.allclose(t, logits) for t in candidates):
        raise ValueError(
            f"split's head(backbone(x)) (shape {tuple(logits.shape)}) differs from the model's "
            f"logits ({describe_output(out if model_logits is None else model_logits)}): give "
            "the model's own feature extractor and classifier head, whose composition is the "
            "model's logits"
        )
