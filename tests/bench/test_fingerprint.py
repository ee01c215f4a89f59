"""Cell fingerprints: the code, the arguments and components' configuration all count."""

from __future__ import annotations

from typing import Any

from bench_fixtures import tiny_benchmark

import eatta.bench.fingerprint as fp
from eatta.bench.grid import CellSpec
from eatta.bench.runner import RunOptions


def opts(**kw: Any) -> RunOptions:
    return RunOptions(**{"batch_size": 8, "progress": False, "checkpoint_every": 2, **kw})


def test_fingerprint_covers_the_code_and_component_configuration(tmp_path, monkeypatch):
    data = tiny_benchmark()
    spec = CellSpec("toy", "eatta", "ctta", 1, 1)
    base = fp.fingerprint(spec, data, opts())
    assert fp.fingerprint(spec, data, opts()) == base
    monkeypatch.setattr(fp, "code_digest", lambda: "edited")  # a changed source file
    assert fp.fingerprint(spec, data, opts()) != base
    monkeypatch.undo()

    from eatta.selection import PerturbationSelector as Selector

    a = fp.fingerprint(spec, data, opts(hparams={"eatta": {"selector": Selector(std=0.01)}}))
    b = fp.fingerprint(spec, data, opts(hparams={"eatta": {"selector": Selector(std=0.02)}}))
    c = fp.fingerprint(spec, data, opts(hparams={"eatta": {"selector": Selector(std=0.01)}}))
    assert a != b and a == c  # configuration, not just the type name
    f1 = fp.to_plain(lambda x: x + 1)
    f2 = fp.to_plain(lambda x: x + 2)
    assert f1 != f2
    # a real edit of a source file changes the digest computed from the files
    fp.code_digest.cache_clear()
    first = fp.code_digest()
    assert fp.code_digest() == first and len(first) == 16
