"""What a newcomer meets first (issue 63): a misspelt method name, train() and eval(), the step
record printed, and one exception class, in the user's terms, for one fault in every method."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import eatta
from conftest import confident_cnn, nested_equal
from eatta.annotate import SimulatedAnnotator


def test_a_misspelt_method_name_gets_the_nearest_one() -> None:
    with pytest.raises(KeyError, match="did you mean 'eatta-safe'"):
        eatta.create("eatta_safe", confident_cnn(), oracle=eatta.GroundTruthOracle())
    with pytest.raises(KeyError, match="did you mean 'tent'"):
        eatta.create("Tnet", confident_cnn())


def test_create_says_which_methods_there_are() -> None:
    doc = eatta.create.__doc__ or ""
    assert "eatta.available()" in doc
    assert all(f"``{name}``" in doc for name in eatta.available())


def _dropout_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )


@pytest.mark.parametrize("call", ["eval", "train"])
def test_train_and_eval_change_nothing_of_how_a_method_adapts_or_serves(call: str) -> None:
    """A habit from PyTorch (``method.eval()`` before serving) neither stops adaptation nor
    turns the model's dropout on or its BatchNorm to running statistics: the method with the
    call serves and adapts bit for bit as the one without."""
    plain = eatta.create("tent", _dropout_cnn())
    called = eatta.create("tent", _dropout_cnn())
    modes = [(n, m.training) for n, m in called.model.named_modules()]
    getattr(called, call)()
    assert called.training is (call == "train")
    assert [(n, m.training) for n, m in called.model.named_modules()] == modes
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.rand(16, 3, 8, 8, generator=g)
        torch.testing.assert_close(plain(x), called(x), rtol=0, atol=0)
    assert nested_equal(plain.model.state_dict(), called.model.state_dict())


def test_the_step_record_prints_a_short_summary_with_the_tensors_one_attribute_away() -> None:
    method = eatta.create("eatta", confident_cnn(), oracle=eatta.GroundTruthOracle())
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(16, 3, 8, 8, generator=g), torch.randint(0, 5, (16,), generator=g)
    method(x, labels=y)
    record = method.last_step
    text = repr(record)
    assert text.startswith("StepRecord(asked [") and "answered {" in text and "loss " in text
    assert len(text.splitlines()) == 1 and len(text) < 200
    (asked,) = record.requested.tolist()
    assert f"{asked}: {int(y[asked])}" in text  # what was asked, and what was answered
    assert record.logits.shape == (16, 5)  # the tensors are fields, as before


def test_a_late_answer_shows_in_the_record_of_the_step_it_lands_in() -> None:
    method = eatta.create("eatta-stable", confident_cnn(), oracle=SimulatedAnnotator(delay=1))
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.rand(16, 3, 8, 8, generator=g), torch.randint(0, 5, (16,), generator=g))
        for _ in range(2)
    ]
    method(*batches[0][:1], labels=batches[0][1])
    first = method.last_step
    assert len(first.requested) == 1 and len(first.selected) == 0 and first.late == 0
    (asked,) = first.requested.tolist()
    method(batches[1][0], labels=batches[1][1])
    landed = method.last_step
    assert landed.late == 1 and landed.late_answers == [
        (1, asked, f"class {int(batches[0][1][asked])}")
    ]
    assert "late [(1, " in repr(landed)


@pytest.mark.parametrize("name", ["eatta", "eatta-safe", "eatta-stable", "baseline"])
def test_labels_outside_the_classes_are_one_error_in_every_method(name: str) -> None:
    method = eatta.create(name, confident_cnn(), oracle=eatta.GroundTruthOracle())
    before = copy.deepcopy(method.state_dict())
    x = torch.rand(16, 3, 8, 8)
    with pytest.raises(eatta.OracleError, match=r"classes of the model, in \[0, 5\).*labels=y"):
        method(x, labels=torch.full((16,), 7))
    assert nested_equal(method.state_dict(), before)


@pytest.mark.parametrize("name", ["tent", "eatta", "eatta-safe"])
def test_a_wrong_channel_count_is_told_in_the_users_terms(name: str) -> None:
    kw = {} if name == "tent" else {"oracle": eatta.GroundTruthOracle()}
    method = eatta.create(name, confident_cnn(), **kw)
    with pytest.raises(eatta.InvalidInputError, match=r"1 channel\(s\).*\(16, 1, 8, 8\).*takes 3"):
        method(torch.rand(16, 1, 8, 8))


def test_a_small_batch_warning_under_eatta_bench_names_its_flag(monkeypatch) -> None:
    """Under ``eatta-bench`` the small-batch warning says ``--window 64``, not a Python call;
    after it, a Python caller's warning names the Python keyword again."""
    import warnings

    from eatta.bench import cli
    from eatta.window import SmallBatchWarning

    def small_batch() -> str:
        method = eatta.create("tent", confident_cnn())
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", SmallBatchWarning)
            method(torch.rand(8, 3, 8, 8))
        (w,) = [w for w in seen if w.category is SmallBatchWarning]
        return str(w.message)

    said: list[str] = []
    monkeypatch.setattr(cli.commands, "run", lambda args, argv: said.append(small_batch()) or 0)
    assert cli.main(["--methods", "tent", "--batch-size", "8"]) == 0
    assert "--window 64" in said[0] and "--window off" in said[0]
    assert "eatta.create" not in said[0]
    assert "window=64" in small_batch() and "--window" not in small_batch()
