"""The digits-C source model: architecture, deterministic training, caching."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import one_thread  # noqa: F401  (autouse fixture)
from torch import nn

import eatta
import eatta.models.digits_cnn as dm
from eatta.split import split_model


@pytest.fixture
def quick(monkeypatch):
    """Train for one epoch only (the real recipe is exercised by the slow test)."""
    monkeypatch.setattr(dm, "_EPOCHS", 1)


def test_architecture_splits_automatically_and_takes_digits_c_images():
    net = dm.digits_cnn()
    assert isinstance(net, nn.Sequential) and isinstance(net[-1], nn.Linear)
    backbone, head = split_model(net)
    x = torch.rand(4, 3, 32, 32)
    net.eval()
    assert torch.equal(head(backbone(x)), net(x))
    assert net(x).shape == (4, 10)
    params = eatta.configure(net)
    assert params and all(p.dim() == 1 for p in params)  # BatchNorm affine parameters only


def test_training_is_deterministic(quick):
    a, ra = dm.train_digits_cnn(seed=0, epochs=1)
    b, rb = dm.train_digits_cnn(seed=0, epochs=1)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    assert ra["clean_test_accuracy"] == rb["clean_test_accuracy"]
    assert not a.training
    c, _ = dm.train_digits_cnn(seed=1, epochs=1)
    assert not torch.equal(c[0].weight, a[0].weight)
    with pytest.raises(ValueError):
        dm.train_digits_cnn(epochs=0)


def test_cached_on_first_use_then_loaded(tmp_path, quick, monkeypatch):
    model, report = dm.load_digits_source(tmp_path)
    assert report["cached"] is False and dm.digits_model_path(tmp_path).is_file()
    assert 0.0 <= report["clean_test_accuracy"] <= 1.0 and report["epochs"] == 1
    monkeypatch.setattr(dm, "train_digits_cnn", lambda **kw: pytest.fail("retrained"))
    again, report2 = dm.load_digits_source(tmp_path)
    assert report2["cached"] is True
    assert report2["clean_test_accuracy"] == report["clean_test_accuracy"]
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v)
    assert isinstance(dm.digits_source_model(tmp_path), nn.Sequential)


def test_env_cache_dir_retrain_and_corrupt_file(tmp_path, quick, monkeypatch):
    monkeypatch.setenv("EATTA_CACHE", str(tmp_path))
    path = dm.digits_model_path()
    assert path.parent == tmp_path / "digits-c" and f"v{dm.DIGITS_MODEL_VERSION}" in path.name
    _, r1 = dm.load_digits_source()
    _, r2 = dm.load_digits_source(retrain=True)
    assert r1["cached"] is False and r2["cached"] is False
    path.write_bytes(b"not a checkpoint")
    _, r3 = dm.load_digits_source()
    assert r3["cached"] is False and dm.load_digits_source()[1]["cached"] is True


@pytest.mark.slow
def test_full_recipe_reaches_high_clean_accuracy():
    _, report = dm.train_digits_cnn()
    assert report["clean_test_accuracy"] > 0.95
    assert report["epochs"] == dm._EPOCHS


def test_packaged_weights_load_with_their_checksum(tmp_path, monkeypatch):
    model, report = dm.packaged_digits_source()
    assert report["packaged"] is True and report["sha256"] == dm.DIGITS_SOURCE_SHA256
    assert dm.state_digest(model) == dm.DIGITS_SOURCE_SHA256 and not model.training
    assert report["clean_test_accuracy"] > 0.95
    assert dm.PACKAGED_WEIGHTS.stat().st_size < 300_000  # tiny enough to ship
    # a damaged copy is refused, not silently used
    blob = torch.load(dm.PACKAGED_WEIGHTS, weights_only=True)
    blob["state_dict"]["0.weight"] = blob["state_dict"]["0.weight"] + 1e-6
    bad = tmp_path / "damaged.pt"
    torch.save(blob, bad)
    monkeypatch.setattr(dm, "PACKAGED_WEIGHTS", bad)
    with pytest.raises(RuntimeError, match="damaged"):
        dm.packaged_digits_source()
    monkeypatch.setattr(dm, "PACKAGED_WEIGHTS", tmp_path / "missing.pt")
    with pytest.raises(RuntimeError, match="missing"):
        dm.packaged_digits_source()


def test_state_digest_sees_every_bit_and_ignores_the_container():
    net = dm.digits_cnn()
    digest = dm.state_digest(net)
    assert dm.state_digest(dict(net.state_dict())) == digest
    with torch.no_grad():
        net[0].weight[0, 0, 0, 0] = torch.nextafter(net[0].weight[0, 0, 0, 0], torch.tensor(9.0))
    assert dm.state_digest(net) != digest
