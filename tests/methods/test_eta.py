"""ETA / EATA: reliable, non-redundant, re-weighted entropy minimization (+ Fisher regularizer)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import BAD_BATCHES, check_rejects_without_change
from eatta import configure
from eatta.losses import entropy
from eatta.methods.base import InvalidInputError
from eatta.methods.eta import ETA, EATAFisher, compute_fishers
from eatta.methods.registry import create

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

BN_PARAMS = ["1.weight", "1.bias", "4.weight", "4.bias"]


def sgd(params, lr: float = 0.1, momentum: float = 0.9) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def build_eta(make_confident_model, **kwargs) -> ETA:
    model = make_confident_model(seed=0)
    lr, momentum = kwargs.pop("lr", 0.1), kwargs.pop("momentum", 0.9)
    return ETA(model, sgd(configure(model), lr, momentum), **kwargs)


def build_eata(make_confident_model, make_image_batches, **kwargs) -> EATAFisher:
    model = make_confident_model(seed=0)
    params = configure(model)
    fishers = compute_fishers(model, make_image_batches(2, seed=9))
    lr, momentum = kwargs.pop("lr", 0.1), kwargs.pop("momentum", 0.9)
    return EATAFisher(model, sgd(params, lr, momentum), fishers=fishers, **kwargs)


def params_of(method) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in method.model.named_parameters()}


def expected_update(
    model: nn.Module, x: torch.Tensor, kept: torch.Tensor, margin: float, lr: float
):
    """θ - lr · ∇ [Σ_kept H_i exp(E0 - H_i) / |kept|] on a copy of ``model``."""
    ref = copy.deepcopy(model)
    h = entropy(ref(x))
    w = torch.exp(margin - h.detach()) * kept
    loss = (h * w).sum() / kept.sum()
    named = dict(ref.named_parameters())
    grads = torch.autograd.grad(loss, [named[n] for n in BN_PARAMS])
    return {n: named[n].detach() - lr * g for n, g in zip(BN_PARAMS, grads, strict=True)}


@pytest.mark.parametrize("kind", ["eta", "eata"])
def test_only_norm_affine_parameters_change(kind, make_confident_model, make_image_batches):
    method = (
        build_eta(make_confident_model)
        if kind == "eta"
        else build_eata(make_confident_model, make_image_batches)
    )
    before = params_of(method)
    for x in make_image_batches(3):
        method(x)
    assert method.num_kept > 0
    changed = {k for k, v in params_of(method).items() if not torch.equal(v, before[k])}
    assert changed == set(BN_PARAMS)


def test_first_batch_keeps_reliable_samples_with_entropy_weights(
    make_confident_model, make_image_batches
):
    eta = build_eta(make_confident_model, lr=0.5, momentum=0.0)
    (x,) = make_image_batches(1)
    margin = 0.4 * math.log(5)
    with torch.no_grad():
        logits = copy.deepcopy(eta.model)(x)
    h = entropy(logits)
    reliable = h < margin
    assert 0 < int(reliable.sum()) < len(x)  # a mix, so the filter matters
    want = expected_update(eta.model, x, reliable, margin, lr=0.5)
    eta(x)
    step = eta.last_step
    assert torch.equal(step.reliable, reliable) and torch.equal(step.kept, reliable)
    torch.testing.assert_close(step.weights[reliable], torch.exp(margin - h[reliable]))
    assert torch.all(step.weights[~reliable] == 0)
    now = dict(eta.model.named_parameters())
    for n in BN_PARAMS:
        torch.testing.assert_close(now[n].detach(), want[n])
    torch.testing.assert_close(eta.model_probs, logits.softmax(1)[reliable].mean(0))


def test_redundant_and_unreliable_samples_get_zero_weight(make_confident_model, make_image_batches):
    eta = build_eta(make_confident_model, lr=0.5, momentum=0.0)
    (x,) = make_image_batches(1, seed=3)
    with torch.no_grad():
        logits = copy.deepcopy(eta.model)(x)
    probs = logits.softmax(1)
    h = entropy(logits)
    margin = float(h.median())
    reliable = h < margin
    # a running average equal to the most confident sample's softmax, and a cosine threshold
    # splitting the reliable samples: the ones most similar to the average are redundant
    avg = probs[int(h.argmin())].clone()
    cos = F.cosine_similarity(avg[None], probs, dim=1)
    d_margin = float(cos[reliable].median())
    eta.entropy_margin, eta.d_margin, eta.model_probs = margin, d_margin, avg.clone()
    kept = reliable & (cos < d_margin)
    assert kept.any() and (reliable & ~kept).any() and (~reliable).any()
    want = expected_update(eta.model, x, kept, margin, lr=0.5)
    eta(x)
    step = eta.last_step
    assert torch.equal(step.kept, kept)
    assert torch.all(step.weights[~kept] == 0) and torch.all(step.weights[kept] > 0)
    now = dict(eta.model.named_parameters())
    for n in BN_PARAMS:
        torch.testing.assert_close(now[n].detach(), want[n])
    torch.testing.assert_close(eta.model_probs, 0.9 * avg + 0.1 * probs[kept].mean(0))
    assert (eta.num_reliable, eta.num_kept) == (int(reliable.sum()), int(kept.sum()))


def test_no_kept_sample_means_no_step(make_confident_model, make_image_batches):
    eta = build_eta(make_confident_model, entropy_margin=1e-6)
    before = params_of(eta)
    eta(make_image_batches(1)[0])
    assert not eta.last_step.updated
    assert all(torch.equal(v, before[k]) for k, v in params_of(eta).items())
    assert eta.optimizer.state_dict()["state"] == {}
    assert eta.model_probs is None


def test_compute_fishers_is_mean_squared_pseudo_label_gradient(
    make_confident_model, make_image_batches
):
    model = make_confident_model(seed=0)
    configure(model)
    batches = make_image_batches(3, seed=5)
    named = dict(model.named_parameters())
    want = {n: torch.zeros_like(named[n]) for n in BN_PARAMS}
    for x in batches:
        logits = model(x)
        loss = F.cross_entropy(logits, logits.argmax(1))
        grads = torch.autograd.grad(loss, [named[n] for n in BN_PARAMS])
        for n, g in zip(BN_PARAMS, grads, strict=True):
            want[n] += g**2 / len(batches)
    fishers = compute_fishers(model, [(x, torch.zeros(len(x))) for x in batches])
    assert sorted(fishers) == sorted(BN_PARAMS)
    for n in BN_PARAMS:
        torch.testing.assert_close(fishers[n][0], want[n])
        assert torch.equal(fishers[n][1], named[n].detach())
        assert named[n].grad is None


def test_fisher_term_pulls_parameters_towards_the_anchor(make_confident_model, make_image_batches):
    """EATA's step = ETA's step - lr · 2 α F (θ - θ0) (same kept samples, SGD without momentum)."""
    alpha, lr = 3.0, 0.1
    eta = build_eta(make_confident_model, lr=lr, momentum=0.0)
    model = make_confident_model(seed=0)
    params = configure(model)
    named = dict(model.named_parameters())
    g = torch.Generator().manual_seed(4)
    fishers = {
        n: (torch.rand(named[n].shape, generator=g), named[n].detach() + 0.3) for n in BN_PARAMS
    }
    eata = EATAFisher(model, sgd(params, lr, 0.0), fishers=fishers, fisher_alpha=alpha)
    (x,) = make_image_batches(1)
    theta = params_of(eata)
    eta(x)
    eata(x)
    assert torch.equal(eta.last_step.kept, eata.last_step.kept) and eata.last_step.updated
    after_eta, after_eata = params_of(eta), params_of(eata)
    for n in BN_PARAMS:
        fisher, anchor = fishers[n]
        pull = -lr * 2 * alpha * fisher * (theta[n] - anchor)
        torch.testing.assert_close(after_eata[n] - after_eta[n], pull)
        # towards θ0: every coordinate with F > 0 got closer to its anchor
        assert torch.all((after_eata[n] - anchor).abs() <= (after_eta[n] - anchor).abs() + 1e-7)
    assert float(eata.last_step.loss) > float(eta.last_step.loss)


@pytest.mark.parametrize("kind", ["eta", "eata"])
def test_reset_restores_everything_exactly(
    kind, make_confident_model, make_image_batches, assert_nested_equal
):
    method = (
        build_eta(make_confident_model)
        if kind == "eta"
        else build_eata(make_confident_model, make_image_batches)
    )
    model0 = copy.deepcopy(method.model.state_dict())
    opt0 = copy.deepcopy(method.optimizer.state_dict())
    extra0 = copy.deepcopy(method.method_state())
    xs = make_image_batches(3)
    first = method(xs[0])
    method(xs[1])
    assert method.model_probs is not None and method.optimizer.state_dict()["state"]
    method.reset()
    assert_nested_equal(method.model.state_dict(), model0)
    assert_nested_equal(method.optimizer.state_dict(), opt0)
    assert_nested_equal(method.method_state(), extra0)
    assert method.model_probs is None and method.last_step is None
    assert torch.equal(method(xs[0]), first)


@pytest.mark.parametrize("kind", ["eta", "eata"])
def test_state_dict_round_trip_continues_identically(
    kind, make_confident_model, make_image_batches, checkpoint_round_trip
):
    def make():
        if kind == "eta":
            return build_eta(make_confident_model)
        return build_eata(make_confident_model, make_image_batches, fisher_alpha=50.0)

    a = make()
    xs = make_image_batches(5)
    for x in xs[:3]:
        a(x)
    b = make()
    b.load_state_dict(checkpoint_round_trip(a.state_dict()))
    assert torch.equal(a.model_probs, b.model_probs)
    for x in xs[3:]:
        assert torch.equal(a(x), b(x))
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert (a.num_reliable, a.num_kept) == (b.num_reliable, b.num_kept)


@pytest.mark.parametrize("bad", sorted(BAD_BATCHES))
def test_bad_input_raises_and_changes_nothing(make_confident_model, make_image_batches, bad):
    check_rejects_without_change(build_eta(make_confident_model), make_image_batches(1)[0], bad)


def test_compute_fishers_rejects_bad_data(make_confident_model):
    model = make_confident_model()
    configure(model)
    with pytest.raises(InvalidInputError):
        compute_fishers(model, [torch.full((4, 3, 8, 8), float("nan"))])
    with pytest.raises(ValueError, match="no batches"):
        compute_fishers(model, [])
    with pytest.raises(TypeError):
        compute_fishers(model, ["not a tensor"])


def test_registry_defaults(make_model, make_image_batches):
    eta = create("eta", make_model())
    assert type(eta) is ETA
    group = eta.optimizer.param_groups[0]
    assert isinstance(eta.optimizer, torch.optim.SGD)
    assert (group["lr"], group["momentum"], group["nesterov"]) == (2.5e-4, 0.9, False)
    assert (eta.d_margin, eta.prob_momentum, eta.entropy_margin) == (0.05, 0.9, None)
    pacs = create("eta", make_model(), dataset="pacs")
    assert isinstance(pacs.optimizer, torch.optim.Adam)
    assert pacs.optimizer.param_groups[0]["lr"] == 1e-3

    eata = create("eata", make_model(), dataset="pacs", fisher_data=make_image_batches(2))
    assert isinstance(eata, EATAFisher) and eata.fisher_alpha == 2000.0
    assert isinstance(eata.optimizer, torch.optim.Adam)
    assert sorted(eata.fishers) == sorted(BN_PARAMS)
    with pytest.raises(ValueError, match="fisher_data"):
        create("eata", make_model())


def test_eata_rejects_mismatched_fishers(make_model):
    model = make_model()
    params = configure(model)
    with pytest.raises(ValueError, match="not a model parameter"):
        EATAFisher(model, sgd(params), fishers={"nope": (torch.ones(1), torch.ones(1))})
    with pytest.raises(ValueError, match="shape"):
        EATAFisher(model, sgd(params), fishers={"1.weight": (torch.ones(3), torch.ones(3))})
