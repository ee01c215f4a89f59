"""EATTA's step: adaptation, degenerate steps, bad input, reset, state round trips."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

import eatta
from conftest import confident_cnn, tiny_cnn
from eatta import EATTA, Budget, GradNormDebiaser, GroundTruthOracle, InvalidInputError, OracleError


def make(model=None, budget=1, oracle=None, lr=0.05, **kw):
    model = model if model is not None else confident_cnn()
    params = eatta.configure(model)
    oracle = oracle if oracle is not None else GroundTruthOracle()
    return EATTA(
        model, torch.optim.SGD(params, lr=lr, momentum=0.9), oracle=oracle, budget=budget, **kw
    )


def snapshot(method: EATTA):
    return (
        {k: v.clone() for k, v in method.model.state_dict().items()},
        repr(method.optimizer.state_dict()["state"]),
        repr(method.method_state()),
    )


def same(a, b) -> bool:
    return a[1] == b[1] and a[2] == b[2] and all(torch.equal(a[0][k], b[0][k]) for k in a[0])


def test_two_line_use_predicts_and_adapts_only_norm_params(batch):
    x, y = batch
    model = confident_cnn()
    frozen = {n: p.clone() for n, p in model.named_parameters()}
    params = eatta.configure(model)
    oracle = GroundTruthOracle()
    adapted = EATTA(model, torch.optim.SGD(params, lr=0.05, momentum=0.9), oracle=oracle, budget=1)
    oracle.set_labels(y)
    logits = adapted(x)
    assert logits.shape == (16, 5) and not logits.requires_grad
    assert adapted.labels_used == 1 and oracle.revealed == 1
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, frozen[n])}
    assert changed and all(n in {"1.weight", "1.bias", "4.weight", "4.bias"} for n in changed)


def test_returned_logits_are_computed_before_the_update(batch):
    x, y = batch
    m = make()
    m.oracle.set_labels(y)
    with torch.no_grad():
        expected = m.model(x)
    assert torch.equal(m(x), expected)
    with torch.no_grad():
        assert not torch.allclose(m.model(x), expected)


def test_budget_every_n_batches_and_total_cap(batch):
    x, y = batch
    m = make(budget=Budget(2, every=3, total=5))
    m.oracle.set_labels(y)
    used = []
    for _ in range(9):
        m(x)
        used.append(m.labels_used)
    # labels on batches 0, 3, 6 (2 each) capped at 5 in total
    assert used == [2, 2, 2, 4, 4, 4, 5, 5, 5]


def test_no_label_step_is_confident_entropy_with_weight_one(batch):
    x, _ = batch
    m = make(oracle=lambda inputs, idx: None)  # abstains
    m(x)
    rec = m.last_step
    assert m.labels_used == 0 and rec.loss_sup is None and rec.weights is None
    assert torch.equal(rec.loss, rec.loss_unsup)
    assert m.debiaser.current is None  # EMA untouched
    assert m.history.classes == []  # class history untouched


def test_per_sample_abstention_counts_only_answered(batch):
    x, y = batch

    def oracle(inputs, idx):
        out = y[idx].clone()
        out[0] = eatta.ABSTAIN
        return out

    m = make(budget=3, oracle=oracle)
    m(x)
    assert m.labels_used == 2 and len(m.last_step.selected) == 2


def test_empty_unsup_set_gives_no_nan_weight_one_and_no_ema_update(batch):
    x, y = batch
    m = make(model=tiny_cnn(), entropy_margin=0.0)  # nothing is confident
    m.oracle.set_labels(y)
    m(x)
    rec = m.last_step
    assert int(rec.num_unsup) == 0 and float(rec.loss_unsup) == 0.0
    assert float(rec.weights.sup) == 1.0 and float(rec.weights.unsup) == 0.0
    assert m.debiaser.current is None
    assert all(torch.isfinite(p).all() for p in m.params)
    assert torch.allclose(rec.loss, rec.loss_sup)


def test_weights_follow_eq_4_5_and_ema(batch):
    x, y = batch
    m = make()
    m.oracle.set_labels(y)
    m(x)
    r1 = m.last_step
    gs, gu = float(r1.grad_norm_sup), float(r1.grad_norm_unsup)
    assert math.isclose(float(r1.weights.sup_raw), 2 * gu / (gs + gu), rel_tol=1e-5)
    assert float(r1.weights.sup) == float(r1.weights.sup_raw)  # first EMA value = raw
    m(x)
    r2 = m.last_step
    ema = 0.8 * float(r1.weights.sup) + 0.2 * float(r2.weights.sup_raw)
    assert math.isclose(float(r2.weights.sup), ema, rel_tol=1e-5)


def test_ablation_without_gnd_uses_unit_weights(batch):
    x, y = batch
    m = make(debiaser=GradNormDebiaser(normalize=False), selector=None, history=None)
    m.oracle.set_labels(y)
    m(x)
    assert float(m.last_step.weights.sup) == 1.0 and float(m.last_step.weights.unsup) == 1.0


def test_at_most_two_backward_passes(batch):
    x, y = batch
    m = make()
    m.oracle.set_labels(y)
    calls = []
    first = m.model[1]  # first BatchNorm: its output needs a gradient

    def count_backward(mod, inputs, out):
        out.register_hook(lambda g: calls.append(g.shape))

    first.register_forward_hook(count_backward)
    m(x)
    assert 1 <= len(calls) <= 2


def test_buffer_variant_replays_labelled_samples(batch):
    x, y = batch
    m = make(buffer=eatta.LabelBuffer(capacity=3, batch_size=2))
    m.oracle.set_labels(y)
    for _ in range(5):
        m(x)
    assert len(m.buffer) == 3
    bx, by = m.buffer.contents()
    sel = m.last_step.selected
    assert torch.equal(bx[-1:], x[sel]) and torch.equal(by[-1:], y[sel])


def test_steps_per_batch_reselects_each_step(batch):
    x, y = batch
    m = make(steps=2)
    m.oracle.set_labels(y)
    m(x)
    assert m.labels_used == 2


# -- bad input: clear error, nothing changed ------------------------------------------------------
BAD_INPUTS = {
    "int dtype": lambda x: x.to(torch.int64),
    "wrong rank": lambda x: x[0],
    "empty batch": lambda x: x[:0],
    "batch of one with BatchNorm": lambda x: x[:1],
    "NaN": lambda x: x.clone().index_fill_(0, torch.tensor([3]), float("nan")),
    "inf": lambda x: x.clone().index_fill_(0, torch.tensor([0]), float("inf")),
    "float64 into float32 model": lambda x: x.double(),
    "not a tensor": lambda x: x.numpy(),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_and_leaves_state(batch, case):
    x, y = batch
    m = make()
    m.oracle.set_labels(y)
    m(x)  # some state first
    before = snapshot(m)
    with pytest.raises(InvalidInputError):
        m(BAD_INPUTS[case](x))
    assert same(before, snapshot(m))


def test_wrong_device_raises(batch):
    x, _ = batch
    m = make()
    with pytest.raises(InvalidInputError, match="meta"):
        m(x.to("meta"))


BAD_ORACLES = {
    "wrong shape": lambda inp, idx: torch.zeros(len(idx) + 1, dtype=torch.long),
    "float labels": lambda inp, idx: torch.zeros(len(idx)),
    "out of range": lambda inp, idx: torch.full((len(idx),), 99),
    "negative": lambda inp, idx: torch.full((len(idx),), -7),
    "raises": lambda inp, idx: (_ for _ in ()).throw(KeyError("annotator offline")),
    "not labels": lambda inp, idx: "cat",
}


@pytest.mark.parametrize("case", sorted(BAD_ORACLES))
def test_bad_oracle_raises_and_leaves_state(batch, case):
    x, y = batch
    answers = {"ok": True}

    def oracle(inp, idx):
        return y[idx] if answers["ok"] else BAD_ORACLES[case](inp, idx)

    m = make(oracle=oracle)
    m(x)
    answers["ok"] = False
    before = snapshot(m)
    with pytest.raises(OracleError):
        m(x)
    assert same(before, snapshot(m))
    answers["ok"] = True  # and the stream goes on as if the failed batch never happened
    m(x)
    assert m.labels_used == 2


def test_constructor_errors():
    model = confident_cnn()
    params = eatta.configure(model)
    opt = torch.optim.SGD(params, lr=0.1)
    with pytest.raises(TypeError, match="oracle"):
        EATTA(model, opt, oracle=None)
    with pytest.raises(ValueError, match="per_batch"):
        EATTA(model, opt, oracle=lambda *a: None, budget=-1)
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not the model's"):
        EATTA(model, torch.optim.SGD(other.parameters(), lr=0.1), oracle=lambda *a: None)


# -- reset and state -------------------------------------------------------------------------
def test_reset_restores_everything(batch):
    x, y = batch
    m = make(buffer=4)
    initial = snapshot(m)
    m.oracle.set_labels(y)
    for _ in range(3):
        m(x)
    assert not same(initial, snapshot(m))
    m.reset()
    assert same(initial, snapshot(m))


def run_stream(m: EATTA, xs, ys):
    outs = []
    for x, y in zip(xs, ys, strict=True):
        m.oracle.set_labels(y)
        outs.append(m(x))
    return outs


def stream(n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(16, 3, 8, 8, generator=g) for _ in range(n)], [
        torch.randint(0, 5, (16,), generator=g) for _ in range(n)
    ]


def test_state_dict_round_trip_continues_identically(tmp_path):
    xs, ys = stream()
    a = make(buffer=8, budget=2)
    run_stream(a, xs[:3], ys[:3])
    path = tmp_path / "state.pt"
    torch.save(a.state_dict(), path)
    tail_a = run_stream(a, xs[3:], ys[3:])

    b = make(buffer=8, budget=2)
    b.load_state_dict(torch.load(path, weights_only=True))
    tail_b = run_stream(b, xs[3:], ys[3:])
    assert all(torch.equal(p, q) for p, q in zip(tail_a, tail_b, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(a.params, b.params, strict=True))
    assert a.labels_used == b.labels_used <= 12


RESUME_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_eatta import make, run_stream, stream
    xs, ys = stream()
    m = make(buffer=8, budget=2)
    if sys.argv[1] == "save":
        run_stream(m, xs[:3], ys[:3])
        torch.save(m.state_dict(), sys.argv[2])
    else:
        m.load_state_dict(torch.load(sys.argv[2], weights_only=True))
        outs = run_stream(m, xs[3:], ys[3:])
        torch.save({{"outs": outs, "params": [p.detach() for p in m.params]}}, sys.argv[3])
    """
)


