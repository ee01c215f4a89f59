"""The top-level namespace: the design's few names; every other part from its own module."""

from __future__ import annotations

import importlib

import pytest

import eatta

#: Names that left the top level (issue 35), and the module each is imported from now.
MOVED = {
    "GaussianNoise": "eatta.selection.perturbation",
    "RecordedNoise": "eatta.selection.perturbation",
    "GradNormDebiaser": "eatta.debias",
    "LabelBuffer": "eatta.buffer",
    "LastKClasses": "eatta.balance",
    "NoClassBalance": "eatta.balance",
    "ReferenceBalance": "eatta.balance",
    "MixedBatchNorm": "eatta.normalization",
    "set_mix_weight": "eatta.normalization",
    "use_mixed_norm": "eatta.normalization",
    "ModelOracle": "eatta.annotate",
    "ModelSplit": "eatta.split",
    "PerturbationSelector": "eatta.selection",
    "SampleWindow": "eatta.window",
    "collect_params": "eatta.configure",
    "configure_model": "eatta.configure",
}


def test_all_is_small_and_every_name_resolves():
    assert len(eatta.__all__) <= 16
    assert len(set(eatta.__all__)) == len(eatta.__all__)
    assert all(hasattr(eatta, name) for name in eatta.__all__)
    assert {"EATTA", "create", "available", "describe", "configure", "Budget"} <= set(eatta.__all__)


def test_the_design_shape_is_at_the_top():
    assert eatta.create.__module__ == "eatta.methods.registry"
    assert eatta.EATTA.__module__ == "eatta.methods.eatta"
    assert callable(eatta.configure)  # the function, not the module of the same name


@pytest.mark.parametrize(("name", "module"), sorted(MOVED.items()))
def test_a_moved_name_is_imported_from_its_module(name, module):
    assert name not in eatta.__all__
    assert hasattr(importlib.import_module(module), name)
