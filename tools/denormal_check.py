"""Are there denormal floats in a method's run on digits-C, and do they cost time?

Runs one method (default TENT) on ``--rounds`` passes over the digits-C stream twice, once as
usual and once with denormals flushed to zero (``torch.set_flush_denormal(True)``), from the same
packaged source model, and prints for each: the CPU time of the run and the smallest non-zero
magnitude seen in the activations (every module's output), the gradients of the adapted
parameters, the parameters and the optimizer's buffers. float32's smallest normal number is
1.18e-38: a minimum far above it means no denormals. It then says whether the two runs'
predictions and final parameters are bit-identical (flushing changes nothing when there are none).

    python tools/denormal_check.py                    # TENT, 2 rounds (~25 s of CPU per run)
    python tools/denormal_check.py --method baseline --rounds 10
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import torch

import eatta
from eatta.data import TestStream, digits_c_domains
from eatta.methods.registry import get_spec
from eatta.models.digits_cnn import packaged_digits_source

FLOAT32_SMALLEST_NORMAL = torch.finfo(torch.float32).tiny


def _smallest(t: torch.Tensor, seen: dict[str, float], key: str) -> None:
    a = t.detach().abs()
    a = a[a > 0]
    if a.numel():
        seen[key] = min(seen.get(key, float("inf")), float(a.min()))


def run(method_name: str, rounds: int, flush: bool) -> dict[str, Any]:
    torch.set_flush_denormal(flush)
    torch.manual_seed(0)
    source, _ = packaged_digits_source()
    model = copy.deepcopy(source)
    active = get_spec(method_name).active
    oracle = eatta.GroundTruthOracle() if active else None
    method = eatta.create(method_name, model, dataset="digits-c", oracle=oracle)
    seen: dict[str, float] = {}
    for module in model.modules():
        module.register_forward_hook(
            lambda _m, _i, out: (
                _smallest(out, seen, "activations") if isinstance(out, torch.Tensor) else None
            )
        )
    for p in method.params:
        p.register_hook(lambda g: _smallest(g, seen, "gradients"))
    domains = digits_c_domains()
    predictions = []
    start = time.process_time()
    for r in range(rounds):
        for x, y, _ in TestStream(domains, 64, seed=r):
            logits = method(x, labels=y) if active else method(x)
            predictions.append(logits.argmax(1))
            for p in method.params:
                _smallest(p, seen, "parameters")
            for state in method.optimizer.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor) and v.is_floating_point():
                        _smallest(v, seen, "optimizer buffers")
    cpu = time.process_time() - start
    torch.set_flush_denormal(False)
    return {
        "cpu_s": cpu,
        "seen": seen,
        "predictions": torch.cat(predictions),
        "params": [p.detach().clone() for p in method.params],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="tent", help="a registered method (default tent)")
    p.add_argument("--rounds", type=int, default=2, help="passes over the digits-C stream")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if not torch.set_flush_denormal(False):
        print("this CPU cannot flush denormals (no SSE3): only the magnitudes are measured")
    plain = run(args.method, args.rounds, flush=False)
    flushed = run(args.method, args.rounds, flush=True)
    print(f"{args.method}, {args.rounds} rounds of digits-C; float32 smallest normal 1.18e-38")
    for name, r in (("as usual", plain), ("denormals flushed", flushed)):
        mins = ", ".join(f"{k} {v:.1e}" for k, v in sorted(r["seen"].items()))
        print(f"{name:>18}: CPU {r['cpu_s']:.1f} s; smallest non-zero magnitude: {mins}")
    same = torch.equal(plain["predictions"], flushed["predictions"]) and all(
        torch.equal(a, b) for a, b in zip(plain["params"], flushed["params"], strict=True)
    )
    denormal = any(v < FLOAT32_SMALLEST_NORMAL for v in plain["seen"].values())
    print(f"denormals seen: {'yes' if denormal else 'no'}; flushing changes the run: ", end="")
    print("no (bit-identical predictions and parameters)" if same else "yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
