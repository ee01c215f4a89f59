"""``examples/never_worse_check.py``: the check a user runs on their own model and streams."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from types import ModuleType

import pytest
import torch
from torch.utils.data import TensorDataset

from eatta.bench import StreamProtocol
from eatta.data.digits import digits_source, digits_test
from eatta.data.stream import Domain
from repo_scripts import REPO, repo_script


@pytest.fixture(scope="module")
def script() -> Iterator[ModuleType]:
    with repo_script("examples", "never_worse_check") as module:
        yield module


def test_check_on_your_own_model_and_stream(script, tmp_path):
    """A model and two domains of one's own: every annotator's row against the given model,
    the given model's cells exactly its unadapted error, the margin and worse domains computed."""
    torch.manual_seed(0)
    model = script.small_resnet()
    with torch.no_grad():  # running statistics of its own, as a trained model has
        model.train()
        model(torch.rand(64, 3, 32, 32))
    model.eval()

    def fresh() -> torch.nn.Module:
        copy = script.small_resnet()
        copy.load_state_dict(model.state_dict())
        return copy.eval()

    g = torch.Generator().manual_seed(1)
    x = torch.rand(256, 3, 32, 32, generator=g)
    x[128:] *= 0.5  # a second, darker domain
    y = torch.randint(0, 10, (256,), generator=g)
    domains = [
        Domain(n, TensorDataset(x[i : i + 128], y[i : i + 128])) for n, i in (("a", 0), ("b", 128))
    ]
    streams = {"own": (domains, StreamProtocol(rounds=1))}
    run = partial(script.check, fresh, streams, seeds=[0, 1], annotators=["at once", "none"])
    report = run(sizes=(64, 8), out=tmp_path, jobs=1)
    small = report.pop("own @ 8")  # requests of 8 through the window: eatta-safe alone
    assert small["given"] == report["own"]["given"] and small["stable"] == {}
    assert set(small["safe"]) == {"at once", "none"}
    entry = report["own"]
    with torch.no_grad():
        unadapted = 100.0 * float((model(x).argmax(1) != y).float().mean())
    assert entry["given"]["mean"] == pytest.approx(unadapted) and entry["given"]["std"] == 0.0
    assert set(entry["safe"]) == {"at once", "none"} and set(entry["stable"]) == {"at once"}
    none = entry["safe"]["none"]
    assert len(none["errors"]) == 2 and set(none["domains"]) == {"a", "b"}
    served = entry["safe"]["none"]["served_given"]
    assert 0.0 <= served <= 1.0 and entry["given"]["served_given"] is None
    table = script.render("own", entry)
    margin = entry["safe"]["none"]["mean"] - entry["given"]["mean"]
    assert "| none | - | " in table and f"{margin:+.2f}" in table
    summary = script.overview(report).splitlines()
    assert summary[0].startswith("| stream | given |") and summary[2].startswith("| own | ")
    # finished runs are read back: a second call computes nothing new and says the same
    again = run(out=tmp_path, jobs=1)
    assert json.dumps(again, sort_keys=True) == json.dumps(report, sort_keys=True)
    with pytest.raises(ValueError, match=r"defaults.*'imagenet'"):
        run(out=tmp_path / "other", defaults="imagenet")
    assert not (tmp_path / "other").exists()


def test_unknown_streams_and_annotators_are_refused_before_anything_runs(script, tmp_path, capsys):
    with pytest.raises(SystemExit):
        script.main(["--streams", "clean,nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        script.main(["--annotators", "at once,sometimes", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        script.main(["--sizes", "64,3", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        script.main(["--seeds", "0,x", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        script.main(["--model", "vgg", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "nope" in err and "'vgg'" in err
    assert not any(tmp_path.iterdir())  # no model trained, no run written


@pytest.mark.parametrize(
    ("model", "summary"),
    [("resnet", "never_worse_check.json"), ("convnext", "never_worse_check_convnext.json")],
)
def test_the_shipped_weights_are_the_documented_models(script, model, summary):
    """The demo starts from the weights the committed results were made with: each network's
    error on the clean digits is its summary's given model's (a sample of kernel slack)."""
    net = script.shipped_model(model)
    halves = zip(digits_source().tensors, digits_test().tensors, strict=True)
    x, y = (torch.cat(pair) for pair in halves)
    with torch.no_grad():
        error = 100.0 * float((net(x).argmax(1) != y).float().mean())
    given = json.loads((REPO / "benchmarks/results" / summary).read_text())["clean"]["given"]
    assert error == pytest.approx(given["mean"], abs=0.12)


def test_other_weights_are_refused_by_their_digest(script, tmp_path):
    with pytest.raises(FileNotFoundError, match="--retrain"):
        script.shipped_model("resnet", tmp_path / "absent.pt")
    other = tmp_path / "other.pt"
    torch.save(script.small_resnet().state_dict(), other)
    with pytest.raises(ValueError, match="SHA-256"):
        script.shipped_model("resnet", other)
    with pytest.raises(ValueError, match="SHA-256"):  # the other network's weights
        script.shipped_model("convnext", script.MODELS["resnet"].weights)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable state dict"):
        script.shipped_model("resnet", garbage)


def test_a_retrain_is_reproducible_in_one_process(script, tmp_path):
    """``--retrain`` seeds the initialization too: two trainings in one process agree."""
    first = script.train_on_mnist(tmp_path / "a.pt", epochs=1, limit=64, model="convnext")
    again = script.train_on_mnist(tmp_path / "b.pt", epochs=1, limit=64, model="convnext")
    for name, value in first.state_dict().items():
        assert torch.equal(value, again.state_dict()[name]), name
