"""Seeded, resumable CTTA test streams."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from eatta.data import Domain, TestStream
from eatta.data.stream import (
    GRADUAL_SEVERITIES,
    base_domain_name,
    dataset_labels,
    dirichlet_order,
    gradual_domains,
)


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


# ----------------------------------------------------------------------------- long-term protocols


def labelled(n: int, num_classes: int, base: int = 0) -> TensorDataset:
    """Item ``i`` is ``(tensor([base + i]), i % num_classes)``."""
    return TensorDataset(
        torch.arange(base, base + n, dtype=torch.float32), torch.arange(n) % num_classes
    )


def same_class_neighbours(labels: list[int]) -> float:
    """Fraction of consecutive pairs with the same label (a class-run statistic)."""
    return sum(a == b for a, b in itertools.pairwise(labels)) / max(1, len(labels) - 1)


def test_recurring_rounds_cover_every_image_once_per_round_and_reshuffle() -> None:
    one = ids(list(TestStream(domains(), batch_size=4, seed=5)))
    stream = TestStream(domains(), batch_size=4, seed=5, rounds=3)
    assert len(stream) == 3 * len(one) and stream.batches_per_round == len(one)
    assert stream.num_samples == 3 * 22 and stream.visit_names == ["d0", "d1", "d2"] * 3
    out = ids(list(stream))
    rounds = [out[r * len(one) : (r + 1) * len(one)] for r in range(3)]
    assert rounds[0] == one  # round 1 is the one-pass stream, batch for batch
    for r, batches in enumerate(rounds):
        assert [name for name, _ in batches] == [name for name, _ in one]
        for k, n in enumerate((10, 7, 5)):
            seen = sorted(i for name, b in batches if name == f"d{k}" for i in b)
            assert seen == [100 * k + i for i in range(n)], r  # each image exactly once a round
        assert [stream.round_of_batch(r * len(one) + b) for b in range(len(one))] == [r] * len(one)
    assert rounds[1] != rounds[0] and rounds[2] != rounds[1]  # every round reshuffled
    assert ids(list(TestStream(domains(), batch_size=4, seed=5, rounds=3))) == out  # seeded


def test_dirichlet_order_covers_every_sample_and_follows_the_class_process() -> None:
    y = np.repeat(np.arange(10), 60)
    stats = {}
    for delta in (0.01, 0.1, 1.0, 1000.0):
        runs = []
        for s in range(4):
            order = dirichlet_order(y, delta, 20, np.random.default_rng(s))
            assert sorted(order.tolist()) == list(range(len(y)))  # a permutation
            runs.append(same_class_neighbours(y[order].tolist()))
        stats[delta] = float(np.mean(runs))
    assert stats[0.01] > stats[0.1] > stats[1.0] > stats[1000.0]
    assert stats[0.1] > 0.35 and stats[1000.0] < 0.2  # i.i.d. would give 0.1
    # with a tiny δ a class falls (almost) into one slot: its samples sit in one stretch
    order = dirichlet_order(y, 1e-3, 20, np.random.default_rng(0))
    positions = {c: np.flatnonzero(y[order] == c) for c in range(10)}
    assert np.mean([p.max() - p.min() + 1 for p in positions.values()]) < 2 * 60
    same = dirichlet_order(y, 0.1, 20, np.random.default_rng(3))
    assert np.array_equal(same, dirichlet_order(y, 0.1, 20, np.random.default_rng(3)))
    with pytest.raises(ValueError, match="concentration"):
        dirichlet_order(y, 0.0, 20, np.random.default_rng(0))


def test_label_shift_stream_is_class_correlated_and_complete() -> None:
    data = [Domain("a", labelled(300, 10)), Domain("b", labelled(200, 10, base=1000))]
    iid = TestStream(data, batch_size=10, seed=2, rounds=2)
    shifted = TestStream(data, batch_size=10, seed=2, rounds=2, dirichlet=0.1)
    out = list(shifted)
    assert len(out) == len(iid) == 2 * (30 + 20)
    half = len(out) // 2
    for r in range(2):
        xs = [int(v) for x, _, _ in out[r * half : (r + 1) * half] for v in x]
        assert sorted(xs) == list(range(300)) + list(range(1000, 1200))  # once per round
    labels = [int(v) for _, y, _ in out for v in y]
    iid_labels = [int(v) for _, y, _ in iid for v in y]
    assert same_class_neighbours(labels) > 0.35 > 0.2 > same_class_neighbours(iid_labels)
    assert out[0][0].tolist() != out[half][0].tolist()  # rounds differ
    assert "dirichlet=0.1" in repr(shifted)


@pytest.mark.parametrize("start", [0, 3, 31, 49, 50, 62, 99])
def test_resume_in_the_middle_of_a_round_yields_the_identical_tail(start: int) -> None:
    data = [Domain("a", labelled(300, 10)), Domain("b", labelled(200, 10, base=1000))]
    full = ids(list(TestStream(data, batch_size=10, seed=4, rounds=2, dirichlet=0.3)))
    stream = TestStream(data, batch_size=10, seed=4, rounds=2, dirichlet=0.3)
    assert ids(list(stream.iter_from(start))) == full[start:]


def test_gradual_domains_run_severities_up_and_down_per_corruption() -> None:
    made = []

    def make(c: str, s: int) -> TensorDataset:
        made.append((c, s))
        return labelled(4, 2, base=10 * s)

    out = gradual_domains(["fog", "snow"], make)
    assert [d.name for d in out] == [
        f"{c}@{s}" for c in ("fog", "snow") for s in GRADUAL_SEVERITIES
    ]
    assert list(GRADUAL_SEVERITIES) == [1, 2, 3, 4, 5, 4, 3, 2, 1]
    assert len(made) == 10 and out[0].dataset is out[8].dataset  # built once, visited twice
    assert [int(d.dataset[0][0]) for d in out[:9]] == [10 * s for s in GRADUAL_SEVERITIES]
    assert base_domain_name("fog@3") == "fog" and base_domain_name("fog") == "fog"


def test_labels_are_read_without_loading_images() -> None:
    ds = labelled(10, 3)
    assert dataset_labels(ds).tolist() == [i % 3 for i in range(10)]
    assert dataset_labels(Subset(ds, [4, 2])).tolist() == [1, 2]
    counting = Counting(5, 0)
    assert dataset_labels(counting).tolist() == [i % 3 for i in range(5)]  # fallback reads items


def test_bad_protocols_are_rejected() -> None:
    with pytest.raises(ValueError, match="rounds"):
        TestStream(domains(), rounds=0)
    with pytest.raises(ValueError, match="dirichlet"):
        TestStream(domains(), dirichlet=-1.0)
    with pytest.raises(ValueError, match="shuffle"):
        TestStream(domains(), dirichlet=0.1, shuffle=False)
    with pytest.raises(IndexError):
        TestStream(domains(), rounds=2).permutation(6)


# ----------------------------------------------------------------------------- mixed domains


def mixed_domains() -> list[Domain]:
    """Three domains of 40, 30 and 20 items; item values ``100 k + i`` name their domain ``k``."""
    return domains((40, 30, 20))


def test_mixed_round_has_every_sample_once_and_batches_mix_domains() -> None:
    stream = TestStream(mixed_domains(), batch_size=8, seed=3, rounds=2, mixed=True)
    assert stream.batches_per_visit == [12, 12] and len(stream) == 24  # ceil(90 / 8) a round
    out = ids(list(stream))
    assert [name for name, _ in out] == ["mixed"] * 24
    want = sorted(100 * k + i for k, n in enumerate((40, 30, 20)) for i in range(n))
    rounds = [[i for _, b in out[r * 12 : (r + 1) * 12] for i in b] for r in range(2)]
    for r in range(2):
        assert sorted(rounds[r]) == want, r  # every sample of the round exactly once
    assert rounds[0] != rounds[1]  # each round reshuffled
    per_batch = [{i // 100 for i in b} for _, b in out]
    assert sum(len(d) == 3 for d in per_batch) >= 15  # most batches hold all 3 domains
    assert all(len(d) >= 2 for d in per_batch[:-1])
    # the domains are spread over the round, not read one after the other
    first_half = {i // 100 for _, b in out[:6] for i in b}
    assert first_half == {0, 1, 2}


def test_mixed_visits_are_rounds_and_sample_domains_name_each_sample() -> None:
    ds = mixed_domains()
    stream = TestStream(ds, batch_size=8, seed=1, rounds=3, mixed=True)
    assert stream.visits_per_round == 1 and stream.visit_names == ["mixed"] * 3
    assert stream.visit_first_batch == [0, 12, 24] and stream.batches_per_round == 12
    assert stream.locate(13) == (1, 1) and stream.locate(35) == (2, 11)
    assert [stream.round_of_batch(t) for t in (0, 11, 12, 35)] == [0, 0, 1, 2]
    assert stream.domain_of_batch(5) == "mixed" and "mixed" in repr(stream)
    assert stream.num_samples == 270 and stream.domain_names == ["d0", "d1", "d2"]
    doms = [stream.sample_domains(t) for t in range(len(stream))]
    assert sum(d.dataset.reads for d in ds) == 0  # computed without loading an image
    for t, (x, _, _) in enumerate(stream):
        assert doms[t] == [int(v) // 100 for v in x.flatten()], t
    counts = [0, 0, 0]
    for d in doms[:12]:
        for k in d:
            counts[k] += 1
    assert counts == [40, 30, 20]
    assert len(stream.batch_indices(11)[1]) == 90 - 11 * 8  # the round's last batch is short


def test_sample_domains_of_an_unmixed_stream_is_the_batch_domain() -> None:
    stream = TestStream(domains(), batch_size=4, seed=2, rounds=2)
    assert stream.visits_per_round == 3 and stream.batches_per_round == 7
    assert [stream.sample_domains(t) for t in (0, 3, 5, 7)] == [[0] * 4, [1] * 4, [2] * 4, [0] * 4]


def test_mixed_stream_is_seeded() -> None:
    torch.manual_seed(0)
    a = ids(list(TestStream(mixed_domains(), batch_size=8, seed=7, rounds=2, mixed=True)))
    torch.manual_seed(99)  # the global RNG must not matter
    b = ids(list(TestStream(mixed_domains(), batch_size=8, seed=7, rounds=2, mixed=True)))
    c = ids(list(TestStream(mixed_domains(), batch_size=8, seed=8, rounds=2, mixed=True)))
    assert a == b and a != c
    perm = TestStream(mixed_domains(), batch_size=8, seed=7, rounds=2, mixed=True).permutation(1)
    assert perm.tolist() == [i for _, batch in a[12:] for i in ids_to_global(batch)]


def ids_to_global(values: list[int]) -> list[int]:
    """Item values ``100 k + i`` of :func:`mixed_domains` -> concatenated-dataset indices."""
    offsets = [0, 40, 70]
    return [offsets[v // 100] + v % 100 for v in values]


@pytest.mark.parametrize("start", [0, 1, 11, 12, 17, 23])
def test_mixed_resume_yields_the_identical_tail(start: int) -> None:
    full = ids(list(TestStream(mixed_domains(), batch_size=8, seed=4, rounds=2, mixed=True)))
    ds = mixed_domains()
    stream = TestStream(ds, batch_size=8, seed=4, rounds=2, mixed=True)
    assert ids(list(stream.iter_from(start))) == full[start:]
    assert sum(d.dataset.reads for d in ds) == sum(len(b) for _, b in full[start:])


def test_mixed_label_shift_orders_the_pooled_samples_by_class() -> None:
    data = [Domain("a", labelled(300, 10)), Domain("b", labelled(200, 10, base=1000))]
    stream = TestStream(data, batch_size=10, seed=2, rounds=2, dirichlet=0.1, mixed=True)
    iid = TestStream(data, batch_size=10, seed=2, rounds=2, mixed=True)
    out = list(stream)
    assert len(out) == 2 * 50 and stream.batches_per_visit == [50, 50]
    for r in range(2):
        xs = [int(v) for x, _, _ in out[r * 50 : (r + 1) * 50] for v in x]
        assert sorted(xs) == list(range(300)) + list(range(1000, 1200))  # once per round
    labels = [int(v) for _, y, _ in out for v in y]
    iid_labels = [int(v) for _, y, _ in iid for v in y]
    assert same_class_neighbours(labels) > 0.35 > 0.2 > same_class_neighbours(iid_labels)
    both = sum(len(set(stream.sample_domains(t))) == 2 for t in range(len(stream)))
    assert both > 60  # class runs, but each class's samples still come from both domains
    again = TestStream(data, batch_size=10, seed=2, rounds=2, dirichlet=0.1, mixed=True)
    assert ids(list(again.iter_from(57))) == ids(out[57:])


def test_bad_mixed_streams_are_rejected() -> None:
    with pytest.raises(ValueError, match="mixed needs at least two domains"):
        TestStream(domains((5,)), mixed=True)
    with pytest.raises(ValueError, match="shuffle"):
        TestStream(domains(), mixed=True, shuffle=False)
    with pytest.raises(TypeError, match="mixed must be a bool"):
        TestStream(domains(), mixed=1)  # type: ignore[arg-type]
