"""The source-model fallback: what is served, when it switches and resets, that it measures with
the method's own answers (no extra label), the source model kept as given, state, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from typing_extensions import Unpack

import eatta
from conftest import bytes_round_trip, nested_equal, tiny_cnn
from eatta.annotate.oracle import GroundTruthOracle, OracleError
from eatta.annotate.requests import Answer
from eatta.methods.base import AdaptiveMethod, Parts
from eatta.monitor.evidence import drift_answers
from eatta.monitor.fallback import SourceFallback, safe_parts

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

C = 6


class Fixed(AdaptiveMethod):
    """A 'method' given ``given`` that serves a fixed classifier, ``fixed`` (as if it had
    adapted to it), and counts the resets asked of it."""

    adapts = False

    def __init__(self, given: nn.Module, fixed: nn.Module, **parts: Unpack[Parts]) -> None:
        super().__init__(given, **parts)
        self.fixed = fixed
        self.resets = 0

    def forward_and_adapt(self, x: torch.Tensor) -> torch.Tensor:
        return self.fixed(x)

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
    auditor = CountingOracle()
    fallback = SourceFallback(auditor=auditor, **kw)
    method = Fixed(linear(given), linear(adapted), fallback=fallback)
    return method, auditor


def served_by(method: Fixed, x: torch.Tensor, out: torch.Tensor) -> str:
    fb = method.fallback
    assert fb is not None
    if torch.equal(out, method.fixed(x)):
        return "adapted"
    assert torch.equal(out, method.given_logits(x))
    return "source"


def test_starts_on_the_source_model_and_switches_once_the_adapted_one_is_shown_better():
    """The switch comes at the first answer whose bettor's wealth reaches 1 / level = 20, and
    from the next batch on the adapted model is served."""
    method, auditor = guarded(RIGHT, HALF_WRONG)
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    served, up = [], []
    for x, y in batches(30):
        served.append(served_by(method, x, method(x, labels=y)))
        up.append(fb.test.up)
    (switch,) = fb.events
    assert switch.kind == "serve adapted" and switch.up >= 20.0 > switch.down
    first = switch.step  # the batch whose answer decided (1-based)
    assert served[:first] == ["source"] * first
    assert served[first:] == ["adapted"] * (30 - first)
    assert all(u < 20.0 for u in up[: first - 1])  # no earlier answer reached the threshold
    assert method.resets == 0
    assert auditor.asked == [1] * 30  # one audit a batch: the budget
    assert fb.stats()["answers"] == 30


def test_a_worse_adapted_model_is_never_served_and_is_reset():
    method, _ = guarded(HALF_WRONG, RIGHT, reset=True)
    fb = method.fallback
    assert fb is not None
    for x, y in batches(40):
        assert served_by(method, x, method(x, labels=y)) == "source"
    events = fb.events  # type: ignore[attr-defined]
    assert events and all(e.kind == "reset: worse than given" for e in events)
    assert all(e.down >= 20.0 for e in events)
    assert method.resets == len(events) >= 1


def test_the_estimate_is_the_paired_difference_by_hand():
    """Each audit adds (1[y = adapted] - 1[y = given]) / (n q): with explore=1 and equal
    entropies q = 1/n, so each estimate is exactly the sample's paired difference."""
    method, _ = guarded(RIGHT, HALF_WRONG, explore=1.0, act=False)
    x, y = batches(1, size=12)[0]
    method(x, labels=y)
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    assert fb.test.answers == 1
    value = fb.test.total
    assert value in (0.0, 1.0)  # adapted right always; given wrong on classes 3-5
    n, gain = fb.period_gain(0)
    assert n == 1 and gain == value


def test_measure_only_never_switches():
    method, _ = guarded(HALF_WRONG, RIGHT, act=False)
    for x, y in batches(20):
        assert torch.equal(method(x, labels=y), method.fixed(x))
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    assert fb.events == [] and method.resets == 0
    assert fb.evidence()[1] < 0  # but it measured


DRIFTED = [1, 2, 0, 4, 5, 3]  # misreads 0-2 (the source model reads them right), 3-5 as it does


