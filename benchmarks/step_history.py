#!/usr/bin/env python
"""The exact EATTA step's cost relative to TENT across library versions, threads and kernels.

Tells a library regression from the setting (issue 32; docs/approx-step.md): it exports ``src/``
of each git revision (``git archive``, nothing checked out) and runs one child process per
(revision, threads, kernels, round); each child times TENT and the exact EATTA step (budget 1, a
ground-truth oracle given the batch's labels by ``set_labels``, which every revision has)
interleaved on the step benchmark's models (``digits-32``, ``resnet18-64``, random init, heads
scaled until half a batch is confident) and reports the median ratio. The children of one round
run back to back, the order rotating; the result is the median over rounds.

    python benchmarks/step_history.py            # 8705f6a vs HEAD, 1 and 2 threads, default/avx2
    python benchmarks/step_history.py --revs 8705f6a HEAD --threads 1 --kernels default --rounds 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common

ROOT = Path(__file__).resolve().parent.parent
OUT = _common.RESULTS / "step_history.json"

CHILD = r"""
import json, statistics, sys, time, warnings
import torch
from torch import nn
import eatta
from eatta.configure import configure_model
from eatta.methods.tent import Tent
warnings.simplefilter("ignore")
repeats, warmup = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(int(sys.argv[3]))

def digits():
    from eatta.models.digits_cnn import digits_cnn
    return digits_cnn()

def resnet():  # torchvision through this checkout's shim (older revisions lack it)
    import importlib.util
    spec = importlib.util.spec_from_file_location("_eatta_compat", sys.argv[4])
    compat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compat)
    return compat.import_torchvision().models.resnet18(num_classes=1000)

out = {}
CASES = (("digits-32", digits, 32, 10), ("resnet18-64", resnet, 64, 1000))
for name, build, size, classes in CASES:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 3, size, size, generator=g)
    y = torch.randint(0, classes, (64,), generator=g)
    torch.manual_seed(0)
    src = build()
    configure_model(src)
    head = eatta.split_model(src).head
    margin = 0.4 * torch.log(torch.tensor(float(classes)))
    with torch.no_grad():
        for _ in range(12):
            p = src(x).softmax(1)
            h = -(p * p.clamp_min(1e-12).log()).sum(1)
            if float((h < margin).float().mean()) >= 0.5:
                break
            head.weight.mul_(2.0)
            head.bias.mul_(2.0)
    state = {k: v.clone() for k, v in src.state_dict().items()}

    def fresh():
        m = build()
        configure_model(m)
        m.load_state_dict(state)
        return m, eatta.configure(m)

    def sgd(ps):
        return torch.optim.SGD(ps, lr=2.5e-4, momentum=0.9, nesterov=True)

    m, ps = fresh()
    tent = Tent(m, sgd(ps))
    m, ps = fresh()
    oracle = eatta.GroundTruthOracle()
    method = eatta.EATTA(m, sgd(ps), oracle=oracle, budget=1)

    def step():
        oracle.set_labels(y)  # before each batch (newer revisions consume the labels)
        return method(x)

    fns = {"tent": lambda: tent(x), "eatta": step}
    for _ in range(warmup):
        for f in fns.values():
            f()
    t = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in names[r % 2:] + names[: r % 2]:
            t0 = time.perf_counter()
            fns[k]()
            t[k].append(time.perf_counter() - t0)
    out[name] = {
        "ratio": statistics.median(t["eatta"]) / statistics.median(t["tent"]),
        "tent_ms": 1e3 * statistics.median(t["tent"]),
        "eatta_ms": 1e3 * statistics.median(t["eatta"]),
    }
print("RESULT " + json.dumps(out))
"""


def export(rev: str, where: Path) -> Path:
    """``src/`` of ``rev`` under ``where/<rev>`` (git archive: the repository is not touched)."""
    dest = where / rev
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=_git("archive", rev, "src"), check=True)
    return dest / "src"


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout


def child(src: Path, threads: int, kernels: str, repeats: int, warmup: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS=str(threads))
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernels != "default":
        env["ATEN_CPU_CAPABILITY"] = kernels
    shim = ROOT / "src" / "eatta" / "_compat.py"
    cmd = [sys.executable, "-c", CHILD, str(repeats), str(warmup), str(threads), str(shim)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"child failed ({src}, {threads} threads, {kernels}):\n{res.stderr}")
    line = next(s for s in res.stdout.splitlines() if s.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--revs", nargs="+", default=["8705f6a", "HEAD"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--kernels", nargs="+", default=["default", "avx2"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    revs = {r: _git("rev-parse", "--short", r).decode().strip() for r in args.revs}
    settings = list(itertools.product(revs.values(), args.threads, args.kernels))
    samples: dict[str, list[dict[str, Any]]] = {f"{r} t{t} {k}": [] for r, t, k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {r: export(r, Path(tmp)) for r in revs.values()}
        for rnd in range(args.rounds):
            k = rnd % len(settings)
            for rev, threads, kernels in settings[k:] + settings[:k]:
                res = child(srcs[rev], threads, kernels, args.repeats, args.warmup)
                samples[f"{rev} t{threads} {kernels}"].append(res)
                ratios = {m: round(v["ratio"], 3) for m, v in res.items()}
                print(f"round {rnd}: {rev} threads {threads} {kernels}: {ratios}", flush=True)
    summary = {
        key: {
            m: {
                "ratio_median": statistics.median(s[m]["ratio"] for s in runs),
                "ratios": [round(s[m]["ratio"], 4) for s in runs],
                "tent_ms_median": statistics.median(s[m]["tent_ms"] for s in runs),
            }
            for m in runs[0]
        }
        for key, runs in samples.items()
    }
    data = {"revs": revs, "rounds": args.rounds, "repeats": args.repeats, "summary": summary}
    data["loadavg"] = list(os.getloadavg())
    _common.write_json(args.out, data)
    for key, v in summary.items():
        print(key, {m: round(x["ratio_median"], 3) for m, x in v.items()})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
