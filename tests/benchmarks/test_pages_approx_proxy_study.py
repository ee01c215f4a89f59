"""``benchmarks/approx_proxy_study.py``: the fidelity tables of ``docs/approx-step.md`` come from
its committed results, byte for byte, and its measures of agreement say what they should on
trajectories whose answer is known."""

from __future__ import annotations

import json

import numpy as np

from repo_scripts import benchmark_script


def test_the_committed_results_give_the_pages_fidelity_tables():
    with benchmark_script("approx_proxy_study") as proxy:
        data = json.loads(proxy.OUT.read_text(encoding="utf-8"))
        page = (proxy.OUT.parents[2] / "docs" / "approx-step.md").read_text(encoding="utf-8")
        rows = ("last-norm", "head", "stale-16", "last-norm+refresh-16", "head+refresh-16")
        for model in data["models"].values():
            table = proxy.fidelity_table(model["agreement"], [*rows, "last-norm+refresh-64"])
            assert f"\n\n{table}\n\n" in page


def test_an_exact_estimate_agrees_and_a_scaled_one_is_fixed_by_a_refresh():
    rng = np.random.default_rng(0)
    exact = rng.uniform(0.5, 2.0, size=(64, 2))
    # last-norm: the exact norms; head: the supervised one doubled (a constant bias)
    rows = np.column_stack([exact, exact, exact * [2.0, 1.0]])
    with benchmark_script("approx_proxy_study") as proxy, np.errstate(invalid="ignore"):
        agree = proxy.agreement(rows)  # stale-64 is constant here: its correlation is NaN
    assert agree["last-norm"]["corr"] > 0.999 and agree["last-norm"]["mae"] < 1e-12
    assert agree["head"]["bias"] > 0.05
    assert agree["head+refresh-4"]["mae"] < 1e-12  # the refresh rescales the estimate exactly
    assert agree["_steps"] == {"recorded": 64.0, "with_confident_set": 64.0}
    assert "exact" not in proxy.estimates(agree) and "_steps" not in proxy.estimates(agree)
