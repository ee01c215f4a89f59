"""The given-model fallback: what is served, when it switches and resets, that it measures with
the method's own answers (no extra label), the given model kept as given, state, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import eatta
from conftest import bytes_round_trip, nested_equal, tiny_cnn
from eatta.annotate.oracle import GroundTruthOracle
from eatta.methods.base import AdaptiveMethod
from eatta.monitor.fallback import GivenModelFallback

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

C = 6


class Fixed(AdaptiveMethod):
    """A 'method' that serves a fixed classifier and counts the resets asked of it."""

    adapts = False

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.resets = 0

    def forward_and_adapt(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def reset(self, *, keep_monitor: bool = False) -> None:
        self.resets += 1
        super().reset(keep_monitor=keep_monitor)


def linear(mapping: list[int]) -> nn.Linear:
    """A classifier of one-hot inputs sending class c to mapping[c]."""
    lin = nn.Linear(C, C, bias=False)
    with torch.no_grad():
        lin.weight.zero_()
        for c, m in enumerate(mapping):
            lin.weight[m, c] = 4.0
    return lin


RIGHT = list(range(C))
HALF_WRONG = [0, 1, 2, 4, 5, 3]  # classes 3-5 misread


def batches(n: int, size: int = 12, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        y = torch.randint(0, C, (size,), generator=g)
        out.append((torch.eye(C)[y], y))
    return out


class CountingOracle(GroundTruthOracle):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[int] = []

    def __call__(self, inputs, indices):  # type: ignore[no-untyped-def]
        self.asked.append(len(indices))
        return super().__call__(inputs, indices)


def guarded(adapted: list[int], given: list[int], **kw):  # type: ignore[no-untyped-def]
    method = Fixed(linear(adapted))
    auditor = CountingOracle()
    method.fallback = GivenModelFallback(linear(given), auditor=auditor, **kw)
    return method, auditor


def test_starts_on_the_given_model_and_switches_once_the_adapted_one_is_shown_better():
    method, auditor = guarded(RIGHT, HALF_WRONG, min_answers=8, start="given")
    served = []
    for x, y in batches(30):
        out = method(x, labels=y)
        served.append("adapted" if torch.equal(out, method.model(x)) else "given")
        if served[-1] == "given":
            assert torch.equal(out, method.fallback.given(x))  # type: ignore[union-attr]
    assert served[:8] == ["given"] * 8  # no decision before min_answers answers
    assert served[-1] == "adapted"
    kinds = [e.kind for e in method.fallback.events]  # type: ignore[union-attr]
    assert kinds == ["serve adapted"]
    assert method.resets == 0
    assert auditor.asked == [1] * 30  # one audit a batch: the budget
    assert method.fallback.stats()["answers"] == 30  # type: ignore[union-attr]


def test_a_worse_adapted_model_is_never_served_and_is_reset():
    method, _ = guarded(HALF_WRONG, RIGHT, min_answers=8, window=16, start="given")
    for x, y in batches(40):
        out = method(x, labels=y)
        assert torch.equal(out, method.fallback.given(x))  # type: ignore[union-attr]
    events = method.fallback.events  # type: ignore[union-attr]
    assert events and all(e.kind == "reset: worse than given" for e in events)
    assert method.resets == len(events) >= 1
    assert all(e.high < 0 for e in events)


def test_the_estimate_is_the_paired_difference_by_hand():
    """Each audit adds (1[y = adapted] - 1[y = given]) / (n q): with explore=1 and equal
    entropies q = 1/n, so each estimate is exactly the sample's paired difference."""
    method, _ = guarded(RIGHT, HALF_WRONG, explore=1.0, act=False)
    x, y = batches(1, size=12)[0]
    method(x, labels=y)
    fb = method.fallback
    assert fb is not None
    (value,) = list(fb._window)  # type: ignore[attr-defined]
    assert value in (0.0, 1.0)  # adapted right always; given wrong on classes 3-5
    n, gain = fb.period_gain(0)
    assert n == 1 and gain == value


def test_measure_only_never_switches():
    method, _ = guarded(HALF_WRONG, RIGHT, act=False, min_answers=2)
    for x, y in batches(20):
        assert torch.equal(method(x, labels=y), method.model(x))
    assert method.fallback.events == [] and method.resets == 0  # type: ignore[union-attr]
    assert method.fallback.interval()[1] < 0  # type: ignore[union-attr]  # but it measured


