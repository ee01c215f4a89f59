"""Regenerate the packaged digits-C source weights and the reference digests of digits-C.

    python tools/train_digits_source.py            # check: retrain, compare with the package
    python tools/train_digits_source.py --write    # overwrite the packaged files

Writes ``src/eatta/bench/digits_source_v<VERSION>.pt`` (the recipe of
:func:`eatta.bench.digits_model.train_digits_cnn`, seed 0) and
``src/eatta/bench/digits_reference.json`` (SHA-256 of the weights and of every digits-C domain,
corruption x severity 1-5, plus the library versions that built them). Retraining on another CPU
may give other weights (vector kernels round differently): that is why the weights are shipped.
Update ``DIGITS_SOURCE_SHA256`` in ``digits_model.py`` to the printed digest after ``--write``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from eatta.bench import digits_model as dm
from eatta.bench.provenance import corruption_stack_versions, dataset_digest
from eatta.data.digits import DIGITS_C_CORRUPTIONS, digits_c

PACKAGE = Path(dm.__file__).parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="overwrite the packaged files")
    p.add_argument("--cache-dir", default=None, help="digits-C cache folder")
    args = p.parse_args()
    model, report = dm.train_digits_cnn(seed=0)
    digest = dm.state_digest(model)
    print(f"trained: SHA-256 {digest}, clean test accuracy {report['clean_test_accuracy']:.4f}")
    print(f"packaged: SHA-256 {dm.DIGITS_SOURCE_SHA256}")
    data = {
        f"{c}@{s}": dataset_digest(digits_c(c, s, cache_dir=args.cache_dir))
        for c in DIGITS_C_CORRUPTIONS
        for s in range(1, 6)
    }
    if args.write:
        if digest != dm.DIGITS_SOURCE_SHA256:  # same weights: keep the file (no binary churn)
            torch.save({"state_dict": model.state_dict(), "report": report}, dm.PACKAGED_WEIGHTS)
        ref = {
            "model_sha256": digest,
            "domains_sha256": data,
            "built_with": corruption_stack_versions(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
        (PACKAGE / "digits_reference.json").write_text(json.dumps(ref, indent=1) + "\n")
        kept = "kept" if digest == dm.DIGITS_SOURCE_SHA256 else "rewritten"
        print(f"wrote digits_reference.json (weights {kept})")
    return 0 if digest == dm.DIGITS_SOURCE_SHA256 or args.write else 1


if __name__ == "__main__":
    sys.exit(main())
