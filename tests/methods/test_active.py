"""The active layer (eatta.methods.active): one place for the annotator, the budget and asking."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import eatta
import eatta.methods.base
from conftest import confident_cnn
from eatta import EATTA, GroundTruthOracle
from eatta.annotate import SimulatedAnnotator
from eatta.annotate.asking import AnswerRecord
from eatta.annotate.pending import Arrived
from eatta.annotate.requests import Answer, LabelRequest
from eatta.methods.active import ActiveMethod
from eatta.methods.baseline import baseline
from eatta.methods.cema import CEMA
from eatta.methods.hiltta import HILTTA
from eatta.methods.replay import answer_terms
from eatta.methods.simatta import SimATTA
from eatta.methods.tent import Tent

SRC = Path(eatta.__file__).parent


def test_every_active_method_shares_the_layer_and_the_label_free_base_knows_no_annotator():
    for cls in (EATTA, CEMA, SimATTA, HILTTA):
        assert issubclass(cls, ActiveMethod)
        assert "labels_used" not in vars(cls) and "Asking(" not in inspect.getsource(cls.__init__)
    assert isinstance(baseline, type(lambda: None))  # the Baseline is an EATTA, built so
    assert not issubclass(Tent, ActiveMethod)
    tree = ast.parse((SRC / "methods" / "base.py").read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not any(m.startswith(("eatta.methods.active", "eatta.annotate")) for m in imported)
    assert "asking" not in (SRC / "methods" / "base.py").read_text()


def test_ask_is_one_path_for_both_kinds_of_annotator():
    """A synchronous oracle and a zero-delay asynchronous annotator give the same answers."""
    x = torch.rand(12, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(12) % 5
    got = []
    for oracle in (GroundTruthOracle(), SimulatedAnnotator(delay=0)):
        torch.manual_seed(0)
        m = eatta.create("eatta", confident_cnn(), oracle=oracle, budget=2)
        oracle.set_labels(y)
        with torch.no_grad():
            z, o = m.features_and_logits(x)
        ans = m.ask(x, z, o, 2, m.selector, m.balance)
        got.append((ans.indices.tolist(), ans.targets.tolist(), ans.requested))
        m.charge(ans)
        assert m.labels_used == 2
    (sync_idx, sync_y, sent_sync), (async_idx, async_y, sent_async) = got
    assert (sync_idx, sync_y) == (async_idx, async_y) and len(sync_idx) == 2
    assert sync_y == [int(y[i]) for i in sync_idx]
    assert (sent_sync, sent_async) == (0, 2)  # requests are counted for an asynchronous one


def _arrived(label, not_label, sample):
    request = LabelRequest("r", sample, torch.zeros(5), "label", 0, 0)
    answer = Answer("r", label=label) if label is not None else Answer("r", correct=False)
    return Arrived(request, answer, label, not_label, selection=None, position=0, late=True)


def test_answer_terms_by_hand():
    o = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    empty = torch.empty(0, dtype=torch.long)
    ans = AnswerRecord(None, None, None, empty, empty, empty, torch.tensor([1]), torch.tensor([1]))
    (no,) = answer_terms(o, ans)
    p = o[1].softmax(0)
    assert torch.allclose(no, -torch.log(1 - p[1]))  # a "no" on class 1: -log(1 - p_1)
    # late answers: a class (cross-entropy, weighted) and a "no" (weighted by its weight)
    ans.negatives = ans.not_labels = empty
    ans.late = [_arrived(2, None, torch.zeros(1)), _arrived(None, 0, torch.zeros(1))]
    ol = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    w = torch.tensor([0.5, 0.25])
    ce, comp = answer_terms(o, ans, ol, w)
    assert torch.allclose(ce, F.cross_entropy(ol[:1], torch.tensor([2])) * 0.5)
    assert torch.allclose(comp, -torch.log(1 - ol[1].softmax(0)[0]) * 0.25)


@pytest.mark.parametrize("cls", [CEMA, SimATTA, baseline, EATTA])
def test_the_layer_refuses_bad_oracles_before_any_change(cls):
    model = confident_cnn()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = eatta.configure(model)
    with pytest.raises(TypeError, match="oracle"):
        cls(model, torch.optim.SGD(params, lr=0.1), oracle=object())
    with pytest.raises(ValueError, match="label_expiry"):
        cls(model, torch.optim.SGD(params, lr=0.1), oracle=GroundTruthOracle(), label_expiry=3)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
