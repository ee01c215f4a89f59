"""The monitor on a method: hand-computed scores, unchanged adaptation, late and yes/no answers,
refused answers, guard resets, state and bad input."""

from __future__ import annotations

import copy

import pytest
import torch

import eatta
from _state_checks import differences, exact_state
from conftest import bytes_round_trip, tiny_cnn
from eatta.annotate import Answer, SimulatedAnnotator
from eatta.annotate.oracle import GroundTruthOracle
from eatta.monitor import AccuracyMonitor, AuditSampler, Guard

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

C = 5


def stream(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, C, (16,), generator=g))
        for _ in range(n)
    ]


def tent(seed: int = 0, **parts: object) -> eatta.methods.base.AdaptiveMethod:
    return eatta.create("tent", tiny_cnn(C, seed=seed), lr=0.05, **parts)  # type: ignore[arg-type]


def watched(
    auditor: object, model_seed: int = 0, **kw: object
) -> eatta.methods.base.AdaptiveMethod:
    """TENT carrying a monitor (``kw``: its settings), compared with TENT's model as given."""
    return tent(model_seed, monitor=AccuracyMonitor(auditor, **kw))  # type: ignore[arg-type]


def test_audits_score_the_served_prediction_and_the_source_by_hand():
    oracle = GroundTruthOracle()
    method = watched(oracle, share=0.25, seed=4)
    monitor, src = method.monitor, method.given
    sampler = AuditSampler(0.25, seed=4)
    n = a_right = s_right = 0
    for x, y in stream(5):
        oracle.set_labels(y)
        logits = method(x)
        idx = sampler.draw(len(y))
        n += len(idx)
        a_right += int((logits[idx].argmax(1) == y[idx]).sum())
        with torch.no_grad():
            s_right += int((src(x[idx]).argmax(1) == y[idx]).sum())
    est = monitor.estimate()
    assert est.audits == n > 0
    assert est.adapted.value == pytest.approx(a_right / n)
    assert est.source.value == pytest.approx(s_right / n)
    assert est.difference.value == pytest.approx((a_right - s_right) / n)
    assert est.adapted.low <= est.adapted.value <= est.adapted.high
    assert monitor.stats()["requested"] == monitor.stats()["received"] == n
    assert monitor.estimate(0).audits == n  # the default period


def test_without_a_guard_the_method_adapts_exactly_as_without_a_monitor():
    plain, seen = tent(), watched(GroundTruthOracle(), share=0.5)
    for x, y in stream(6):
        out_p = plain(x)
        out_w = seen(x, labels=y)
        assert torch.equal(out_p, out_w)
    assert differences(exact_state(plain), exact_state(seen)) == []


def test_late_answers_score_the_prediction_made_when_asked_and_count_for_its_period():
    ann = SimulatedAnnotator(delay=3, seed=0)
    method = watched(ann, share=0.25, seed=1)
    monitor = method.monitor
    sampler = AuditSampler(0.25, seed=1)
    right = {0: [0, 0], 1: [0, 0]}
    data = stream(8)
    for t, (x, y) in enumerate(data):
        monitor.period = 0 if t < 4 else 1
        logits = method(x, labels=y)
        idx = sampler.draw(len(y))
        p = monitor.period
        right[p][0] += len(idx)
        right[p][1] += int((logits[idx].argmax(1) == y[idx]).sum())
    # answers to the last 3 steps' audits have not arrived
    assert monitor.pending > 0
    assert monitor.estimate(0).audits == right[0][0]
    assert monitor.estimate(0).adapted.value == pytest.approx(right[0][1] / right[0][0])
    assert monitor.estimate(1).audits < right[1][0]


def test_yes_no_answers_score_the_adapted_model_and_bound_the_source():
    ann = SimulatedAnnotator(delay=0, feedback="binary", seed=0)
    method = watched(ann, share=0.5, seed=2)
    monitor, src = method.monitor, method.given  # on its running statistics, the adapted one not
    sampler = AuditSampler(0.5, seed=2)
    n = a_right = s_known = 0
    for x, y in stream(6):
        logits = method(x, labels=y)
        idx = sampler.draw(len(y))
        pa = logits[idx].argmax(1)
        with torch.no_grad():
            ps = src(x[idx]).argmax(1)
        n += len(idx)
        a_right += int((pa == y[idx]).sum())
        # the source is scored right only where it agrees with a right adapted prediction
        s_known += int(((ps == pa) & (pa == y[idx])).sum())
    est = monitor.estimate()
    assert est.audits == n
    assert est.adapted.value == pytest.approx(a_right / n)
    assert est.source.value == pytest.approx(s_known / n)


def test_refused_answers_change_neither_the_monitor_nor_the_method():
    ann = SimulatedAnnotator(delay=2, seed=0)
    method = watched(ann, share=0.5, label_expiry=1)
    monitor = method.monitor
    data = stream(4)
    for x, y in data[:2]:
        method(x, labels=y)
    before_m = copy.deepcopy(monitor.state_dict())
    before = exact_state(method)
    assert monitor.answer(Answer("no-such-audit", label=1)) is False
    pending = next(iter(monitor._pending))
    assert monitor.answer(Answer(pending, label=C + 3)) is False  # class out of range
    after_m = monitor.state_dict()
    assert after_m["counts"]["refused"] == before_m["counts"]["refused"] + 2
    after_m["counts"]["refused"] -= 2
    assert differences(before_m, after_m) == []
    assert differences(before, exact_state(method)) == []
    # label_expiry 1 < delay 2: every audit expires, none is scored
    for x, y in data[2:]:
        method(x, labels=y)
    assert monitor.estimate().audits == 0 and monitor.stats()["expired"] > 0


