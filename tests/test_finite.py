"""``all_finite`` (and ``is_finite``, its answer read at once) equals ``isfinite(x).all()`` on
every dtype and shape, whatever non-finite values are planted where, and a batch with one of them
is refused before any state changes."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import eatta
from conftest import nested_equal, tiny_cnn
from eatta._finite import all_finite
from eatta.methods.base import is_finite

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
BAD = [math.nan, math.inf, -math.inf]


@given(
    dtype=st.sampled_from(FLOATS),
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=4),
    planted=st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(BAD)), max_size=3),
    scale=st.sampled_from([1e-30, 1.0, 1e30]),
    seed=st.integers(0, 2**16),
)
def test_equals_the_elementwise_check(dtype, shape, planted, scale, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    flat = x.view(-1)
    for position, value in planted:
        if flat.numel():
            flat[position % flat.numel()] = value
    got = all_finite(x)
    assert got.dtype == torch.bool and got.shape == () and got.device == x.device
    assert bool(got) == bool(torch.isfinite(x).all()) == is_finite(x)


def test_extremes_integers_and_complex() -> None:
    big = torch.tensor([torch.finfo(torch.float32).max, -torch.finfo(torch.float32).max])
    assert bool(all_finite(big)) and is_finite(big)  # a sum would overflow; the extremes do not
    for fine in (torch.arange(5), torch.ones(2, dtype=torch.bool)):
        assert bool(all_finite(fine)) and is_finite(fine)
    z = torch.tensor([1 + 2j, complex(math.inf, 0)])
    assert not bool(all_finite(z)) and bool(all_finite(z[:1]))
    assert not is_finite(z) and is_finite(z[:1])


@pytest.mark.small_batches
@pytest.mark.parametrize("value", BAD)
def test_a_batch_with_one_non_finite_value_is_refused_unchanged(value: float) -> None:
    method = eatta.create("tent", tiny_cnn())
    method(torch.randn(16, 3, 8, 8))
    before = copy.deepcopy(method.state_dict())
    x = torch.randn(16, 3, 8, 8)
    x[7, 2, 3, 4] = value
    with pytest.raises(eatta.InvalidInputError, match="NaN or infinite"):
        method(x)
    assert nested_equal(method.state_dict(), before)
