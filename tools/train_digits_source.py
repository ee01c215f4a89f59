"""Regenerate the packaged digits-C source weights and the reference digests of digits-C.

    python tools/train_digits_source.py            # check: retrain, compare with the package
    python tools/train_digits_source.py --write    # overwrite the packaged files
    python tools/train_digits_source.py --data-only --write   # only the data digests

Writes ``src/eatta/bench/digits_source_v<VERSION>.pt`` (the recipe of
:func:`eatta.bench.digits_model.train_digits_cnn`, seed 0) and
``src/eatta/bench/digits_reference.json`` (SHA-256 of the weights and of every digits-C domain,
corruption x severity 1-5, plus the library versions that built them). Retraining on another CPU
may give other weights (vector kernels round differently): that is why the weights are shipped.
Update ``DIGITS_SOURCE_SHA256`` in ``digits_model.py`` to the printed digest after ``--write``.
``--data-only`` keeps the packaged weights and their digest and recomputes only the data's (the
digits-C arrays are CPU-independent since data version 2; the weights are not, hence shipped).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from eatta.bench import digits_model as dm
from eatta.bench.provenance import corruption_stack_versions, dataset_digest
from eatta.data.digits import DIGITS_C_CORRUPTIONS, DIGITS_C_VERSION, digits_c

PACKAGE = Path(dm.__file__).parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="overwrite the packaged files")
    p.add_argument("--cache-dir", default=None, help="digits-C cache folder")
    p.add_argument(
        "--data-only", action="store_true", help="keep the packaged weights; digest the data only"
    )
    args = p.parse_args()
    if args.data_only:
        model, report, digest = None, None, dm.DIGITS_SOURCE_SHA256
    else:
        model, report = dm.train_digits_cnn(seed=0)
        digest = dm.state_digest(model)
        acc = report["clean_test_accuracy"]
        print(f"trained: SHA-256 {digest}, clean test accuracy {acc:.4f}")
    print(f"packaged: SHA-256 {dm.DIGITS_SOURCE_SHA256}")
    data = {
        f"{c}@{s}": dataset_digest(digits_c(c, s, cache_dir=args.cache_dir))
        for c in DIGITS_C_CORRUPTIONS
        for s in range(1, 6)
    }
    if args.write:
        if model is not None and digest != dm.DIGITS_SOURCE_SHA256:  # else keep the file
            torch.save({"state_dict": model.state_dict(), "report": report}, dm.PACKAGED_WEIGHTS)
        ref = {
            "model_sha256": digest,
            "domains_sha256": data,
            "built_with": corruption_stack_versions(),
            "data_version": DIGITS_C_VERSION,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(),
        }
        (PACKAGE / "digits_reference.json").write_text(json.dumps(ref, indent=1) + "\n")
        kept = "kept" if digest == dm.DIGITS_SOURCE_SHA256 else "rewritten"
        print(f"wrote digits_reference.json (weights {kept})")
    return 0 if digest == dm.DIGITS_SOURCE_SHA256 or args.write else 1


if __name__ == "__main__":
    sys.exit(main())
