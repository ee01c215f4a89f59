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
from eatta.monitor import AccuracyMonitor, AuditSampler, Guard, attach

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

C = 5


def stream(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, C, (16,), generator=g))
        for _ in range(n)
    ]


def tent(seed: int = 0) -> eatta.methods.base.AdaptiveMethod:
    return eatta.create("tent", tiny_cnn(C, seed=seed), lr=0.05)


def source_model(seed: int = 0) -> torch.nn.Module:
    return tiny_cnn(C, seed=seed).eval()


def test_audits_score_the_served_prediction_and_the_source_by_hand():
    method = tent()
    src = source_model()
    oracle = GroundTruthOracle()
    monitor = attach(method, oracle, source=src, share=0.25, seed=4)
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
    plain, watched = tent(), tent()
    attach(watched, GroundTruthOracle(), source=source_model(), share=0.5)
    for x, y in stream(6):
        out_p = plain(x)
        out_w = watched(x, labels=y)
        assert torch.equal(out_p, out_w)
    assert differences(exact_state(plain), exact_state(watched)) == []


def test_late_answers_score_the_prediction_made_when_asked_and_count_for_its_period():
    method = tent()
    ann = SimulatedAnnotator(delay=3, seed=0)
    monitor = attach(method, ann, source=source_model(), share=0.25, seed=1)
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
    method = tent()
    ann = SimulatedAnnotator(delay=0, feedback="binary", seed=0)
    src = source_model(seed=5)  # a different model: it disagrees with the adapted one
    monitor = attach(method, ann, source=src, share=0.5, seed=2)
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
    method = tent()
    ann = SimulatedAnnotator(delay=2, seed=0)
    monitor = attach(method, ann, source=source_model(), share=0.5, label_expiry=1)
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
    """An auditor whose label is the source's class where the adapted model differs (adapted
    wrong, source right), and another class where they agree (both wrong)."""

    def __init__(self, method, source):
        self.method, self.source = method, source

    def __call__(self, x, idx):
        with torch.no_grad():
            s = self.source(x).argmax(1)
        return s


def test_the_guard_resets_the_method_and_logs_the_evidence_keeping_the_monitor():
    method = tent()
    src = source_model(seed=7)
    auditor = AgreesWithSource(method, src)
    guard = Guard("source", level=0.1, block=16)
    monitor = attach(method, auditor, source=src, share=1.0, guard=guard)
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
    method = tent()
    oracle = GroundTruthOracle()
    monitor = attach(method, oracle, source=source_model(), share=0.5, seed=3)
    for x, y in stream(3):
        method(x, labels=y)
    assert monitor.estimate().audits > 0
    method.reset()
    assert monitor.estimate().audits == 0 and monitor.stats()["requested"] == 0
    assert method.monitor is monitor


def test_resume_from_a_state_dict_is_bit_identical_with_late_answers_pending():
    data = stream(10)

    def build():
        m = tent()
        ann = SimulatedAnnotator(delay=3, noise=0.2, seed=5)
        attach(m, ann, source=source_model(), share=0.3, guard=Guard("paired", 0.2, 4), seed=9)
        return m, ann

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


def test_bad_input_is_refused_before_the_method_is_touched():
    method = tent()
    src = source_model()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        attach(method, GroundTruthOracle(), source=src, share=1.5)
    with pytest.raises(ValueError, match="needs audits"):
        attach(method, GroundTruthOracle(), source=src, share=0.0, guard="paired")
    with pytest.raises(ValueError, match="unknown guard policy"):
        attach(method, GroundTruthOracle(), source=src, guard="often")
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        attach(method, GroundTruthOracle(), source=src, guard="paired", guard_level=1.0)
    with pytest.raises(ValueError, match="needs an auditor"):
        attach(method, None, source=src)
    with pytest.raises(TypeError, match="auditor"):
        attach(method, 42, source=src)
    assert method.monitor is None
    with pytest.raises(ValueError, match="estimate"):
        AccuracyMonitor(GroundTruthOracle(), src).estimate("weekly")


def test_a_source_on_batch_statistics_sees_the_whole_batch():
    """attach() without a source copies the method's configured model (BatchNorm on batch
    statistics): its prediction for an audited sample is the one it makes within the batch."""
    method = tent()
    oracle = GroundTruthOracle()
    monitor = attach(method, oracle, share=0.25, seed=4)
    assert monitor.source_sees_batch
    initial = tent()  # the same model, unadapted, in its configured form
    sampler = AuditSampler(0.25, seed=4)
    n = s_right = 0
    for x, y in stream(3):
        oracle.set_labels(y)
        with torch.no_grad():
            whole = initial.model(x).argmax(1)
        method(x)
        idx = sampler.draw(len(y))
        n += len(idx)
        s_right += int((whole[idx] == y[idx]).sum())
    assert monitor.estimate().audits == n > 0
    assert monitor.estimate().source.value == pytest.approx(s_right / n)
    assert not attach(tent(), oracle, source=source_model()).source_sees_batch


def test_a_methods_own_resets_keep_the_monitor():
    """RDumb's scheduled resets (and SAR's recoveries) are not a new stream: audits accumulate."""
    method = eatta.create("rdumb", tiny_cnn(C), reset_every=2)
    oracle = GroundTruthOracle()
    monitor = attach(method, oracle, source=source_model(), share=1.0)
    for x, y in stream(5):
        method(x, labels=y)
    assert monitor.estimate().audits == 5 * 16
    method.reset(keep_monitor=True)
    assert monitor.estimate().audits == 5 * 16
