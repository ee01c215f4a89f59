"""The label-free signs: the collapse ratio and the disagreement rate, by hand."""

import math

import pytest
import torch

from eatta.monitor.signs import LabelFreeSigns, entropy


def test_collapse_ratio_by_hand():
    signs = LabelFreeSigns(3, 0.9, 0.3)
    signs.record(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2, 3]))
    assert signs.collapse_ratio() == pytest.approx(math.log(2) / math.log(4), rel=1e-12)
    assert signs.disagreement_rate() == pytest.approx(3 / 4)  # 0=0; 0!=1, 1!=2, 1!=3
    assert signs.choice() == "adapted"  # 0.5 < 0.9: the given model's classes collapsed


def test_only_the_samples_the_given_model_predicted_on_count():
    signs = LabelFreeSigns(2, 0.5, 0.6)
    signs.record(torch.tensor([-1, 2, -1, 1]), torch.tensor([7, 2, 7, 0]))  # 2 of 4 read
    assert signs.disagreement_rate() == pytest.approx(1 / 2)
    assert signs.collapse_ratio() == pytest.approx(1.0)  # {2, 1} against {2, 0}
    assert signs.choice() == "source"  # neither sign: 1.0 >= 0.5 and 0.5 <= 0.6


def test_the_signs_read_the_last_batches_only_and_restore_from_state():
    signs = LabelFreeSigns(2, 0.9, 0.3)
    for g, a in (([0, 1], [1, 0]), ([0, 1], [0, 1]), ([2, 3], [2, 3])):
        signs.record(torch.tensor(g), torch.tensor(a))
    assert signs.disagreement_rate() == 0.0  # the first batch, all disagreeing, dropped out
    copy = LabelFreeSigns(2, 0.9, 0.3)
    copy.load_state_dict(signs.state_dict())
    assert copy.disagreement_rate() == 0.0 and copy.collapse_ratio() == signs.collapse_ratio()
    assert math.isnan(LabelFreeSigns(1, 0.9, 0.3).collapse_ratio())


def test_entropy_of_a_histogram():
    assert entropy(torch.tensor([2, 0, 2])) == pytest.approx(math.log(2))
    assert entropy(torch.tensor([0, 0])) == 0.0
