"""What serves each batch and why: the blend by hand, the decision rule, the record, state."""

from __future__ import annotations

import math

import pytest
import torch
from test_fallback import HALF_WRONG, RIGHT, Fixed, batches, linear

from conftest import tiny_cnn  # noqa: F401  (the suite's import path, as the other tests)
from eatta.monitor.fallback import SourceFallback
from eatta.monitor.serving import ServingRule, blend_logits
from eatta.monitor.signs import LabelFreeSigns

pytestmark = pytest.mark.small_batches

NONE = (0, math.nan, 1.0, 1.0)  # no evidence: no answer, mean nan


class Verdict:
    """A stand-in for the sign test: a fixed verdict (``"better"``, ``"worse"``, None) on fixed
    evidence ``(answers, mean, up, down)``; records whether the rule cleared it."""

    def __init__(self, verdict: str | None, evidence: tuple[int, float, float, float]) -> None:
        self.verdict = verdict
        self.answers, self.mean, self.up, self.down = evidence
        self.cleared = False

    def decided(self) -> str | None:
        return self.verdict

    def clear(self) -> None:
        self.cleared = True


def decide(rule: ServingRule, verdict: str | None, step: int, evidence, signs) -> tuple[bool, bool]:  # type: ignore[no-untyped-def]
    """``rule``'s decision on ``verdict``: (reset asked, evidence cleared: a decision taken)."""
    test = Verdict(verdict, evidence)
    return rule.decide(test, step, signs), test.cleared  # type: ignore[arg-type]


def signs_at(disagree: float) -> LabelFreeSigns:
    """Signs that read one batch of 10 samples disagreeing on ``disagree`` of them."""
    signs = LabelFreeSigns(3, 0.9, 0.3)
    d = round(10 * disagree)
    signs.record(
        torch.arange(10) % 5, torch.cat([torch.arange(d) % 5 + 5, torch.arange(d, 10) % 5])
    )
    return signs


def test_the_blend_is_the_log_of_the_mean_of_the_two_models_probabilities():
    a = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.2, 0.0]])
    g = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    pa, pg = a.exp() / a.exp().sum(1, keepdim=True), g.exp() / g.exp().sum(1, keepdim=True)
    want = ((pa + pg) / 2).log()
    got = blend_logits(a, g)
    assert torch.allclose(got, want, atol=1e-6)
    assert got.argmax(1).tolist() == [0, 2]  # the confident model wins each sample
    assert torch.allclose(got.exp().sum(1), torch.ones(2))
    assert blend_logits(a.double(), g).dtype == torch.float64  # the adapted logits' dtype


def test_blend_serves_the_given_model_without_answers_and_the_blend_on_a_lean():
    rule = ServingRule("blend")
    assert (rule.serving, rule.why) == ("source", "default")  # before any batch is read
    rule.refresh(signs_at(0.1), math.nan)  # no answer yet
    assert (rule.serving, rule.why) == ("source", "default")
    rule.refresh(signs_at(0.1), -0.01)  # the answers lean against the adapted model
    assert (rule.serving, rule.why) == ("source", "default")
    rule.refresh(signs_at(0.1), 0.02)  # toward it
    assert (rule.serving, rule.why) == ("blend", "lean")
    rule.refresh(signs_at(0.9), 0.02)  # the same lean, the two far apart: no sign is read
    assert (rule.serving, rule.why) == ("blend", "lean")
    rule.refresh(signs_at(0.0), 0.0)  # no lean either way: the given model
    assert (rule.serving, rule.why) == ("source", "default")
    assert rule.prior_switches == 2


def test_a_decision_overrides_the_lean_and_the_signs_for_good():
    rule = ServingRule("blend")
    assert decide(rule, "better", 7, (30, 0.2, 21.0, 1.0), signs_at(0.1)) == (False, True)
    assert (rule.serving, rule.why) == ("adapted", "evidence")
    (event,) = rule.events
    assert (event.kind, event.step, event.answers, event.up) == ("serve adapted", 7, 30, 21.0)
    rule.refresh(signs_at(0.9), -1.0)  # neither a sign nor a lean moves it now
    assert (rule.serving, rule.why) == ("adapted", "evidence")
    assert decide(rule, None, 8, NONE, signs_at(0.9)) == (False, False)
    assert decide(rule, "worse", 9, (25, -0.3, 1.0, 22.0), signs_at(0.1)) == (False, True)
    assert rule.serving == "source" and [e.kind for e in rule.events][-1] == "serve given"


