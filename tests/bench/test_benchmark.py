"""BenchmarkData preparation: seeded image limits, no single-image batches."""

from __future__ import annotations

from bench_fixtures import tiny_benchmark

from eatta.bench.benchmark import prepare_domains


def test_limit_takes_a_seeded_subset_and_no_batch_holds_one_image():
    domains = tiny_benchmark(n=20).domains
    out, notes = prepare_domains(domains, batch_size=8, limit=9, seed=0)
    assert [len(ds) for _, ds in out] == [8, 8, 8] and len(notes) == 3
    again, _ = prepare_domains(domains, batch_size=8, limit=9, seed=0)
    assert out[0][1].indices == again[0][1].indices
    other, _ = prepare_domains(domains, batch_size=8, limit=9, seed=1)
    assert out[0][1].indices != other[0][1].indices
    odd, notes = prepare_domains(tiny_benchmark(n=17).domains, batch_size=8)
    assert [len(ds) for _, ds in odd] == [16, 16, 16] and "single image" in notes[0]
    same, notes = prepare_domains(domains, batch_size=8)
    assert same[0][1] is domains[0][1] and notes == []
