"""Cell results: row labels and the stored format."""

from __future__ import annotations

from eatta.bench.grid import CellSpec
from eatta.bench.results import row_label


def test_reference_preset_row_label_counts_its_two_labelled_steps():
    spec = CellSpec("imagenet-c", "eatta", "ctta", 1, 1)
    assert row_label(spec, {"preset": "reference"}) == "eatta reference (2/batch)"
    assert row_label(spec, {"steps": 3}) == "eatta (3/batch)"
    assert row_label(spec, {}) == "eatta (1/batch)"
    assert (
        row_label(CellSpec("toy", "baseline", "ctta", 1, 1), {"steps": 2}) == "baseline (1/batch)"
    )
