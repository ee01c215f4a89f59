"""eatta-stable's late-label handling inside the step: weights, fallback, resume, reset."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import eatta
from _state_checks import differences
from conftest import confident_cnn
from eatta.annotate import SimulatedAnnotator
from eatta.losses import default_entropy_margin, entropy

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

C = 5  # confident_cnn's classes


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _stream(n: int, seed: int = 0, size: int = 8):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.rand(size, 3, 8, 8, generator=g) for _ in range(n)]
    ys = [torch.randint(0, C, (size,), generator=g) for _ in range(n)]
    return xs, ys


def _build(ann, **hp):
    return eatta.create("eatta-stable", confident_cnn(), oracle=ann, budget=1, **hp)


def test_a_late_label_enters_l_sup_at_its_age_weight() -> None:
    xs, ys = _stream(3)
    m = _build(SimulatedAnnotator(delay=2), late_weight="age", late_half_life=1.0)
    for t in range(2):
        m(xs[t], labels=ys[t])
    late = m._asking.pending._entries  # the request of step 1, answered at step 3
    (entry,) = [e for e in late.values() if e.request.step == 1]
    x, y = xs[2], ys[2]
    # the late sample run with the batch through the model as it is before step 3
    with torch.no_grad():
        o = m.model(torch.cat([x, entry.request.sample.unsqueeze(0)]))
    want = 0.25 * F.cross_entropy(o[-1:], torch.tensor([int(ys[0][entry.request.index])]))
    m(x, labels=y)
    assert m.last_step is not None and m.last_step.late == 1
    assert float(m.last_step.loss_sup) == pytest.approx(float(want), rel=1e-4)


def test_without_labels_the_step_takes_etas_filtered_entropy() -> None:
    xs, ys = _stream(2)
    m = _build(SimulatedAnnotator(delay="never"))
    m(xs[0], labels=ys[0])
    first = m.late_labels.state_dict()["probs"]
    assert first is not None  # the fallback ran and started its moving average
    with torch.no_grad():
        o = m.model(xs[1])
    h = entropy(o)
    margin = default_entropy_margin(C)
    probs = o.softmax(1)
    asked = None
    m(xs[1], labels=ys[1])
    asked = m._asking.pending._entries
    # the selected sample is excluded; the rest: reliable and non-redundant, weighted
    sel = [e.request.index for e in asked.values() if e.request.step == 2]
    mask = h < margin
    mask[sel] = False
    cos = torch.cosine_similarity(first.unsqueeze(0), probs, dim=1)
    kept = mask & (cos.abs() < 0.05)
    assert m.last_step is not None and int(m.last_step.num_unsup) == int(kept.sum())
    n = max(int(kept.sum()), 1)
    want = (h * torch.where(kept, torch.exp(margin - h), torch.zeros_like(h))).sum() / n
    assert float(m.last_step.loss_unsup) == pytest.approx(float(want), rel=1e-4, abs=1e-7)


def test_no_fallback_keeps_the_plain_entropy_term() -> None:
    xs, ys = _stream(1)
    m = _build(SimulatedAnnotator(delay="never"), late_entropy_filter="none")
    with torch.no_grad():
        h = entropy(m.model(xs[0]))
    m(xs[0], labels=ys[0])
    asked = [e.request.index for e in m._asking.pending._entries.values()]
    mask = h < default_entropy_margin(C)
    mask[asked] = False
    assert float(m.last_step.loss_unsup) == pytest.approx(float(h[mask].mean()), rel=1e-5)
    assert m.late_labels.state_dict()["probs"] is None


@pytest.mark.parametrize("hp", [{}, {"late_replay": 2}, {"late_weight": "age"}])
def test_resume_is_bit_identical_and_reset_clears(hp: dict[str, object]) -> None:
    xs, ys = _stream(8, seed=3)

    def annotator():
        return SimulatedAnnotator(delay=(1, 3), seed=1)

    ann, ann2 = annotator(), annotator()
    m = _build(ann, **hp)
    for t in range(4):
        m(xs[t], labels=ys[t])
    saved, saved_ann = copy.deepcopy(m.state_dict()), copy.deepcopy(ann.state_dict())
    tail = [m(xs[t], labels=ys[t]) for t in range(4, 8)]
    m2 = _build(ann2, **hp)
    m2.load_state_dict(saved)
    ann2.load_state_dict(saved_ann)
    tail2 = [m2(xs[t], labels=ys[t]) for t in range(4, 8)]
    assert all(torch.equal(a, b) for a, b in zip(tail, tail2, strict=True))
    assert differences(m.method_state(), m2.method_state()) == []
    recorded = m.method_state()["late_labels"]["means"]
    assert bool(recorded) == ("late_weight" not in hp)  # drift (the default) records the stream
    m.reset()
    assert m.method_state()["late_labels"] == {"means": {}, "move": None, "probs": None}
    if hp.get("late_replay"):
        assert m.method_state()["nearest_replay"]["y"] is None
