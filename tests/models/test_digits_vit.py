"""The digits-C LayerNorm source model: architecture, training, packaged weights, the benchmark."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import one_thread  # noqa: F401  (autouse fixture)
from torch import nn

import eatta
import eatta.models.digits_cnn as dm
import eatta.models.digits_vit as dv
from eatta.bench import suites
from eatta.data.digits import digits_c_domains, digits_test
from eatta.models.digits_cnn import DIGITS_SOURCE_SHA256, state_digest
from eatta.split import split_model


def test_split_is_found_and_only_layernorm_affines_adapt():
    torch.manual_seed(0)
    net = dv.DigitsViT().eval()
    x = torch.rand(3, 3, 32, 32)
    backbone, head = split_model(net, example=x)
    assert head is net.head
    assert torch.equal(head(backbone(x)), net(x))
    assert net(x).shape == (3, 10)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    params = eatta.configure(net)
    norms = [m for m in net.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * 4 + 1  # two per block, one final
    assert {id(p) for p in params} == {id(p) for m in norms for p in (m.weight, m.bias)}


def test_a_sample_is_predicted_alike_alone_and_in_a_batch():
    """No BatchNorm: a batch of one gets the logits it gets inside a batch (what lets the
    benchmark run this model at batch size 1)."""
    torch.manual_seed(1)
    net = dv.DigitsViT().eval()
    x = torch.rand(5, 3, 32, 32)
    together = net(x)
    alone = torch.cat([net(x[i : i + 1]) for i in range(5)])
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="divisible by heads 3"):
        dv.DigitsViT(dim=64, heads=3)
    with pytest.raises(ValueError, match="image_size 30 is not divisible by patch 4"):
        dv.DigitsViT(image_size=30)
    with pytest.raises(ValueError, match="epochs must be an int >= 1, got 0"):
        dv.train_digits_vit(epochs=0)


def test_training_is_deterministic_per_seed(monkeypatch):
    from eatta.data import digits

    small = digits.digits_source(limit=128)  # two steps an epoch; built once
    for name in ("digits_source", "digits_test"):  # the recipe's data (digits_cnn's module)
        monkeypatch.setattr(dm, name, lambda seed=0: small)
    a, ra = dv.train_digits_vit(seed=0, epochs=1)
    b, rb = dv.train_digits_vit(seed=0, epochs=1)
    assert state_digest(a) == state_digest(b)
    assert ra["clean_test_accuracy"] == rb["clean_test_accuracy"] and not a.training
    assert ra["epochs"] == 1 and ra["version"] == dv.DIGITS_VIT_VERSION
    c, _ = dv.train_digits_vit(seed=1, epochs=1)
    assert state_digest(c) != state_digest(a)


def test_packaged_weights_match_their_digest_and_report():
    model, report = dv.packaged_digits_vit()
    assert report["packaged"] is True and report["sha256"] == dv.DIGITS_VIT_SHA256
    assert state_digest(model) == dv.DIGITS_VIT_SHA256 != DIGITS_SOURCE_SHA256
    assert report["epochs"] == dv._EPOCHS and report["seed"] == 0
    x, y = digits_test().tensors  # the report's clean accuracy, recomputed
    with torch.no_grad():
        acc = int((model(x).argmax(1) == y).sum()) / len(y)
    # computed with AVX2 kernels; others may round one borderline logit the other way
    assert acc == pytest.approx(report["clean_test_accuracy"], abs=1.5 / len(y))
    assert acc > 0.9


def test_damaged_or_missing_weights_are_an_error(tmp_path, monkeypatch):
    model, report = dv.packaged_digits_vit()
    state = model.state_dict()
    state["head.bias"] = state["head.bias"] + 1e-3
    bad = tmp_path / "vit.pt"
    torch.save({"state_dict": state, "report": report}, bad)
    monkeypatch.setattr(dv, "PACKAGED_VIT_WEIGHTS", bad)
    with pytest.raises(RuntimeError, match="damaged"):
        dv.packaged_digits_vit()
    monkeypatch.setattr(dv, "PACKAGED_VIT_WEIGHTS", tmp_path / "absent.pt")
    with pytest.raises(RuntimeError, match="missing or unreadable"):
        dv.packaged_digits_vit()


@pytest.fixture
def small_digits_c(tmp_path, monkeypatch):
    """Two real digits-C domains of three images each, instead of the full 15 x 898."""
    import eatta.data.digits as digits

    monkeypatch.setattr(
        digits,
        "digits_c_domains",
        lambda cache_dir=None, severity=5: digits_c_domains(
            ("snow", "frost"), severity, limit=3, cache_dir=tmp_path
        ),
    )


def test_benchmark_names_and_records_the_model(small_digits_c):
    cnn = suites.digits_c_benchmark()
    vit = suites.digits_c_benchmark(backbone="digits-vit")
    assert (cnn.name, vit.name) == ("digits-c", "digits-c:vit")
    assert cnn.defaults_key == vit.defaults_key == "digits-c"
    assert cnn.config["model"].startswith("digits-cnn") and vit.config["model"] == "digits-vit v1"
    assert vit.provenance["model_sha256"] == dv.DIGITS_VIT_SHA256
    assert cnn.provenance["model_sha256"] == DIGITS_SOURCE_SHA256
    assert cnn.provenance["data_sha256"] == vit.provenance["data_sha256"]
    # each is compared with its own reference model: only the (limited) data differs
    assert vit.expected_provenance["model_sha256"] == dv.DIGITS_VIT_SHA256
    assert "model_sha256" not in vit.provenance_mismatch()
    assert "model_sha256" not in cnn.provenance_mismatch()
    assert state_digest(vit.model_fn()) == dv.DIGITS_VIT_SHA256
    assert isinstance(vit.model_fn(), dv.DigitsViT)


def test_unknown_digits_backbone_is_an_error_naming_it():
    assert suites.digits_grid_name(None) == suites.digits_grid_name("digits-cnn") == "digits-c"
    with pytest.raises(ValueError, match="digits-c has no backbone 'resnet50_bn'"):
        suites.digits_c_benchmark(backbone="resnet50_bn")
