"""Requests drawn with known inclusion probabilities: the probabilities by hand, the draw, the
unbiased paired estimate they give, and bad input."""

from __future__ import annotations

import pytest
import torch

from eatta.balance import NoClassBalance, ReferenceBalance
from eatta.selection.base import ScoreSelector, SelectionContext
from eatta.selection.drawn import DisagreementDraw, check_explore, inclusion_probabilities


class FixedScores(ScoreSelector):
    def __init__(self, scores: torch.Tensor) -> None:
        self.scores = scores

    def score(self, ctx: SelectionContext) -> torch.Tensor:
        return self.scores


def context(pred: list[int], classes: int = 3, given: list[int] | None = None) -> SelectionContext:
    """A batch the adapted model reads as ``pred``, the given model (when known) as ``given``."""
    logits = torch.full((len(pred), classes), -5.0)
    logits[torch.arange(len(pred)), torch.tensor(pred)] = 5.0
    return SelectionContext(
        inputs=torch.zeros(len(pred), 2),
        features=torch.zeros(len(pred), 2),
        logits=logits,
        head=torch.nn.Identity(),
        reference=None if given is None else torch.tensor(given),
    )


def test_probabilities_by_hand():
    scores = torch.tensor([1.0, 3.0, 0.0, 4.0])
    disagree = torch.tensor([False, True, False, True])
    q = inclusion_probabilities(scores, disagree, explore=0.2)
    base = 0.95 * scores.double() / 8.0 + 0.05 / 4  # floored, normalized scores
    want = 0.2 * base + 0.8 * disagree.double() / 2.0
    assert torch.allclose(q, want, rtol=0, atol=1e-15)
    assert abs(float(q.sum()) - 1.0) < 1e-12
    assert bool((q > 0).all())  # a zero score can still be asked


def test_without_disagreements_the_draw_follows_the_scores():
    scores = torch.tensor([1.0, 3.0])
    q = inclusion_probabilities(scores, torch.tensor([False, False]), explore=0.2)
    assert torch.allclose(q, 0.95 * scores.double() / 4.0 + 0.025, rtol=0, atol=1e-15)
    assert torch.equal(q, inclusion_probabilities(scores, None, explore=0.2))


def test_horvitz_thompson_estimate_is_unbiased_exactly_and_by_simulation():
    """E_q[d_I / (n q_I)] = mean(d): exactly, and over many seeded draws of the selector."""
    n = 8
    adapted = [0, 1, 2, 0, 1, 2, 0, 1]
    given = [0, 1, 1, 1, 1, 0, 0, 2]
    truth = [0, 1, 2, 1, 0, 0, 0, 2]
    d = torch.tensor(
        [int(a == y) - int(g == y) for a, g, y in zip(adapted, given, truth, strict=True)]
    )
    draw = DisagreementDraw(
        FixedScores(torch.rand(n, generator=torch.Generator().manual_seed(1))), explore=0.3, seed=5
    )
    ctx = context(adapted, given=given)
    draw.select(ctx, 1, NoClassBalance())
    disagree = torch.tensor(given) != torch.tensor(adapted)
    q_all = inclusion_probabilities(draw.base.score(ctx), disagree, 0.3)
    exact = float((q_all * d.double() / (n * q_all)).sum())
    assert exact == pytest.approx(float(d.double().mean()), abs=1e-12)
    total, reps = 0.0, 4000
    for _ in range(reps):
        sel = draw.select(ctx, 1, NoClassBalance())
        rec = sel.update["draw"]
        assert torch.equal(sel.indices, rec.indices)
        i = int(rec.indices[0])
        total += float(d[i]) / (n * float(rec.q[0]))
    # the estimate is bounded by 1 / (1 - explore) on the disagreements: sd <= 1.43 / sqrt(4000)
    assert total / reps == pytest.approx(float(d.double().mean()), abs=0.1)


def test_draw_records_counts_and_is_reproducible_from_its_state():
    draw = DisagreementDraw(FixedScores(torch.ones(6)), explore=1.0, seed=3)
    ctx = context([0, 1, 2, 0, 1, 2])
    state = draw.state_dict()
    sel = draw.select(ctx, 4, NoClassBalance())
    rec = sel.update["draw"]
    assert int(rec.counts.sum()) == 4 and rec.k == 4 and rec.n == 6
    assert len(sel.indices) == len(set(sel.indices.tolist())) <= 4
    assert torch.allclose(rec.q, torch.full_like(rec.q, 1 / 6))
    draw.load_state_dict(state)
    again = draw.select(ctx, 4, NoClassBalance())
    assert torch.equal(again.indices, sel.indices)


def test_disagreements_are_drawn_most_of_the_time():
    draw = DisagreementDraw(FixedScores(torch.ones(10)), explore=0.1, seed=0)
    pred = [0] * 10
    given = [1, 1] + [0] * 8  # the two models differ on samples 0 and 1
    hits = 0
    for _ in range(500):
        sel = draw.select(context(pred, given=given), 1, NoClassBalance())
        hits += int(sel.indices[0]) in (0, 1)
    assert hits / 500 == pytest.approx(0.9 + 0.1 * 0.2, abs=0.05)


def test_a_focus_replaces_the_disagreements_and_the_bound_follows_it():
    """The focus (the fallback's, under the promise) names samples 3 and 4: the rest of the
    draw goes there, not to the disagreements (0, 1), and the bound is over the focus."""
    seen = []

    def focus(ctx: SelectionContext) -> torch.Tensor:
        seen.append(ctx)
        return torch.tensor([False, False, False, True, True, False])

    draw = DisagreementDraw(FixedScores(torch.ones(6)), explore=0.25, seed=0, focus=focus)
    ctx = context([0] * 6, given=[1, 1, 0, 0, 0, 0])
    sel = draw.select(ctx, 1, NoClassBalance())
    assert seen == [ctx]
    rec = sel.update["draw"]
    assert rec.disagreements == 2
    q_focus = 0.25 / 6 + 0.75 / 2
    assert rec.bound == pytest.approx(1 / (6 * q_focus))
    hits = sum(int(draw.select(ctx, 1, NoClassBalance()).indices[0]) in (3, 4) for _ in range(400))
    assert hits / 400 == pytest.approx(0.75 + 0.25 * 2 / 6, abs=0.06)
    none = DisagreementDraw(FixedScores(torch.ones(6)), explore=0.25, seed=0, focus=lambda c: None)
    assert none.select(ctx, 1, NoClassBalance()).update["draw"].bound == pytest.approx(
        1 / (6 * q_focus)
    )  # None: the disagreements (0 and 1, two of them too)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, float("nan"), True, "0.2"])
def test_bad_explore_is_refused(bad):
    with pytest.raises((ValueError, TypeError), match="explore"):
        check_explore(bad)
    with pytest.raises((ValueError, TypeError), match="explore"):
        DisagreementDraw(FixedScores(torch.ones(2)), explore=bad)


def test_a_class_history_is_refused_before_anything_is_drawn():
    draw = DisagreementDraw(FixedScores(torch.ones(3)), seed=0)
    state = draw.state_dict()
    with pytest.raises(TypeError, match="balance=None"):
        draw.select(context([0, 1, 2]), 1, ReferenceBalance())
    assert torch.equal(draw.state_dict()["generator"], state["generator"])


def test_reference_of_the_wrong_shape_is_refused():
    draw = DisagreementDraw(FixedScores(torch.ones(3)), seed=0)
    with pytest.raises(ValueError, match="reference predictions"):
        draw.select(context([0, 1, 2], given=[0, 1]), 1, NoClassBalance())
