"""The benchmark grid: canonical cells, seeds, shards."""

from __future__ import annotations

import pytest

from eatta.bench.grid import CellSpec, make_grid, make_jobs, parse_shard, shard


def test_grid_skips_what_a_method_ignores():
    grid = make_grid(["toy"], ["source", "tent", "eatta"], ["ctta", "ftta"], [(1, 1), (3, 1)])
    keys = [c.key for c in grid]
    assert keys == [
        "toy/source/-/k0-n1",
        "toy/tent/ctta/k0-n1",
        "toy/eatta/ctta/k1-n1",
        "toy/eatta/ctta/k3-n1",
        "toy/tent/ftta/k0-n1",
        "toy/eatta/ftta/k1-n1",
        "toy/eatta/ftta/k3-n1",
    ]
    with pytest.raises(ValueError, match="setting"):
        make_grid(["toy"], ["tent"], ["sometimes"])
    with pytest.raises(KeyError):
        make_grid(["toy"], ["no-such-method"])


def test_shards_partition_the_grid_deterministically():
    grid = make_grid(["a", "b"], ["source", "tent", "eatta", "baseline"], ["ctta", "ftta"])
    parts = [shard(grid, i, 3) for i in range(3)]
    indices = sorted(j for p in parts for j, _ in p)
    assert indices == list(range(len(grid)))
    assert parts == [shard(grid, i, 3) for i in range(3)]
    assert [c for _, c in parts[1]] == [grid[j] for j in range(1, len(grid), 3)]
    assert parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)


def test_jobs_repeat_every_cell_per_seed_and_cell_specs_are_validated():
    grid = make_grid(["toy"], ["tent", "eatta"])
    jobs = make_jobs(grid, [3, 5])
    assert jobs == [(grid[0], 3), (grid[0], 5), (grid[1], 3), (grid[1], 5)]
    with pytest.raises(ValueError, match="distinct"):
        make_jobs(grid, [1, 1])
    with pytest.raises(ValueError, match="at least one seed"):
        make_jobs(grid, [])
    with pytest.raises(ValueError, match="buffer"):
        CellSpec("toy", "eatta", "ctta", 1, 1, -1)
