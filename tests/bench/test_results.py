"""Cell results: row labels and the stored format."""

from __future__ import annotations

from eatta.bench.grid import CellSpec
from eatta.bench.results import CellResult, domain_means, row_label


def test_reference_preset_row_label_counts_its_two_labelled_steps():
    spec = CellSpec("imagenet-c", "eatta", "ctta", 1, 1)
    assert row_label(spec, {"preset": "reference"}) == "eatta reference (2/batch)"
    assert row_label(spec, {"steps": 3}) == "eatta (3/batch)"
    assert row_label(spec, {}) == "eatta (1/batch)"
    assert (
        row_label(CellSpec("toy", "baseline", "ctta", 1, 1), {"steps": 2}) == "baseline (1/batch)"
    )


def test_domain_means_weigh_every_visit_of_every_run_by_its_images():
    def cell(domains: list[str], images: list[int], errors: list[float]) -> CellResult:
        return CellResult(
            spec=CellSpec("toy", "tent", "ctta"), grid_index=0, fingerprint="f",
            domains=domains, domain_images=images, domain_errors=errors,
            domain_labels=[0] * len(domains), average_error=0.0, overall_error=0.0,
            labels_used=0, images=sum(images), wall_time_s=0.0, images_per_s=0.0,
            peak_mem_mb=None, max_rss_mb=None, device="cpu", online=[],
            domain_first_batch=[0] * len(domains), model_digest="m", hparams={},
        )  # fmt: skip

    first = cell(["a", "b", "a"], [10, 20, 30], [50.0, 10.0, 10.0])  # a visited twice
    second = cell(["a", "b"], [40, 20], [0.0, 30.0])
    assert domain_means([first]) == {"a": 20.0, "b": 10.0}  # (10·50 + 30·10) / 40
    assert domain_means([first, second]) == {"a": 10.0, "b": 20.0}  # 800 / 80, 800 / 40
