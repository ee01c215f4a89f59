"""Checks shared by the active baselines' tests (Baseline, SimATTA, CEMA).

Each ``check_*`` takes ``make(oracle=..., budget=...) -> AdaptiveMethod`` building a fresh method
around the same tiny BatchNorm CNN (same initial weights every call).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from _state_checks import assert_reset_state, assert_same_state, differences, exact_state
from eatta import Budget, InvalidInputError, OracleError
from eatta.methods.base import AdaptiveMethod

Make = Callable[..., AdaptiveMethod]


def stream(n: int = 6, seed: int = 3, batch: int = 16, classes: int = 5):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(batch, 3, 8, 8, generator=g) for _ in range(n)]
    ys = [torch.randint(0, classes, (batch,), generator=g) for _ in range(n)]
    return xs, ys


class Answers:
    """Oracle answering with the current batch's labels; records each call's size."""

    def __init__(self) -> None:
        self.y: torch.Tensor | None = None
        self.calls: list[int] = []

    def __call__(self, inputs: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        assert self.y is not None
        self.calls.append(len(idx))
        return self.y[idx]


def run(m: AdaptiveMethod, oracle: Answers, xs, ys) -> list[torch.Tensor]:
    outs = []
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        outs.append(m(x))
    return outs


def check_only_optimizer_params_change(make: Make) -> None:
    xs, ys = stream(3)
    oracle = Answers()
    m = make(oracle=oracle, budget=2)
    trained = {id(p) for g in m.optimizer.param_groups for p in g["params"]}
    before = {n: p.detach().clone() for n, p in m.model.named_parameters()}
    run(m, oracle, xs, ys)
    changed = {n for n, p in m.model.named_parameters() if not torch.equal(p, before[n])}
    allowed = {n for n, p in m.model.named_parameters() if id(p) in trained}
    assert changed, "nothing was adapted"
    assert changed <= allowed


def check_reset_is_exact(make: Make) -> None:
    xs, ys = stream(4)
    oracle = Answers()
    m = make(oracle=oracle, budget=2)
    initial = exact_state(m)
    first = run(m, oracle, xs, ys)
    assert differences(initial, exact_state(m))
    spent = m.budget.lifetime_used
    assert spent == m.labels_used > 0
    m.reset()
    assert_reset_state(initial, m, spent)  # all but the budget's lifetime count
    assert m.labels_used == 0 and m.budget.lifetime_used == spent
    again = run(m, oracle, xs, ys)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def check_state_dict_round_trip(make: Make, tmp_path) -> None:
    xs, ys = stream(6)
    oa, ob = Answers(), Answers()
    a = make(oracle=oa, budget=2)
    run(a, oa, xs[:3], ys[:3])
    path = tmp_path / "state.pt"
    torch.save(a.state_dict(), path)
    tail_a = run(a, oa, xs[3:], ys[3:])
    b = make(oracle=ob, budget=2)
    b.load_state_dict(torch.load(path, weights_only=True))
    tail_b = run(b, ob, xs[3:], ys[3:])
    assert all(torch.equal(p, q) for p, q in zip(tail_a, tail_b, strict=True))
    pairs = zip(a.model.parameters(), b.model.parameters(), strict=True)
    assert all(torch.equal(p, q) for p, q in pairs)
    assert not differences(exact_state(a), exact_state(b))
    assert a.labels_used == b.labels_used


def check_budget(make: Make, exact: bool = True) -> None:
    xs, ys = stream(6)
    oracle = Answers()
    m = make(oracle=oracle, budget=Budget(2, every=2))
    used = []
    for x, y in zip(xs, ys, strict=True):
        oracle.y = y
        m(x)
        used.append(m.labels_used)
    assert all(c <= 2 for c in oracle.calls)
    assert sum(oracle.calls) == m.labels_used
    if exact:
        assert used == [2, 2, 4, 4, 6, 6]
    else:  # labels only on batches 0, 2, 4, at most 2 each
        steps = [b - a for a, b in zip([0, *used], used, strict=False)]
        assert all(s == 0 for s in steps[1::2]) and all(s <= 2 for s in steps)


BAD_INPUTS = {
    "nan": lambda x: x.clone().index_fill_(0, torch.tensor([0]), float("nan")),
    "rank": lambda x: x[:, 0],
    "batch of one": lambda x: x[:1],
    "integer": lambda x: x.long(),
}


def check_bad_input(make: Make, case: str) -> None:
    xs, ys = stream(2)
    oracle = Answers()
    m = make(oracle=oracle, budget=2)
    run(m, oracle, xs[:1], ys[:1])
    before = exact_state(m)
    with pytest.raises(InvalidInputError):
        m(BAD_INPUTS[case](xs[1]))
    assert_same_state(before, m)


BAD_ORACLES = {
    "wrong shape": lambda inp, idx: torch.zeros(len(idx) + 1, dtype=torch.long),
    "float labels": lambda inp, idx: torch.zeros(len(idx)),
    "out of range": lambda inp, idx: torch.full((len(idx),), 99),
    "raises": lambda inp, idx: (_ for _ in ()).throw(KeyError("annotator offline")),
}


def check_bad_oracle(make: Make, case: str) -> None:
    xs, ys = stream(3)
    good = Answers()
    state = {"ok": True}

    def oracle(inp, idx):
        return good(inp, idx) if state["ok"] else BAD_ORACLES[case](inp, idx)

    m = make(oracle=oracle, budget=2)
    good.y = ys[0]
    m(xs[0])
    used = m.labels_used
    state["ok"] = False
    good.y = ys[1]
    before = exact_state(m)
    with pytest.raises(OracleError):
        m(xs[1])
    assert_same_state(before, m)
    assert m.labels_used == used