def test_worse_while_the_given_model_serves_is_a_decision_and_asks_for_a_reset_if_set():
    rule = ServingRule("source", reset=True)
    assert decide(rule, "worse", 3, (22, -0.5, 1.0, 20.5), signs_at(0.1)) == (True, True)
    assert [e.kind for e in rule.events] == ["reset: worse than given"] and rule.epoch == 1
    keep = ServingRule("source")
    assert decide(keep, "worse", 3, (22, -0.5, 1.0, 20.5), signs_at(0.1)) == (False, True)
    assert [e.kind for e in keep.events] == ["adapted found worse"]


def test_every_served_batch_is_recorded_with_its_reason_and_restored_from_state():
    rule = ServingRule("blend")
    for lean in (math.nan, 0.1, -0.1):
        rule.refresh(signs_at(0.5), lean)
        rule.note()
    decide(rule, "better", 4, (20, 0.1, 20.0, 1.0), signs_at(0.0))
    rule.note()
    want = [("source", "default"), ("blend", "lean"), ("source", "default")]
    want.append(("adapted", "evidence"))
    assert rule.history() == want
    assert rule.tally() == {
        "served": {"adapted": 1, "source": 2, "blend": 1, "part": 0},
        "why": {"evidence": 1, "default": 2, "sign": 0, "lean": 1, "promise": 0, "bound": 0},
    }
    auto = ServingRule("auto")  # the label-free signs choose, recorded as such
    auto.refresh(signs_at(0.5), math.nan)
    auto.note()
    assert auto.history() == [("adapted", "sign")]
    copy = ServingRule("blend")
    copy.load_state_dict(rule.state_dict())
    assert copy.history() == want and copy.events == rule.events
    assert (copy.serving, copy.why) == ("adapted", "evidence")
    with pytest.raises(ValueError, match="unknown serving state"):
        copy.load_state_dict({**rule.state_dict(), "serving": "both"})


def test_measuring_only_always_serves_the_adapted_model_whatever_the_lean():
    rule = ServingRule("blend", act=False)
    for lean in (math.nan, -1.0, 1.0):
        rule.refresh(signs_at(0.0), lean)
        assert (rule.serving, rule.why) == ("adapted", "default")
    assert decide(rule, "worse", 1, (20, -0.5, 1.0, 21.0), signs_at(0.0)) == (False, False)
    assert rule.serving == "adapted" and not rule.events


def test_unknown_start_is_refused():
    with pytest.raises(ValueError, match="start must be one of"):
        ServingRule("given")


def test_a_fallback_starting_on_the_blend_serves_the_given_model_until_answers_lean():
    """No answer: exactly the given model's logits; answers showing the adapted model right where
    the given one errs: the blend, until the test decides for the adapted model."""
    fallback = SourceFallback(auditor=lambda x, i: None, start="blend")
    method = Fixed(linear(HALF_WRONG), linear(RIGHT), fallback=fallback)
    for x, _ in batches(5):
        assert torch.equal(method(x), method.given_logits(x))
    assert fallback.stats()["why"] == {
        "evidence": 0,
        "default": 5,
        "sign": 0,
        "lean": 0,
        "promise": 0,
        "bound": 0,
    }

    from test_fallback import guarded

    method, _ = guarded(RIGHT, [0, 1, 2, 3, 4, 0], start="blend")  # one class in six misread
    fb = method.fallback
    assert isinstance(fb, SourceFallback)
    for x, y in batches(80):
        out = method(x, labels=y)
        was = fb.history()[-1]
        if was[0] == "blend":
            assert torch.equal(out, blend_logits(method.fixed(x), method.given_logits(x)))
    kinds = [w for _, w in fb.history()]
    assert "lean" in kinds and kinds[-1] == "evidence" and fb.serving == "adapted"
    assert kinds.index("evidence") > kinds.index("lean")  # the blend came before the decision
