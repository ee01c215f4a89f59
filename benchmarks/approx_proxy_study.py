#!/usr/bin/env python
"""How well each cheap gradient-norm estimate's ratio tracks the exact one (issue 32).

The exact EATTA step adapts along digits-C (severity 5, one label per batch, digits-c defaults);
at every step, beside the exact norms ``g_sup``, ``g_unsup``, it records the estimates of
:mod:`eatta.gradients.approx` on the same graph (``last-norm``: the last normalization layer's
affine parameters; ``head``: the gradients at the head's input) and derives refresh candidates
from the trajectory (``stale-N``: the exact norms of the last step ``t mod N == 0``;
``last-norm+refresh-N``, ``head+refresh-N``: the estimate scaled at each refresh, as
``grad_mode="approx", approx_refresh=N``). Per candidate, over the steps with a confident set:
correlation, bias and mean absolute error of ``r = g_sup / (g_sup + g_unsup)`` against the exact
one, and of the debiaser's EMA weight ``γ_sup = 2 (1 - r)`` (α = 0.8). Models: ``digits-32``
(``--rounds`` rounds) and ``resnet18-64`` (random init, 10 classes, digits at 64 px, the head
scaled as in ``step_benchmark.py``; one round).

    python benchmarks/approx_proxy_study.py          # benchmarks/results/approx_proxy_study.json
    python benchmarks/approx_proxy_study.py --quick     # 60 batches per model, not written
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import _common
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eatta._compat import import_torchvision
from eatta.annotate.oracle import GroundTruthOracle
from eatta.configure import configure_model
from eatta.data.digits import digits_c_domains
from eatta.data.stream import TestStream
from eatta.gradients.approx import last_norm_params, proxy_norms
from eatta.gradients.exact import ExactGradient
from eatta.methods.eatta import EATTA
from eatta.methods.registry import create
from eatta.models.digits_cnn import packaged_digits_source

OUT = _common.RESULTS / "approx_proxy_study.json"
MODELS = ("digits-32", "resnet18-64")
REFRESH = (4, 16, 64)
ALPHA = 0.8


class Recorder(ExactGradient):
    """The exact update, recording the estimates next to the exact norms at every step."""

    rows: list[tuple[float, ...]]
    backbone: Callable[[], nn.Module]

    def norms(self, loss_sup, loss_unsup, plan=None, features=None):  # type: ignore[no-untyped-def]
        est: tuple[float, ...] = ()
        if features is not None:
            a, b = proxy_norms(loss_sup, loss_unsup, last_norm_params(self.backbone(), self.train))
            c, d = proxy_norms(loss_sup, loss_unsup, [features])
            est = (float(a), float(b), float(c), float(d))
        g_sup, g_unsup = super().norms(loss_sup, loss_unsup, plan, features)
        if est and self.measured:
            self.rows.append((float(g_sup), float(g_unsup), *est))
        return g_sup, g_unsup


def _model(kind: str, x0: Tensor) -> nn.Module:
    """A copy of the packaged digits CNN, or a seeded ResNet-18 whose head is scaled on ``x0``."""
    if kind == "digits-32":
        return copy.deepcopy(packaged_digits_source()[0])
    torch.manual_seed(0)
    model = configure_model(import_torchvision().models.resnet18(num_classes=10))
    _common.scale_head(model, model.fc, x0, 10, tries=12)
    return model


def trajectory(kind: str, rounds: int, limit: int | None) -> np.ndarray:
    """Exact and estimated norms at each step of ``rounds`` rounds (round ``r`` a ``TestStream``
    shuffled with seed ``r``): columns exact, last-norm and head sup/unsup."""
    domains = digits_c_domains(severity=5)
    batches = [(x, y) for r in range(rounds) for x, y, _ in TestStream(domains, 64, seed=r)]
    if limit is not None:
        step = max(1, len(batches) // limit)
        batches = batches[::step][:limit]

    def prep(x: Tensor) -> Tensor:
        """The batch at the model's input size."""
        if kind == "digits-32":
            return x
        return F.interpolate(x, size=64, mode="bilinear", align_corners=False)

    model = _model(kind, prep(batches[0][0]))
    oracle = GroundTruthOracle()
    method = create("eatta", model, dataset="digits-c", oracle=oracle, budget=1, seed=0)
    assert isinstance(method, EATTA) and type(method.gradient) is ExactGradient
    update = method.gradient
    update.__class__ = Recorder  # same state, the recording norms
    assert isinstance(update, Recorder)
    update.rows, update.backbone = [], lambda: method.split.backbone
    for x, y in batches:
        with oracle.labels(y):
            method(prep(x))
    return np.asarray(update.rows, dtype=np.float64)