def test_gain_that_falls_resets():
    """Better than the given model, then no better: the drop below an earlier block resets."""
    method, _ = guarded(RIGHT, HALF_WRONG, window=16, min_answers=8, explore=1.0)
    data = batches(80)
    for x, y in data[:40]:
        method(x, labels=y)
    method.model.load_state_dict(linear(HALF_WRONG).state_dict())  # now the given model's equal
    for x, y in data[40:]:
        method(x, labels=y)
    events = method.fallback.events  # type: ignore[union-attr]
    fell = [e for e in events if e.kind == "reset: gain fell"]
    assert fell and fell[0].high >= 0.0  # not worse than the given model: its gain fell
    assert method.resets == len(fell)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"window": 1}, "fallback window"),
        ({"level": 0.0}, "fallback level"),
        ({"min_answers": 1}, "min_answers"),
        ({"min_answers": 10, "window": 4}, "must not exceed"),
        ({"start": "maybe"}, "start"),
        ({"audits": 0}, "audits"),
        ({"explore": 0.0}, "explore"),
    ],
)
def test_bad_settings_are_refused(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GivenModelFallback(linear(RIGHT), auditor=GroundTruthOracle(), **kw)


def test_draw_and_auditor_together_are_refused():
    from eatta.selection.drawn import DisagreementDraw

    with pytest.raises(ValueError, match="not both"):
        GivenModelFallback(linear(RIGHT), draw=DisagreementDraw(), auditor=GroundTruthOracle())


@pytest.mark.parametrize("kw", [{"audits": 2}, {"explore": 0.5}])
def test_audit_settings_with_the_methods_own_draw_are_refused(kw):
    """With draw= no audit is made: an audit setting would be silently ignored."""
    from eatta.selection.drawn import DisagreementDraw

    with pytest.raises(ValueError, match="audits= and explore="):
        GivenModelFallback(linear(RIGHT), draw=DisagreementDraw(), **kw)


# -- eatta-safe: the registered method ---------------------------------------------------------


def cnn_stream(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 5, (16,), generator=g))
        for _ in range(n)
    ]


def trained_cnn() -> nn.Module:
    """tiny_cnn with running statistics that differ from a fresh BatchNorm's."""
    model = tiny_cnn(5, seed=1)
    model.train()
    with torch.no_grad():
        for x, _ in cnn_stream(3, seed=9):
            model(x * 2 + 1)
    return model.eval()


def test_eatta_safe_keeps_the_given_model_and_serves_it_first():
    model = trained_cnn()
    given = copy.deepcopy(model)
    oracle = CountingOracle()
    method = eatta.create("eatta-safe", model, oracle=oracle, lr=0.05)
    fb = method.fallback
    assert isinstance(fb, GivenModelFallback)
    assert nested_equal(fb.given.state_dict(), given.state_dict())  # running statistics kept
    assert model[1].running_mean is None  # the adapted copy normalizes with the batch
    x, y = cnn_stream(1)[0]
    out = method(x, labels=y)
    assert torch.equal(out, given(x))  # served: the given model, batch-free
    assert oracle.asked == [1] and method.labels_used == 1  # measuring took no extra label


def test_eatta_safe_uses_no_label_beyond_the_budget():
    oracle = CountingOracle()
    method = eatta.create("eatta-safe", trained_cnn(), oracle=oracle, lr=0.05, budget=2)
    for x, y in cnn_stream(6):
        method(x, labels=y)
    assert sum(oracle.asked) == method.labels_used <= 12
    assert method.fallback.stats()["answers"] == method.labels_used  # type: ignore[union-attr]


def test_eatta_safe_resumes_bit_identically():
    data = cnn_stream(8)
    a = eatta.create("eatta-safe", trained_cnn(), oracle=GroundTruthOracle(), lr=0.05)
    for x, y in data[:4]:
        a(x, labels=y)
    state = bytes_round_trip(a.state_dict())
    b = eatta.create("eatta-safe", trained_cnn(), oracle=GroundTruthOracle(), lr=0.05)
    b.load_state_dict(state)
    for x, y in data[4:]:
        assert torch.equal(a(x, labels=y), b(x, labels=y))
    assert nested_equal(a.fallback.state_dict(), b.fallback.state_dict())  # type: ignore[union-attr]


def test_eatta_safe_reset_clears_the_fallback():
    method = eatta.create("eatta-safe", trained_cnn(), oracle=GroundTruthOracle(), lr=0.05)
    for x, y in cnn_stream(3):
        method(x, labels=y)
    assert method.fallback.stats()["answers"] == 3  # type: ignore[union-attr]
    method.reset()
    assert method.fallback.stats()["answers"] == 0  # type: ignore[union-attr]
    assert method.fallback.serving == "given"  # type: ignore[union-attr]


