"""Digests of the benchmark data and the reference they are compared with."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from eatta.bench import provenance as prov
from eatta.bench.benchmark import BenchmarkData


def images(seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (6, 3, 4, 4), generator=g).float() / 255
    return TensorDataset(x, torch.arange(6) % 3)


def test_dataset_digest_follows_the_uint8_content_and_the_labels():
    a = prov.dataset_digest(images())
    assert a == prov.dataset_digest(images()) and len(a) == 64
    assert prov.dataset_digest(images(1)) != a
    x, y = images().tensors
    x2 = x.clone()
    x2[0, 0, 0, 0] = (x2[0, 0, 0, 0] * 255 + 1) % 256 / 255  # one pixel one level off
    assert prov.dataset_digest(TensorDataset(x2, y)) != a
    assert prov.dataset_digest(TensorDataset(x, (y + 1) % 3)) != a
    assert prov.dataset_digest(torch.utils.data.Subset(images(), [0])) is None  # not hashed
    assert prov.combine([a, a]) != prov.combine([a]) and prov.combine([a, None]) is None


def test_reference_of_a_domain_list_and_the_mismatch_report(monkeypatch):
    table = {"fog@5": "f5", "fog@3": "f3", "snow@5": "s5"}
    monkeypatch.setattr(prov, "_reference", lambda: {"model_sha256": "m", "domains_sha256": table})
    ref = prov.digits_reference(["fog", "snow"])
    assert ref == {"model_sha256": "m", "data_sha256": prov.combine(["f5", "s5"])}
    assert prov.digits_reference(["fog@3"])["data_sha256"] == prov.combine(["f3"])
    assert prov.digits_reference(["fog@1"])["data_sha256"] is None  # no reference digest
    b = BenchmarkData("d", "default", [], lambda: torch.nn.Identity())
    assert b.provenance_mismatch() == []
    b.provenance = {"model_sha256": "m", "data_sha256": "x"}
    b.expected_provenance = ref
    assert b.provenance_mismatch() == ["data_sha256"]
    assert set(prov.corruption_stack_versions()) == set(prov.CORRUPTION_STACK)


def test_the_shipped_reference_names_every_digits_c_domain():
    from eatta.bench.digits_model import DIGITS_SOURCE_SHA256
    from eatta.data.digits import DIGITS_C_CORRUPTIONS

    ref = prov._reference()
    assert ref is not None and ref["model_sha256"] == DIGITS_SOURCE_SHA256
    keys = {f"{c}@{s}" for c in DIGITS_C_CORRUPTIONS for s in range(1, 6)}
    assert set(ref["domains_sha256"]) == keys
    assert ref["built_with"]["corrupt-tta"] is not None