class AgreesWithSource:
    """An auditor whose label is the given model's class: where the adapted model differs it is
    wrong and the given model right."""

    source: torch.nn.Module

    def __call__(self, x, idx):
        with torch.no_grad():
            return self.source(x).argmax(1)


def test_the_guard_resets_the_method_and_logs_the_evidence_keeping_the_monitor():
    model = tiny_cnn(C, seed=7)
    with torch.no_grad():  # running statistics far from the stream's: the two models differ
        for bn in model.modules():
            if isinstance(bn, torch.nn.BatchNorm2d):
                bn.running_mean.fill_(1.0)
    auditor = AgreesWithSource()
    monitor = AccuracyMonitor(auditor, share=1.0, guard=Guard("source", level=0.1, block=16))
    method = eatta.create("tent", model, lr=0.05, monitor=monitor)
    auditor.source = method.given
    initial = exact_state(method)
    seen = []
    monitor.on_reset = seen.append
    for x, _ in stream(3):
        method(x)
    assert len(monitor.resets) >= 1 and seen == monitor.resets
    e = monitor.resets[0]
    assert e.reason == "worse than source" and e.high < 0 and e.step >= 1
    assert monitor.stats()["resets"] == len(monitor.resets)
    assert monitor.estimate().audits == 48  # kept across resets
    # the last step ended with a reset: the model is back at its source state
    if monitor.resets[-1].step == 3:
        assert differences(initial["model"], exact_state(method)["model"]) == []
    assert monitor.epoch == len(monitor.resets)


def test_a_users_reset_clears_the_monitor():
    oracle = GroundTruthOracle()
    method = watched(oracle, share=0.5, seed=3)
    monitor = method.monitor
    for x, y in stream(3):
        method(x, labels=y)
    assert monitor.estimate().audits > 0
    method.reset()
    assert monitor.estimate().audits == 0 and monitor.stats()["requested"] == 0
    assert method.monitor is monitor


def test_resume_from_a_state_dict_is_bit_identical_with_late_answers_pending():
    data = stream(10)

    def build():
        ann = SimulatedAnnotator(delay=3, noise=0.2, seed=5)
        return watched(ann, share=0.3, guard=Guard("paired", 0.2, 4), seed=9), ann

    full, _ = build()
    for x, y in data:
        full(x, labels=y)
    first, ann_first = build()
    for x, y in data[:5]:
        first(x, labels=y)
    state = bytes_round_trip(first.state_dict())
    ann_state = copy.deepcopy(ann_first.state_dict())
    resumed, ann_resumed = build()
    resumed.load_state_dict(state)
    ann_resumed.load_state_dict(ann_state)
    assert resumed.monitor.pending > 0
    for x, y in data[5:]:
        resumed(x, labels=y)
    assert differences(exact_state(full), exact_state(resumed)) == []
    a, b = full.monitor.state_dict(), resumed.monitor.state_dict()
    a.pop("nonce"), b.pop("nonce")  # ids differ by the run's nonce only
    a["pending"], b["pending"] = list(a["pending"].values()), list(b["pending"].values())
    assert differences(a, b) == []


@pytest.mark.parametrize(
    ("auditor", "kw", "error", "match"),
    [
        (GroundTruthOracle(), {"share": 1.5}, ValueError, r"\[0, 1\]"),
        (GroundTruthOracle(), {"share": 0.0, "guard": "paired"}, ValueError, "needs audits"),
        (GroundTruthOracle(), {"guard": "often"}, ValueError, "guard"),
        (GroundTruthOracle(), {"guard": "paired", "guard_level": 1.0}, ValueError, r"\(0, 1\)"),
        (None, {}, ValueError, "needs an auditor"),
        (42, {}, TypeError, "auditor"),
    ],
)
def test_bad_settings_are_refused_before_the_model_is_wrapped(auditor, kw, error, match):
    model = tiny_cnn(C)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(error, match=match):
        eatta.create("tent", model, monitor=AccuracyMonitor(auditor, **kw))
    assert differences(before, model.state_dict()) == []


def test_an_unknown_period_is_refused():
    with pytest.raises(ValueError, match="estimate"):
        AccuracyMonitor(GroundTruthOracle()).estimate("weekly")


def test_the_given_model_on_its_running_statistics_sees_each_audited_sample_alone():
    """The given model predicts per sample (eval mode, its own statistics): its prediction for
    an audited sample does not depend on the rest of the batch."""
    oracle = GroundTruthOracle()
    method = watched(oracle, share=0.25, seed=4)
    sampler = AuditSampler(0.25, seed=4)
    n = s_right = 0
    for x, y in stream(3):
        oracle.set_labels(y)
        method(x)
        idx = sampler.draw(len(y))
        with torch.no_grad():
            alone = torch.cat([method.given(x[i : i + 1]) for i in idx.tolist()]).argmax(1)
        n += len(idx)
        s_right += int((alone == y[idx]).sum())
    assert method.monitor.estimate().audits == n > 0
    assert method.monitor.estimate().source.value == pytest.approx(s_right / n)


def test_a_methods_own_resets_keep_the_monitor():
    """RDumb's scheduled resets (and SAR's recoveries) are not a new stream: audits accumulate."""
    oracle = GroundTruthOracle()
    method = eatta.create(
        "rdumb", tiny_cnn(C), reset_every=2, monitor=AccuracyMonitor(oracle, share=1.0)
    )
    monitor = method.monitor
    for x, y in stream(5):
        method(x, labels=y)
    assert monitor.estimate().audits == 5 * 16
    method.reset(keep_monitor=True)
    assert monitor.estimate().audits == 5 * 16