def test_a_model_that_drifts_after_it_was_trusted_is_caught_within_the_stated_answers():
    """Trusted for 300 answers, then wrong wherever the two differ (the source model right
    there): the source model is served again within drift_answers(window, level) answers (22 at
    the defaults), whatever the length of the trust."""
    method, _ = guarded(RIGHT, HALF_WRONG, explore=0.01)
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    data = batches(340, seed=3)
    for x, y in data[:300]:
        method(x, labels=y)
    assert fb.serving == "adapted" and [e.kind for e in fb.events] == ["serve adapted"]
    method.fixed.load_state_dict(linear(DRIFTED).state_dict())
    bound = drift_answers(fb.recent, fb.level)
    assert bound == 22
    caught = None
    for i, (x, y) in enumerate(data[300:], start=1):
        method(x, labels=y)
        if fb.serving == "source":
            caught = i
            break
    assert caught is not None and caught <= bound
    kinds = [e.kind for e in fb.events]
    assert kinds == ["serve adapted", "serve given", "reset: worse than given"]
    assert fb.events[1].down >= 20.0 and fb.events[1].step == 300 + caught


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"recent": 0}, "at least 1 answer"),
        ({"level": 0.0}, "fallback level"),
        ({"level": 1.0}, "fallback level"),
        ({"level": 1.5}, "fallback level"),
        ({"start": "maybe"}, "start"),
        ({"audits": 0}, "audits"),
        ({"explore": 0.0}, "explore"),
    ],
)
def test_bad_settings_are_refused(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SourceFallback(auditor=GroundTruthOracle(), **kw)


def test_labels_outside_the_given_models_classes_are_refused_before_any_change():
    method, _ = guarded(RIGHT, HALF_WRONG)
    x, y = batches(1)[0]
    before = copy.deepcopy(method.fallback.state_dict())  # type: ignore[union-attr]
    with pytest.raises(OracleError, match=r"classes of the model, in \[0, 6\)"):
        method(x, labels=torch.full_like(y, C))
    assert nested_equal(method.fallback.state_dict(), before)  # type: ignore[union-attr]
    assert method.fallback.answers == 0  # type: ignore[union-attr]


class StrayAuditor:
    """An asynchronous auditor that answers a request nobody sent."""

    feedback = "label"

    def submit(self, requests):  # type: ignore[no-untyped-def]
        self.sent = list(requests)

    def collect(self):  # type: ignore[no-untyped-def]
        return [Answer("someone-else-3", label=1)]

    def cancel(self, ids):  # type: ignore[no-untyped-def]
        pass


def test_an_audit_answer_for_a_sample_never_asked_about_is_an_error():
    fb = SourceFallback(auditor=StrayAuditor())
    method = Fixed(linear(HALF_WRONG), linear(RIGHT), fallback=fb)
    x, _ = batches(1)[0]
    with pytest.raises(OracleError, match="never asked"):
        method(x)
    assert fb.answers == 0 and fb.test.answers == 0


def test_safe_parts_read_the_methods_own_answers_and_refuse_an_auditor():
    with pytest.raises(TypeError, match="no auditor="):
        safe_parts(auditor=GroundTruthOracle())
    parts = safe_parts(recent=8)
    assert parts["balance"] is None and parts["selector"].draws
    assert parts["fallback"].auditor is None and parts["fallback"].recent == 8


@pytest.mark.parametrize("kw", [{"audits": 2}, {"explore": 0.5}])
def test_audit_settings_without_an_auditor_are_refused(kw):
    """Without an auditor no audit is made: an audit setting would be silently ignored."""
    with pytest.raises(ValueError, match="audits= and explore="):
        SourceFallback(**kw)


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


def test_eatta_safe_keeps_the_source_model_and_serves_it_first():
    model = trained_cnn()
    given = copy.deepcopy(model)
    oracle = CountingOracle()
    method = eatta.create("eatta-safe", model, oracle=oracle, lr=0.05)
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    assert nested_equal(method.given.state_dict(), given.state_dict())  # running statistics kept
    assert not model[1].track_running_stats  # the adapted model normalizes with the batch
    x, y = cnn_stream(1)[0]
    out = method(x, labels=y)
    assert torch.equal(out, given(x))  # served: the source model, batch-free
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
    assert method.fallback.serving == "source"  # type: ignore[union-attr]


def test_eatta_safe_refuses_a_class_history_before_touching_the_model():
    model = trained_cnn()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="balance"):
        eatta.create("eatta-safe", model, oracle=GroundTruthOracle(), balance="reference")
    assert nested_equal(model.state_dict(), before)
    with pytest.raises(ValueError, match="fallback_recent"):
        eatta.create("eatta-safe", model, oracle=GroundTruthOracle(), fallback_recent=0)
    with pytest.raises(ValueError, match="fallback level"):
        eatta.create("eatta-safe", model, oracle=GroundTruthOracle(), fallback_level=1.0)
    assert nested_equal(model.state_dict(), before)


