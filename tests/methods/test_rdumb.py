"""RDumb: ETA restarted from the source model every ``reset_every`` batches."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import eatta
from _state_checks import differences, exact_state
from conftest import confident_cnn, image_batches
from eatta import configure
from eatta.methods.eta import ETA
from eatta.methods.rdumb import RDumb

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches


def sgd(model: torch.nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(configure(model), lr=0.1, momentum=0.9)


def make_rdumb(reset_every: int) -> RDumb:
    model = confident_cnn(seed=0)
    return RDumb(model, sgd(model), reset_every=reset_every)


def make_eta() -> ETA:
    model = confident_cnn(seed=0)
    return ETA(model, sgd(model))


def batches(n: int) -> list[torch.Tensor]:
    return image_batches(n, size=16, seed=4)


def without(state: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``state`` without the global RNG and the given method-state keys."""
    out = {k: v for k, v in state.items() if k != "torch_rng"}
    out["method"] = {k: v for k, v in state["method"].items() if k not in keys}
    return out


def test_the_model_restarts_before_batch_n_2n_not_earlier_or_later():
    """Outputs and states are those of a fresh ETA started at batches 0, 3 and 6."""
    xs = batches(8)
    rdumb = make_rdumb(3)
    got = [rdumb(x) for x in xs]
    for lo, hi in [(0, 3), (3, 6), (6, 8)]:
        eta = make_eta()
        want = [eta(x) for x in xs[lo:hi]]
        for t, w in zip(range(lo, hi), want, strict=True):
            assert torch.equal(got[t], w), f"batch {t}"
    # the end state is that of a fresh ETA after batches 6 and 7 (probability average included)
    assert not differences(without(exact_state(rdumb), "num_steps"), without(exact_state(eta)))
    assert (rdumb.num_steps, rdumb.num_resets) == (8, 2)
    # the restarts change something: without them batch 3 is predicted differently
    eta = make_eta()
    assert not torch.equal([eta(x) for x in xs[:4]][3], got[3])


def test_the_restart_restores_source_weights_optimizer_and_eta_state_bit_for_bit(monkeypatch):
    """The state the batch after each restart starts from is exactly a fresh method's."""
    seen: dict[int, dict[str, Any]] = {}
    original = ETA.forward_and_adapt

    def spy(self: ETA, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self, RDumb):
            seen[self.num_steps] = exact_state(self)
        return original(self, x)

    monkeypatch.setattr(ETA, "forward_and_adapt", spy)
    rdumb = make_rdumb(2)
    fresh = exact_state(rdumb)
    for x in batches(5):
        rdumb(x)
    assert rdumb.model_probs is not None and rdumb.num_kept > 0
    for t in (2, 4):
        want = copy.deepcopy(fresh)
        want["method"]["num_steps"] = t
        assert not differences(want, seen[t]), f"restart before batch {t}"
    # before the other batches the state is not the source's (the restart is what restores it)
    for t in (1, 3):
        assert differences(without(fresh, "num_steps"), without(seen[t], "num_steps"))


@pytest.mark.parametrize("saved_after", [1, 2, 3])
def test_resume_across_a_restart_is_bit_identical(saved_after, checkpoint_round_trip):
    xs = batches(6)
    a = make_rdumb(2)
    for x in xs[:saved_after]:
        a(x)
    state = checkpoint_round_trip(a.state_dict())
    assert state["_extra_state"]["method"]["num_steps"] == saved_after
    tail_a = [a(x) for x in xs[saved_after:]]
    b = make_rdumb(2)
    b.load_state_dict(state)
    tail_b = [b(x) for x in xs[saved_after:]]
    assert all(torch.equal(p, q) for p, q in zip(tail_a, tail_b, strict=True))
    assert not differences(exact_state(a), exact_state(b))


def test_reset_every_one_adapts_each_batch_from_the_source():
    xs = batches(4)
    rdumb = make_rdumb(1)
    for t, x in enumerate(xs):
        out = rdumb(x)
        eta = make_eta()
        assert torch.equal(out, eta(x)), f"batch {t}"
        assert not differences(without(exact_state(rdumb), "num_steps"), without(exact_state(eta)))
    assert rdumb.num_resets == 3


def test_reset_restores_creation_state_and_zeroes_the_counter():
    xs = batches(5)
    rdumb = make_rdumb(3)
    initial = exact_state(rdumb)
    first = [rdumb(x) for x in xs]
    assert rdumb.num_steps == 5
    rdumb.reset()
    assert rdumb.num_steps == 0 and rdumb.num_resets == 0
    assert not differences(initial, exact_state(rdumb))
    again = [rdumb(x) for x in xs]  # the restarts happen at the same batches again
    assert all(torch.equal(p, q) for p, q in zip(first, again, strict=True))


@pytest.mark.parametrize("bad", [0, -3, 2.0, 1.5, True, "10", None])
def test_bad_interval_is_a_value_error_before_anything_changes(bad):
    model = confident_cnn()
    params = configure(model)
    for p in params:
        p.requires_grad_(False)  # ETA's constructor would switch these on
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD(params, lr=0.1)
    with pytest.raises(ValueError, match=f"reset_every must be an integer >= 1, got {bad!r}"):
        RDumb(model, opt, reset_every=bad)
    assert not any(p.requires_grad for p in params)
    assert not differences(before, model.state_dict())


@pytest.mark.parametrize(("bad", "error"), [(0, ValueError), (True, TypeError), (2.5, TypeError)])
def test_registry_rejects_bad_intervals(bad, error):
    with pytest.raises(error, match="'reset_every' of method 'rdumb'"):
        eatta.create("rdumb", confident_cnn(), reset_every=bad)


def test_registry_builds_eta_with_the_paper_interval():
    m = eatta.create("rdumb", confident_cnn(), dataset="digits-c")
    assert isinstance(m, RDumb) and m.reset_every == 1000
    group = m.optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (5e-3, 0.9, False)
    assert eatta.create("rdumb", confident_cnn(), reset_every=7).reset_every == 7
    text = eatta.describe("rdumb")
    assert "reset_every: int = 1000" in text and "d_margin" in text
