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
from eatta.methods.late_labels import typicality

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = [pytest.mark.small_batches, pytest.mark.usefixtures("one_thread")]

C = 5  # confident_cnn's classes


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
    late = m.asking.pending._entries  # the request of step 1, answered at step 3
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
    first = m.replay.late.state_dict()["probs"]
    assert first is not None  # the fallback ran and started its moving average
    with torch.no_grad():
        o = m.model(xs[1])
    h = entropy(o)
    margin = default_entropy_margin(C)
    probs = o.softmax(1)
    asked = None
    m(xs[1], labels=ys[1])
    asked = m.asking.pending._entries
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
    asked = [e.request.index for e in m.asking.pending._entries.values()]
    mask = h < default_entropy_margin(C)
    mask[asked] = False
    assert float(m.last_step.loss_unsup) == pytest.approx(float(h[mask].mean()), rel=1e-5)
    assert m.replay.late.state_dict()["probs"] is None


@pytest.mark.parametrize(
    "hp", [{}, {"late_replay": 2}, {"late_weight": "age"}, {"late_weight": "drift"}]
)
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
    assert bool(recorded) == (hp.get("late_weight") == "drift")  # only drift records the stream
    m.reset()
    assert m.method_state()["late_labels"] == {"means": {}, "move": None, "probs": None}
    if hp.get("late_replay"):
        assert m.method_state()["nearest_replay"]["y"] is None


def _late_step(xs, ys, sample=None):
    """Steps 1-3 of ``eatta-stable`` (similarity weighting, answers 2 steps late), the request of
    step 1 (answered in step 3) with its kept sample replaced by ``sample(batch of step 3)``:
    the loss the late label added in step 3, the same by hand, and its weight."""
    m = _build(SimulatedAnnotator(delay=2), late_weight="similarity")
    for t in range(2):
        m(xs[t], labels=ys[t])
    (entry,) = [e for e in m.asking.pending._entries.values() if e.request.step == 1]
    label = torch.tensor([int(ys[0][entry.request.index])])
    x = xs[2]
    if sample is not None:
        entry.request.sample.copy_(sample(x))
    backbone, head = m.split
    with torch.no_grad():  # the batch and the late sample through the model before the step
        z = m.features(backbone, torch.cat([x, entry.request.sample.unsqueeze(0)]))
        ce = F.cross_entropy(head(z[-1:]), label)
    w = float(typicality(z[-1:], z[:-1])[0])
    m(x, labels=ys[2])
    assert m.last_step is not None and m.last_step.late == 1
    return float(m.last_step.loss_sup), w * float(ce), w


def _odd(x: torch.Tensor) -> torch.Tensor:
    """One channel lit, far brighter than the stream: unlike every sample of the batch."""
    odd = torch.zeros_like(x[0])
    odd[0] = 40.0
    return odd


def test_a_late_label_enters_l_sup_at_its_typicality_of_the_batch() -> None:
    xs, ys = _stream(3, size=16)
    loss, want, w = _late_step(xs, ys)  # as asked: a sample of the same stream
    assert loss == pytest.approx(want, rel=1e-4)
    loss, want, w = _late_step(xs, ys, lambda x: x[3].clone())  # a copy of a batch sample
    assert w == 1.0 and loss == pytest.approx(want, rel=1e-4)
    loss_odd, want_odd, w_odd = _late_step(xs, ys, _odd)
    assert loss_odd == pytest.approx(want_odd, rel=1e-4)
    assert w_odd == pytest.approx(2 / 17)  # less typical than every one of the 16


def test_labels_16_batches_late_from_another_domain_count_less() -> None:
    """Answers 16 batches late: those asked before a domain change count less than those asked
    on the domain the stream still shows (their samples are less like its batches)."""
    xs, ys = _stream(24, size=16)
    for t in range(4):  # the first four batches: another domain (brighter, one channel lit)
        xs[t] = xs[t] * 0.2 + torch.tensor([6.0, 0.0, 0.0]).view(1, 3, 1, 1)
    m = _build(SimulatedAnnotator(delay=16), late_weight="similarity")
    assert m.replay.late is not None
    seen: dict[int, float] = {}
    weigh = m.replay.late.weights

    def spy(asked: list[int], now: int, **kw: torch.Tensor) -> torch.Tensor:
        w = weigh(asked, now, **kw)
        seen.update(zip(asked, w.tolist(), strict=True))
        return w

    m.replay.late.weights = spy  # type: ignore[method-assign]
    for t in range(24):
        out = m(xs[t], labels=ys[t])
        assert torch.isfinite(out).all()
    assert sorted(seen) == list(range(1, 9))  # asked in steps 1-8, answered in 17-24
    before = [seen[s] for s in range(1, 5)]
    after = [seen[s] for s in range(5, 9)]
    assert max(before) < min(after)
    assert max(before) == pytest.approx(2 / 17)  # unlike every sample of the batch