def test_without_answers_a_collapsed_source_model_gives_way_to_the_adapted_one():
    """No answer ever comes: the label-free collapse test alone decides what is served."""
    collapsed = [0] * C  # the source model puts every sample in class 0
    fb = SourceFallback(auditor=lambda x, i: None, start="auto")
    method = Fixed(linear(collapsed), linear(RIGHT), fallback=fb)
    data = batches(6)
    out = method(*data[0][:1])  # the first batch: no history yet, the source model is served
    assert torch.equal(out, method.given_logits(data[0][0]))
    ratio_before = fb.signs.collapse_ratio()
    assert ratio_before == 0.0  # entropy 0 against the adapted model's spread
    for x, _ in data[1:]:
        assert torch.equal(method(x), method.fixed(x))  # served: the adapted model
    assert method.fallback.stats()["answers"] == 0  # type: ignore[union-attr]
    assert fb.stats()["prior_switches"] == 1


def test_without_answers_a_working_source_model_is_kept():
    """Spread predictions, and the two differ on one class of six (about 17 % of the samples,
    under the threshold, here 0.4)."""
    fb = SourceFallback(auditor=lambda x, i: None, prior_disagreement=0.4, start="auto")
    method = Fixed(linear(RIGHT), linear([0, 1, 2, 3, 4, 0]), fallback=fb)
    for x, _ in batches(6):
        assert torch.equal(method(x), method.given_logits(x))
    assert fb.signs.collapse_ratio() >= 0.9 and fb.signs.disagreement_rate() < 0.4


def test_without_answers_models_far_apart_serve_the_adapted_one():
    """Neither collapsed, but they disagree on half the samples: the source model's statistics
    no longer fit, the adapted model is served."""
    fb = SourceFallback(auditor=lambda x, i: None, start="auto")
    method = Fixed(linear(HALF_WRONG), linear(RIGHT), fallback=fb)
    data = batches(6)
    method(data[0][0])
    assert fb.signs.disagreement_rate() > 0.3
    for x, _ in data[1:]:
        assert torch.equal(method(x), method.fixed(x))


def test_start_given_waits_for_evidence_whatever_the_collapse():
    fb = SourceFallback(auditor=lambda x, i: None, start="source")
    method = Fixed(linear([0] * C), linear(RIGHT), fallback=fb)
    for x, _ in batches(5):
        assert torch.equal(method(x), method.given_logits(x))


def test_without_answers_the_source_model_serves_by_default():
    """No answer, no evidence: the default start serves the source model, even where the
    unvalidated label-free signs would serve the adapted one."""
    fb = SourceFallback(auditor=lambda x, i: None)
    method = Fixed(linear([0] * C), linear(RIGHT), fallback=fb)
    signs = SourceFallback(auditor=lambda x, i: None, start="auto")
    twin = Fixed(linear([0] * C), linear(RIGHT), fallback=signs)
    for x, _ in batches(5):
        assert torch.equal(method(x), method.given_logits(x))
        twin(x)
    assert fb.stats()["prior_switches"] == 0
    assert signs.stats()["prior_switches"] == 1 and signs.serving == "adapted"


