"""The deployed stream (:mod:`eatta.data.deployed`): its layout and passes computed by hand, its
images and labels those of digits-C, read in order and mixed, and a source model that is good."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eatta.data import deployed
from eatta.data.deployed import CLEAN, deployed_domains, deployed_plan
from eatta.data.digits import digits_c, digits_test
from eatta.data.stream import TestStream

N_TEST = 898  # the digits-C test split
LAYOUT = (
    [CLEAN] * 3
    + ["gaussian_noise"]
    + [CLEAN] * 3
    + ["defocus_blur"]
    + [CLEAN] * 3
    + ["glass_blur"]
    + [CLEAN] * 3
    + ["impulse_noise"]
    + [CLEAN] * 3
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("digits-c")


@pytest.fixture(scope="module")
def domains(cache):
    return deployed_domains(cache_dir=cache)


def test_the_default_layout_is_four_stretches_between_runs_of_three_clean_segments():
    plan = deployed_plan(N_TEST)
    assert [name for name, _ in plan] == LAYOUT
    assert all(len(pos) == 256 and pos.dtype == np.int64 for _, pos in plan)
    corrupted = sum(name != CLEAN for name, _ in plan)
    assert (corrupted, len(plan)) == (4, 19)  # 21 % of the images corrupted


def test_the_segments_cut_seeded_passes_over_the_test_split():
    plan = deployed_plan(N_TEST, seed=7)
    order = np.concatenate([pos for _, pos in plan])
    rng = np.random.default_rng(7)  # by hand: 4,864 images take six passes of 898
    expected = np.concatenate([rng.permutation(N_TEST) for _ in range(6)])[: 19 * 256]
    assert np.array_equal(order, expected)
    assert sorted(order[:N_TEST].tolist()) == list(range(N_TEST))  # a pass shows each image once
    again = np.concatenate([pos for _, pos in deployed_plan(N_TEST, seed=7)])
    other = np.concatenate([pos for _, pos in deployed_plan(N_TEST, seed=8)])
    assert np.array_equal(order, again) and not np.array_equal(order, other)


def test_the_layout_follows_its_parameters():
    plan = deployed_plan(10, ["fog", "snow"], segment=4, clean_run=1, seed=0)
    assert [name for name, _ in plan] == [CLEAN, "fog", CLEAN, "snow", CLEAN]
    assert all(len(pos) == 4 for _, pos in plan)
    assert [name for name, _ in deployed_plan(10, ["fog"], segment=4, clean_run=0)] == ["fog"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"corruptions": ["rain"]}, "corruptions must be"),
        ({"corruptions": []}, "corruptions must be"),
        ({"segment": 1}, "segment must be an int >= 2"),
        ({"clean_run": -1}, "clean_run must be an int >= 0"),
        ({"clean_run": True}, "clean_run must be an int >= 0"),
    ],
)
def test_a_plan_that_cannot_be_built_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        deployed_plan(N_TEST, **kwargs)


def test_a_severity_outside_one_to_five_is_refused_before_any_image_is_built(tmp_path):
    with pytest.raises(ValueError, match=r"severity must be an int in 1\.\.5"):
        deployed_domains(severity=6, cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_every_segment_shows_its_images_with_their_labels(domains, cache):
    clean = digits_test()
    corrupted = {c: digits_c(c, 2, cache_dir=cache) for c in deployed.DEPLOYED_CORRUPTIONS}
    plan = deployed_plan(N_TEST)
    assert [d.name for d in domains] == LAYOUT
    for (name, pos), domain in zip(plan, domains, strict=True):
        x, y = domain.dataset.tensors
        source = clean if name == CLEAN else corrupted[name]
        assert torch.equal(x, source.tensors[0][pos])
        assert torch.equal(y, clean.tensors[1][pos])  # the labels of the clean images shown


def test_read_in_order_a_stretch_is_four_consecutive_corrupted_batches(domains):
    stream = TestStream(domains, 64, seed=0)
    names = [stream.domain_of_batch(t) for t in range(len(stream))]
    assert len(names) == 76
    assert names == [name for name in LAYOUT for _ in range(4)]


def test_mixed_every_batch_draws_from_the_whole_round(domains):
    stream = TestStream(domains, 64, seed=0, mixed=True)
    per_batch = [stream.sample_domains(t) for t in range(len(stream))]
    corrupted = [sum(LAYOUT[k] != CLEAN for k in ks) for ks in per_batch]
    assert sum(len(ks) for ks in per_batch) == 19 * 256
    assert sum(corrupted) == 4 * 256  # 4 / 19 of the samples, spread over the batches
    assert sum(0 < c < len(ks) for c, ks in zip(corrupted, per_batch, strict=True)) > 60


def test_the_source_model_is_good_on_the_stream_and_the_stretches_are_a_real_shift(domains):
    from eatta.models.digits_cnn import packaged_digits_source

    model, _ = packaged_digits_source()
    wrong: dict[str, list[int]] = {}
    with torch.no_grad():
        for d in domains:
            x, y = d.dataset.tensors
            counts = wrong.setdefault(d.name, [0, 0])
            counts[0] += int((model(x).argmax(1) != y).sum())
            counts[1] += len(y)
    error = {name: 100 * w / n for name, (w, n) in wrong.items()}
    overall = 100 * sum(w for w, _ in wrong.values()) / (19 * 256)
    assert overall < 15.0
    assert error[CLEAN] < 10.0  # the easy domain
    assert all(e > 10.0 for name, e in error.items() if name != CLEAN)


#: The default stream's digest (:func:`eatta.bench.provenance.combine` of its segments'): built
#: from digits-C data version 2 by integer indexing, it is the same on every CPU.
STREAM_SHA256 = "996e808bd2aa72bcc937731f81df0e77a12fd69496d2fa3dd9af833b59729cfe"


def test_the_stream_is_the_pinned_one(domains):
    from eatta.bench import provenance as prov

    assert prov.combine([prov.dataset_digest(d.dataset) for d in domains]) == STREAM_SHA256