def _ratio(s: np.ndarray, u: np.ndarray) -> np.ndarray:
    return s / (s + u)


def _ema_gamma(r: np.ndarray) -> np.ndarray:
    """The debiaser's EMA of ``γ_sup = 2 (1 - r)`` (from the first value)."""
    out = np.empty_like(r)
    acc = 2 * (1 - r[0])
    for i, v in enumerate(r):
        acc = acc if i == 0 else ALPHA * acc + (1 - ALPHA) * 2 * (1 - v)
        out[i] = acc
    return out


def candidates(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Each candidate's ratio at each step (the exact one first)."""
    es, eu, ls, lu, hs, hu = rows.T
    out = {"exact": _ratio(es, eu), "last-norm": _ratio(ls, lu), "head": _ratio(hs, hu)}
    idx = np.arange(len(rows))
    for n in REFRESH:
        last = (idx // n) * n  # the last refresh step
        out[f"stale-{n}"] = _ratio(es[last], eu[last])
        for name, s, u in (("last-norm", ls, lu), ("head", hs, hu)):
            cs = np.where(s[last] > 0, es[last] / np.where(s[last] > 0, s[last], 1), 1.0)
            cu = np.where(u[last] > 0, eu[last] / np.where(u[last] > 0, u[last], 1), 1.0)
            out[f"{name}+refresh-{n}"] = _ratio(s * cs, u * cu)
    return out


def agreement(rows: np.ndarray) -> dict[str, dict[str, float]]:
    """Correlation, bias, mean |error| of each candidate's ratio and EMA weight vs the exact."""
    valid = (rows[:, 1] > 0) & (rows[:, 3] > 0) & (rows[:, 5] > 0)
    cand = candidates(rows)
    exact = cand["exact"]
    ref_gamma = _ema_gamma(exact[valid])
    out: dict[str, dict[str, float]] = {}
    for name, r in cand.items():
        a, b = r[valid], exact[valid]
        g = _ema_gamma(a)
        out[name] = {}
        for prefix, x, y in (("", a, b), ("gamma_", g, ref_gamma)):  # the ratio, the EMA weight
            out[name][f"{prefix}corr"] = float(np.corrcoef(x, y)[0, 1])
            out[name][f"{prefix}bias"] = float((x - y).mean())
            out[name][f"{prefix}mae"] = float(np.abs(x - y).mean())
    out["_steps"] = {"recorded": float(len(rows)), "with_confident_set": float(valid.sum())}
    out["_exact_ratio"] = {"mean": float(exact[valid].mean()), "std": float(exact[valid].std())}
    return out


def fidelity_table(agreement: dict[str, Any], names: Sequence[str]) -> str:
    """Markdown: the named candidates' :func:`agreement` with the exact ratio and EMA weight."""
    keys = ("corr", "bias", "mae", "gamma_corr", "gamma_bias")
    rows = []
    for name in names:
        v = agreement[name]
        rows.append([name, *(f"{v[k]:+.3f}" if "bias" in k else f"{v[k]:.3f}" for k in keys)])
    head = ["estimate", "corr(r)", "bias(r)", "MAE(r)", "corr(EMA γ_sup)", "bias(EMA γ_sup)"]
    return _common.markdown_table(head, rows)


def estimates(agreement: dict[str, Any]) -> list[str]:
    """The candidates of an :func:`agreement`: the exact ratio and the summaries aside."""
    return [k for k in agreement if k != "exact" and not k.startswith("_")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="60 batches per model, not written")
    p.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    p.add_argument("--rounds", type=int, default=4, help="digits-32 rounds (resnet18-64: 1)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"meta": _common.machine(torch.device("cpu")), "models": {}}
    for kind in args.models:
        t0 = time.perf_counter()
        rounds = args.rounds if kind == "digits-32" else 1
        rows = trajectory(kind, rounds, 60 if args.quick else None)
        agree = agreement(rows)
        seconds = time.perf_counter() - t0
        results["models"][kind] = {"rounds": rounds, "agreement": agree, "seconds": seconds}
        print(f"[{kind}] {len(rows)} steps in {seconds:.0f} s", flush=True)
        print(fidelity_table(agree, estimates(agree)) + "\n", flush=True)
    if not args.quick:
        _common.write_json(OUT, results)
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