def test_undecided_evidence_keeps_what_is_served_whatever_the_label_free_signs_say():
    """Once a decision was taken, estimates of 0 keep the served model: the label-free signs
    (here: the two disagree on half the samples, which alone would serve the adapted model)
    only decide before the first decision."""
    method, _ = guarded(HALF_WRONG, RIGHT, start="auto")
    data = batches(60)
    for x, y in data[:30]:
        method(x, labels=y)
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    assert fb.serving == "source" and fb.events  # the adapted one was shown worse
    method.given.load_state_dict(linear([0, 1, 2, 5, 3, 4]).state_dict())
    answers, total = fb.test.answers, fb.test.total
    for x, y in data[30:]:  # now both err on classes 3-5, differently: every estimate is 0
        method(x, labels=y)
    assert fb.signs.choice() == "adapted"
    assert fb.test.answers == answers + 30 and fb.test.total == total
    assert fb.serving == "source"


def test_an_adapted_model_found_worse_while_the_source_serves_can_still_be_trusted_later():
    """Worse at first (wrong on classes 2-4, where the source model is right), then better (right
    everywhere; the source model misreads class 5), without resets: each alarm while the source
    model is served is recorded and the evidence starts over from it, so the later answers decide
    for the adapted model. (Before, the detector's wealth stayed above its threshold while the
    recent answers favoured the adapted model and its "worse" blocked every "better": with the
    up bettor at 1e22 the source model was still served.)"""
    fb = SourceFallback(auditor=GroundTruthOracle(), reset=False)
    method = Fixed(linear([0, 1, 2, 3, 4, 0]), linear([0, 1, 3, 4, 2, 5]), fallback=fb)
    data = batches(300, seed=2)
    for x, y in data[:60]:
        assert served_by(method, x, method(x, labels=y)) == "source"
    found = [e for e in fb.events if e.kind == "adapted found worse"]
    assert found and all(e.down >= 20.0 for e in found) and fb.stats()["switches"] == 0
    assert method.resets == 0
    method.fixed.load_state_dict(linear(RIGHT).state_dict())
    for x, y in data[60:]:
        method(x, labels=y)
        if fb.serving == "adapted":
            break
    assert fb.serving == "adapted" and fb.events[-1].kind == "serve adapted"
    assert fb.events[-1].step - 60 <= 60  # within 60 answers of turning better (35 here)


def test_with_an_auditor_the_promise_measures_what_served_and_holds():
    """A label-free method with audits under the promise: a better adapted model comes to serve
    whole batches once the audits (drawn where what served differs) certify it; a worse one
    never costs more than the tolerance, at any batch."""
    better, _ = guarded(RIGHT, HALF_WRONG, start="promise", tolerance=5.0)
    fb = better.fallback
    assert isinstance(fb, SourceFallback) and fb.promise is not None
    served = [served_by_promise(better, x, better(x, labels=y)) for x, y in batches(80)]
    # 5 points of 12 samples: 0.6 aside a batch; the second batch may serve one sample
    assert served[:2] == ["source", "part"]
    assert served[-10:] == ["adapted"] * 10
    assert fb.bound is not None and fb.bound < 0 and fb.promise.charged == 0.0
    worse, _ = guarded(HALF_WRONG, RIGHT, start="promise", tolerance=5.0)
    errors = seen = 0
    for x, y in batches(80):
        out = worse(x, labels=y).argmax(1)
        errors += int((out != y).sum())  # the given model (RIGHT) makes none
        seen += len(y)
        assert 100 * errors / seen <= 5.0


def served_by_promise(method: Fixed, x: torch.Tensor, out: torch.Tensor) -> str:
    """``"adapted"``, ``"source"`` or ``"part"`` (some rows of each)."""
    adapted, given = method.fixed(x), method.given_logits(x)
    if torch.equal(out, adapted):
        return "adapted"
    if torch.equal(out, given):
        return "source"
    pairs = zip(out, adapted, given, strict=True)
    rows = [torch.equal(o, a) or torch.equal(o, g) for o, a, g in pairs]
    assert all(rows)
    return "part"