def test_resume_in_a_new_process_is_bit_identical(tmp_path):
    import os

    tests = os.path.dirname(__file__)
    script = tmp_path / "resume.py"
    script.write_text(
        RESUME_SCRIPT.format(tests=tests).replace(
            "sys.path.insert(0, ",
            f"sys.path.insert(0, {os.path.dirname(tests)!r}); sys.path.insert(0, ",
        )
    )
    state, result = tmp_path / "state.pt", tmp_path / "result.pt"
    subprocess.run([sys.executable, str(script), "save", str(state)], check=True)
    subprocess.run([sys.executable, str(script), "load", str(state), str(result)], check=True)
    got = torch.load(result, weights_only=True)

    xs, ys = stream()
    m = make(buffer=8, budget=2)
    outs = run_stream(m, xs, ys)[3:]
    assert all(torch.equal(p, q) for p, q in zip(outs, got["outs"], strict=True))
    assert all(torch.equal(p, q) for p, q in zip(m.params, got["params"], strict=True))


def test_reference_preset_trains_the_authors_set_and_measures_all_norms():
    from eatta.golden import TinyResNetLike
    from eatta.methods.registry import create

    model = TinyResNetLike(4, 3)
    with torch.no_grad():
        model.fc.weight.mul_(10)
    oracle = GroundTruthOracle()
    split = (eatta.golden._Features(model), model.fc)
    m = create("eatta", model, dataset="imagenet-c", oracle=oracle, preset="reference", split=split)
    trained = {n for n, p in model.named_parameters() if any(p is q for q in m.params)}
    assert trained == {
        "bn1.weight",
        "bn1.bias",
        "layer1.0.weight",
        "layer1.1.weight",
        "layer1.1.bias",
    }
    assert m.steps == 2 and model.layer4[1].weight.requires_grad  # measured, not trained
    layer4 = model.layer4[1].weight.clone()
    oracle.set_labels(torch.randint(0, 3, (8,)))
    m(torch.randn(8, 3, 8, 8))
    assert m.labels_used == 2 and torch.equal(layer4, model.layer4[1].weight)
    with pytest.raises(ValueError, match="preset"):
        create("eatta", TinyResNetLike(4, 3), oracle=oracle, preset="bogus")
