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
    from eatta.data.digits import DIGITS_C_CORRUPTIONS
    from eatta.models.digits_cnn import DIGITS_SOURCE_SHA256

    ref = prov._reference()
    assert ref is not None and ref["model_sha256"] == DIGITS_SOURCE_SHA256
    keys = {f"{c}@{s}" for c in DIGITS_C_CORRUPTIONS for s in range(1, 6)}
    assert set(ref["domains_sha256"]) == keys
    assert ref["built_with"]["corrupt-tta"] is not None


def test_machine_provenance_names_torch_s_kernels_and_the_architecture(monkeypatch):
    import platform

    got = prov.machine_provenance()
    assert got == {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "NEON")
    assert prov.machine_provenance()["cpu_capability"] == "NEON"


def test_other_kernels_are_one_line_of_information_other_data_a_warning(monkeypatch):
    from eatta.bench.api import provenance_notes

    b = BenchmarkData("digits-c", "default", [], lambda: torch.nn.Identity())
    b.expected_provenance = {"model_sha256": "m", "data_sha256": "d", "cpu_capability": "AVX2"}
    b.provenance = {"model_sha256": "m", "data_sha256": "d", "cpu_capability": "AVX2"}
    assert provenance_notes(b) == []
    b.provenance["cpu_capability"] = "AVX512"
    notes = provenance_notes(b)
    assert len(notes) == 1 and notes[0].startswith("note: digits-c: same data and model")
    assert "AVX512" in notes[0] and "AVX2" in notes[0] and "warning" not in notes[0]
    b.provenance["data_sha256"] = "x"  # other data: the warning alone, not the note
    notes = provenance_notes(b)
    assert len(notes) == 1 and notes[0].startswith("warning: digits-c: data_sha256 is x")
    b.expected_provenance = {"model_sha256": "m", "data_sha256": "d"}  # no capability recorded
    b.provenance = {"model_sha256": "m", "data_sha256": "d", "cpu_capability": "AVX512"}
    assert provenance_notes(b) == []


def test_the_reference_records_what_computed_the_readme_table():
    ref = prov._reference()
    assert ref is not None
    assert ref["cpu_capability"] and ref["machine"]
    expected = prov.digits_reference(["fog"])
    assert expected is not None and expected["cpu_capability"] == ref["cpu_capability"]
