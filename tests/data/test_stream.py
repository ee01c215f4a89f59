"""Seeded, resumable CTTA test streams."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from eatta.data import Domain, TestStream


class Counting(Dataset[tuple[torch.Tensor, int]]):
    """Item ``i`` is ``(tensor([base + i]), label)``; counts how many items were read."""

    def __init__(self, n: int, base: int) -> None:
        self.n, self.base, self.reads = n, base, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.reads += 1
        return torch.tensor([float(self.base + i)]), (self.base + i) % 3


def domains(sizes: tuple[int, ...] = (10, 7, 5)) -> list[Domain]:
    return [Domain(f"d{k}", Counting(n, 100 * k)) for k, n in enumerate(sizes)]


def ids(batches: list[tuple[torch.Tensor, torch.Tensor, str]]) -> list[tuple[str, list[int]]]:
    return [(name, x.flatten().long().tolist()) for x, _, name in batches]


def test_batches_cover_each_domain_in_order_without_mixing() -> None:
    stream = TestStream(domains(), batch_size=4, seed=3)
    assert len(stream) == 3 + 2 + 2 and stream.batches_per_domain == [3, 2, 2]
    assert stream.num_samples == 22
    out = ids(list(stream))
    assert [name for name, _ in out] == ["d0"] * 3 + ["d1"] * 2 + ["d2"] * 2
    for k, n in enumerate((10, 7, 5)):
        seen = [i for name, b in out if name == f"d{k}" for i in b]
        assert sorted(seen) == [100 * k + i for i in range(n)]
    assert [len(b) for _, b in out] == [4, 4, 2, 4, 3, 4, 1]
    x, y, _ = next(iter(stream))
    assert torch.equal(y, x.flatten().long() % 3)  # labels stay with their images


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    torch.manual_seed(0)
    a = ids(list(TestStream(domains(), batch_size=4, seed=7)))
    torch.manual_seed(123)  # the global RNG must not matter
    b = ids(list(TestStream(domains(), batch_size=4, seed=7)))
    c = ids(list(TestStream(domains(), batch_size=4, seed=8)))
    assert a == b
    assert a != c
    assert a != ids(list(TestStream(domains(), batch_size=4, shuffle=False)))


def test_unshuffled_stream_reads_in_dataset_order() -> None:
    out = ids(list(TestStream(domains((3, 2)), batch_size=2, shuffle=False)))
    assert out == [("d0", [0, 1]), ("d0", [2]), ("d1", [100, 101])]


@pytest.mark.parametrize("start", [0, 1, 2, 3, 5, 6, 7])
def test_resume_yields_exactly_the_tail(start: int) -> None:
    full = ids(list(TestStream(domains(), batch_size=4, seed=1)))
    ds = domains()
    stream = TestStream(ds, batch_size=4, seed=1)
    tail = ids(list(stream.iter_from(start)))
    assert tail == full[start:]
    # skipped batches were never loaded: only the tail's images were read
    assert sum(d.dataset.reads for d in ds) == sum(len(b) for _, b in full[start:])


def test_batch_indices_and_domain_lookup_load_nothing() -> None:
    ds = domains()
    stream = TestStream(ds, batch_size=4, seed=2)
    name, idx = stream.batch_indices(4)
    assert name == "d1" == stream.domain_of_batch(4)
    assert stream.locate(4) == (1, 1)
    assert len(idx) == 3 and all(10 <= i < 17 for i in idx)  # global ConcatDataset indices
    assert sum(d.dataset.reads for d in ds) == 0
    perm = stream.permutation(0)
    assert sorted(perm.tolist()) == list(range(10))
    with pytest.raises(IndexError):
        stream.batch_indices(7)
    with pytest.raises(IndexError):
        list(stream.iter_from(8))


def test_workers_give_the_same_stream() -> None:
    data = [
        Domain("a", TensorDataset(torch.arange(9.0), torch.arange(9))),
        Domain("b", TensorDataset(torch.arange(5.0), torch.arange(5))),
    ]
    ref = ids(list(TestStream(data, batch_size=2, seed=4)))
    par = TestStream(data, batch_size=2, seed=4, num_workers=2, persistent_workers=True)
    assert ids(list(par)) == ref
    assert ids(list(par.iter_from(3))) == ref[3:]


def test_bad_streams_are_rejected() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        TestStream(domains(), batch_size=0)
    with pytest.raises(ValueError, match="at least one domain"):
        TestStream([])
    with pytest.raises(ValueError, match=r"'d1'.*empty"):
        TestStream([Domain("d0", Counting(2, 0)), Domain("d1", Counting(0, 0))])
    with pytest.raises(TypeError, match="pair"):
        TestStream([Counting(2, 0)])  # type: ignore[list-item]
