"""Where a page says one method built two ways is the same, both ways, as the page writes them,
give the same logits batch after batch (exactly: the same operations in the same order).

The code is read from the pages, so an example that drifts from what ``eatta.create`` builds fails
here: docs/start/wrap-a-model.md (the class API and ``create("eatta")``; the paper's Baseline as
EATTA's switches), docs/when-eatta-helps.md (``eatta-stable`` is EATTA with
``BoundedGradNormDebiaser``), docs/benchmarks.md (RDumb is ETA until its first reset).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import eatta
from eatta.debias import BoundedGradNormDebiaser
from eatta.models.digits_cnn import packaged_digits_source

DOCS = Path(__file__).resolve().parents[2] / "docs"
BATCHES = 5


def _page(name: str) -> str:
    return " ".join((DOCS / name).read_text(encoding="utf-8").split())  # sentences on one line


def _first_python_block(name: str) -> str:
    text = (DOCS / name).read_text(encoding="utf-8")
    found = re.search(r"```python\n(.*?)\n```", text, re.S)
    assert found, name
    return found[1]


def _code_before(text: str, claim: str) -> str:
    """The inline code just before ``claim`` in ``text`` (the thing the claim is about)."""
    before = text[: text.index(claim)]
    end = before.rindex("`")
    return before[before.rindex("`", 0, end) + 1 : end]


def _batches() -> list[Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(64, 3, 32, 32, generator=g) for _ in range(BATCHES)]


def _labeller(sample: Tensor) -> int:
    """A stand-in for a person: a class that depends on the sample."""
    return int(sample.sum().item() * 1000) % 10


def _ask(selected_inputs: Tensor, indices: Tensor) -> list[int]:
    return [_labeller(s) for s in selected_inputs]


def _model() -> nn.Module:
    model, _ = packaged_digits_source()
    return model


def _logits(method: Callable[[Tensor], Tensor], batches: list[Tensor]) -> list[Tensor]:
    return [method(x).detach().clone() for x in batches]


def _assert_same(a: list[Tensor], b: list[Tensor]) -> None:
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(u, v), f"batch {i}: the two ways differ by {(u - v).abs().max():.2e}"


def _sgd_as_create_builds(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``create(name, ...)`` builds, from its defaults (no per-dataset row)."""
    hp = eatta.methods.registry.get_spec(name).hparams("default", {})
    params = eatta.configure(model)
    return torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"], nesterov=hp["nesterov"])


def test_wrap_a_model_class_example_is_what_create_builds():
    page = "start/wrap-a-model.md"
    claim = "builds the same method by name"
    batches = _batches()
    ns: dict[str, Any] = {"model": _model(), "x": batches[0], "my_labeller": _labeller}
    exec(compile(_first_python_block(page), page, "exec"), ns)  # the page's class-API example
    by_class = [ns["logits"].detach().clone(), *_logits(ns["adapted"], batches[1:])]
    by_name = eval(
        _code_before(_page(page), claim), {"eatta": eatta, "model": _model(), "ask": ns["ask"]}
    )
    _assert_same(by_class, _logits(by_name, batches))


def test_the_papers_baseline_is_eattas_switches():
    page = _page("start/wrap-a-model.md")
    claim = "(registered as `baseline`)"
    switches = _code_before(page, claim)
    assert switches.startswith("selector=RandomSelector()"), switches
    names = {
        "RandomSelector": eatta.selection.RandomSelector,
        "GradNormDebiaser": eatta.debias.GradNormDebiaser,
    }
    kwargs = eval(f"dict({switches})", names)
    model = _model()
    by_class = eatta.EATTA(model, _sgd_as_create_builds("baseline", model), oracle=_ask, **kwargs)
    by_name = eatta.create("baseline", _model(), oracle=_ask)
    batches = _batches()
    _assert_same(_logits(by_class, batches), _logits(by_name, batches))


def test_eatta_stable_is_eatta_with_the_bounded_debiaser():
    assert "`eatta-stable` is EATTA with `BoundedGradNormDebiaser`" in _page("when-eatta-helps.md")
    model = _model()
    opt = _sgd_as_create_builds("eatta-stable", model)
    by_class = eatta.EATTA(model, opt, oracle=_ask, debiaser=BoundedGradNormDebiaser())
    by_name = eatta.create("eatta-stable", _model(), oracle=_ask)
    batches = _batches()
    _assert_same(_logits(by_class, batches), _logits(by_name, batches))


@pytest.mark.parametrize("reset_every", [1000, 2])
def test_rdumb_is_eta_until_it_restarts(reset_every):
    assert "RDumb only differs from ETA by resetting every 1,000 steps" in _page("benchmarks.md")
    rdumb = eatta.create("rdumb", _model(), reset_every=reset_every)
    eta = eatta.create("eta", _model())
    batches = _batches()
    got, kept_on = _logits(rdumb, batches), _logits(eta, batches)
    if reset_every > BATCHES:
        _assert_same(got, kept_on)
        return
    # restarted before batches 2 and 4: from each restart on, a fresh ETA on the batches since
    for start in range(0, BATCHES, reset_every):
        part = batches[start : start + reset_every]
        _assert_same(got[start : start + reset_every], _logits(eatta.create("eta", _model()), part))
    assert not torch.equal(got[reset_every], kept_on[reset_every])  # the restart shows
