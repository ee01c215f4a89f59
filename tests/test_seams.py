"""Where a user's model meets the library: every method reads a model's output the same way,
checks an explicit split, gives the model back as it was given, and saves what an asynchronous
annotator holds. Each test failed on the assembly before issue 60."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import eatta
from _every_method import call, labelled_batches, method_kwargs
from conftest import nested_equal
from eatta.annotate import SimulatedAnnotator
from eatta.annotate.base import QueuedAnnotator
from eatta.split import SplitNotFoundError


class DictNet(nn.Module):
    """A ``features`` / ``classifier`` CNN whose forward returns a dict, as many a published
    model does (its logits beside an auxiliary output; under another key with ``key``)."""

    def __init__(self, seed: int = 0, key: str = "logits") -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.key = key
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(8, 5)
        with torch.no_grad():
            self.classifier.weight.mul_(6.0)  # confident enough that entropy terms run

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        z = self.features(x)
        return {self.key: self.classifier(z), "embedding": z}


class TensorNet(DictNet):
    """The same network returning its logits alone (the reference for DictNet)."""

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return self.classifier(self.features(x))


def _kw(name: str) -> dict[str, Any]:
    return method_kwargs(name)


def _batches(n: int = 3, size: int = 16, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    return labelled_batches(n, size, seed=seed)


_call = call


@pytest.mark.parametrize("name", eatta.available())
def test_a_dict_without_logits_is_refused_the_same_way_by_every_method(name: str) -> None:
    model = DictNet(key="scores")
    message = r"returned a dict \(keys 'scores', 'embedding'\).*split=\(backbone, model\.classifier"
    if name == "eata":  # its Fisher data are read when it is built: refused there, undone
        before = copy.deepcopy(model.state_dict())
        with pytest.raises(SplitNotFoundError, match=message):
            eatta.create(name, model, **_kw(name))
        assert nested_equal(model.state_dict(), before)
        return
    method = eatta.create(name, model, **_kw(name))
    before = copy.deepcopy(method.state_dict())
    (x, y), *_ = _batches(1)
    with pytest.raises(SplitNotFoundError, match=r"split=\(backbone, "):
        _call(method, name, x, y)
    assert nested_equal(method.state_dict(), before)  # refused before anything changed


@pytest.mark.parametrize("name", eatta.available())
def test_a_dict_with_logits_is_read_as_the_tensor_by_every_method(name: str) -> None:
    """A model returning ``{"logits": ...}`` adapts exactly as the same model returning the
    tensor, and the method returns the tensor."""
    outs = []
    for net in (DictNet(), TensorNet()):
        method = eatta.create(name, net, **_kw(name))
        outs.append([_call(method, name, x, y) for x, y in _batches()])
    for got, want in zip(*outs, strict=True):
        assert isinstance(got, Tensor) and got.shape == (16, 5)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", eatta.available())
def test_a_dict_output_is_read_through_the_split_by_every_method(name: str) -> None:
    model = DictNet()
    given = copy.deepcopy(model).eval()
    method = eatta.create(name, model, split=(model.features, model.classifier), **_kw(name))
    (x, y), *rest = _batches()
    out = _call(method, name, x, y)
    assert out.shape == (16, 5)
    if name == "source":  # served as given: the model's own logits
        torch.testing.assert_close(out, given(x)["logits"], rtol=0, atol=0)
    for x, y in rest:
        assert torch.isfinite(_call(method, name, x, y)).all()


class TwiceHead(nn.Module):
    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, z: Tensor) -> Tensor:
        return 2 * self.head(z)


@pytest.mark.parametrize("name", ["tent", "eatta", "eatta-safe"])
def test_an_explicit_split_that_is_not_the_models_is_refused_on_the_first_batch(name: str) -> None:
    (x, y), *_ = _batches(1)
    cases = [
        (lambda m: (m.features, nn.Linear(8, 5)), "not the model's"),  # a head of its own
        (lambda m: (m.features, TwiceHead(m.classifier)), "differs from the model's logits"),
        (lambda m: (nn.Identity(), m.classifier), r"returned a tensor of shape \(16, 3, 8, 5\)"),
        (lambda m: (m, m.classifier), r"backbone returned a dict \(keys 'logits', 'embedding'"),
    ]
    for split, message in cases:
        model = DictNet()
        method = eatta.create(name, model, split=split(model), **_kw(name))
        before = copy.deepcopy(method.state_dict())
        with pytest.raises((ValueError, RuntimeError), match=message):
            _call(method, name, x, y)
        assert nested_equal(method.state_dict(), before)


def _plain_cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    with torch.no_grad():  # trained running statistics, as a user's model has
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
        model[1].num_batches_tracked.fill_(100)
    return model.eval()


def _snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "modes": [(n, m.training) for n, m in model.named_modules()],
        "grad": [(n, p.requires_grad) for n, p in model.named_parameters()],
        "kinds": [type(m) for m in model.modules()],
    }


@pytest.mark.parametrize("name", ["tent", "eatta", "eatta-safe"])
@pytest.mark.parametrize("window", [None, 16])
def test_reset_restores_buffers_and_unwrap_gives_the_model_back_exactly(
    name: str, window: int | None
) -> None:
    model = _plain_cnn()
    probe = torch.rand(8, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = model(probe)
    as_given = _snapshot(model)
    parts = {} if window is None else {"window": window}
    method = eatta.create(name, model, **parts, **_kw(name))
    created = copy.deepcopy(method.model.state_dict())
    for x, y in _batches(5, size=16 if window is None else 4):
        _call(method, name, x, y)
    assert not nested_equal(method.model.state_dict(), created)  # it adapted
    method.reset()
    assert nested_equal(method.model.state_dict(), created)  # parameters and buffers
    if window is None:  # the model as given, buffers included: it loads back where it came from
        assert nested_equal(model.state_dict(), as_given["state"])
        _plain_cnn(seed=1).load_state_dict(model.state_dict())
    for x, y in _batches(2, size=16 if window is None else 4):
        _call(method, name, x, y)
    back = method.unwrap()
    assert back is model
    now = _snapshot(model)
    assert [now[k] == as_given[k] for k in ("modes", "grad", "kinds")] == [True] * 3
    assert nested_equal(now["state"], as_given["state"])
    with torch.no_grad():
        torch.testing.assert_close(model(probe), expected, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="unwrap"):
        method(probe)


def test_wrapping_keeps_the_batchnorm_statistics_in_the_state_dict() -> None:
    model = _plain_cnn()
    given = copy.deepcopy(model.state_dict())
    method = eatta.create("tent", model)
    assert "1.running_mean" in model.state_dict()
    assert nested_equal(model.state_dict(), given)  # wrapping changes modes, not values
    assert method.given is not model and method.given.training is False


@pytest.mark.parametrize("channels_last", [False, True])
def test_weights_loaded_after_configuring_are_the_given_ones(channels_last: bool) -> None:
    model = _plain_cnn()
    params = eatta.configure(model)  # the modes as given are recorded here ...
    trained = _plain_cnn(seed=1)
    model.load_state_dict(trained.state_dict())  # ... the weights are loaded after
    trained.eval()
    optimizer = torch.optim.SGD(params, lr=0.01)
    method = eatta.EATTA(model, optimizer, oracle=SimulatedAnnotator(), channels_last=channels_last)
    probe = torch.rand(8, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = trained(probe)
        torch.testing.assert_close(method.given_logits(probe), expected, rtol=0, atol=0)
    for x, y in _batches(3):
        method(x, labels=y)
    back = method.unwrap()
    assert back.training is False and all(p.requires_grad for p in back.parameters())
    assert nested_equal(back.state_dict(), trained.state_dict())
    assert all(p.is_contiguous() for p in back.parameters())  # the memory format as given
    with torch.no_grad():
        torch.testing.assert_close(back(probe), expected, rtol=0, atol=0)


def _safe(annotator: Any) -> eatta.AdaptiveMethod:
    return eatta.create("eatta-stable", _plain_cnn(), oracle=annotator, budget=1)


def test_a_resume_with_an_asynchronous_annotator_keeps_its_pending_answers(
    checkpoint_round_trip,
) -> None:
    batches = _batches(12, size=16, seed=3)
    live = _safe(SimulatedAnnotator(delay=4, seed=0))
    for x, y in batches[:5]:
        live(x, labels=y)
    state = checkpoint_round_trip(live.state_dict())
    resumed = _safe(SimulatedAnnotator(delay=4, seed=0))  # a fresh annotator: nothing pending
    resumed.load_state_dict(state)
    for x, y in batches[5:]:
        torch.testing.assert_close(live(x, labels=y), resumed(x, labels=y), rtol=0, atol=0)
    assert resumed.annotation_stats["received"] == live.annotation_stats["received"] > 3


class Forgetful(QueuedAnnotator):
    """An asynchronous annotator that keeps its answers in memory and cannot save them."""

    def on_submit(self, requests):  # never answers: the requests stay pending
        pass

    state_dict = None  # type: ignore[assignment]
    load_state_dict = None  # type: ignore[assignment]


def test_saving_with_answers_pending_at_an_annotator_that_cannot_keep_them_is_refused() -> None:
    method = _safe(Forgetful())
    for x, _ in _batches(2):
        method(x)
    with pytest.raises(RuntimeError, match="pending at Forgetful"):
        method.state_dict()