def test_eatta_safe_refuses_a_class_history_before_touching_the_model():
    model = trained_cnn()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="history"):
        eatta.create("eatta-safe", model, oracle=GroundTruthOracle(), history="reference")
    assert nested_equal(model.state_dict(), before)
    with pytest.raises(ValueError, match="fallback_window"):
        eatta.create("eatta-safe", model, oracle=GroundTruthOracle(), fallback_window=1)


def test_without_answers_a_collapsed_given_model_gives_way_to_the_adapted_one():
    """No answer ever comes: the label-free collapse test alone decides what is served."""
    collapsed = [0] * C  # the given model puts every sample in class 0
    method = Fixed(linear(RIGHT))
    method.fallback = GivenModelFallback(linear(collapsed), auditor=lambda x, i: None)
    data = batches(6)
    out = method(*data[0][:1])  # the first batch: no history yet, the given model is served
    assert torch.equal(out, method.fallback.given(data[0][0]))  # type: ignore[union-attr]
    ratio_before = method.fallback.collapse_ratio()  # type: ignore[union-attr]
    assert ratio_before == 0.0  # entropy 0 against the adapted model's spread
    for x, _ in data[1:]:
        assert torch.equal(method(x), method.model(x))  # served: the adapted model
    assert method.fallback.stats()["answers"] == 0  # type: ignore[union-attr]
    assert method.fallback.prior_switches == 1  # type: ignore[union-attr]


def test_without_answers_a_working_given_model_is_kept():
    """Spread predictions, and the two differ on one class of six (about 17 % of the samples,
    under the threshold, here 0.4)."""
    method = Fixed(linear([0, 1, 2, 3, 4, 0]))
    method.fallback = GivenModelFallback(
        linear(RIGHT), auditor=lambda x, i: None, prior_disagreement=0.4
    )
    for x, _ in batches(6):
        assert torch.equal(method(x), method.fallback.given(x))  # type: ignore[union-attr]
    fb = method.fallback
    assert fb.collapse_ratio() >= 0.9 and fb.disagreement_rate() < 0.4  # type: ignore[union-attr]


def test_without_answers_models_far_apart_serve_the_adapted_one():
    """Neither collapsed, but they disagree on half the samples: the given model's statistics
    no longer fit, the adapted model is served."""
    method = Fixed(linear(RIGHT))
    method.fallback = GivenModelFallback(linear(HALF_WRONG), auditor=lambda x, i: None)
    data = batches(6)
    method(data[0][0])
    assert method.fallback.disagreement_rate() > 0.3  # type: ignore[union-attr]
    for x, _ in data[1:]:
        assert torch.equal(method(x), method.model(x))


def test_start_given_waits_for_evidence_whatever_the_collapse():
    method = Fixed(linear(RIGHT))
    method.fallback = GivenModelFallback(linear([0] * C), auditor=lambda x, i: None, start="given")
    for x, _ in batches(5):
        assert torch.equal(method(x), method.fallback.given(x))  # type: ignore[union-attr]


def test_collapse_ratio_by_hand():
    fb = GivenModelFallback(linear(RIGHT), auditor=GroundTruthOracle())
    fb._given_pred = torch.tensor([0, 0, 1, 1])  # type: ignore[attr-defined]
    fb._record_marginals(torch.tensor([0, 1, 2, 3]))  # type: ignore[attr-defined]
    want = (2 * -(0.5 * torch.log(torch.tensor(0.5)))) / (
        4 * -(0.25 * torch.log(torch.tensor(0.25)))
    )
    assert fb.collapse_ratio() == pytest.approx(float(want), rel=1e-12)  # ln 2 / ln 4 = 0.5


def test_undecided_evidence_keeps_what_is_served_whatever_the_label_free_signs_say():
    """Once there are answers, an interval around 0 keeps the served model: the label-free signs
    (here: the two disagree on half the samples, which alone would serve the adapted model)
    only decide before there is evidence."""
    method, _ = guarded(HALF_WRONG, RIGHT, window=16, min_answers=8, reset=False)
    data = batches(60)
    for x, y in data[:30]:
        method(x, labels=y)
    fb = method.fallback
    assert fb.serving == "given"  # type: ignore[union-attr]  # the adapted one was shown worse
    fb.given.load_state_dict(linear([0, 1, 2, 5, 3, 4]).state_dict())  # type: ignore[union-attr]
    for x, y in data[30:]:  # now both err on classes 3-5, differently: every estimate is 0
        method(x, labels=y)
    assert fb.prior_choice() == "adapted"  # type: ignore[union-attr]
    assert fb.interval()[1] == 0.0  # type: ignore[union-attr]
    assert fb.serving == "given"  # type: ignore[union-attr]
