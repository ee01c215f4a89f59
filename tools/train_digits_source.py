"""Regenerate the packaged digits-C source weights and the reference digests of digits-C.

    python tools/train_digits_source.py            # check: retrain, compare with the package
    python tools/train_digits_source.py --write    # overwrite the packaged files
    python tools/train_digits_source.py --data-only --write   # only the data digests
    python tools/train_digits_source.py --model digits-vit [--write]   # the LayerNorm ViT

Writes ``src/eatta/models/digits_source_v<VERSION>.pt`` (the recipe of
:func:`eatta.models.digits_cnn.train_digits_cnn`, seed 0) and
``src/eatta/bench/digits_reference.json`` (SHA-256 of the weights and of every digits-C domain,
corruption x severity 1-5, plus the library versions that built them). Retraining on another CPU
may give other weights (vector kernels round differently): that is why the weights are shipped.
Update ``DIGITS_SOURCE_SHA256`` in ``digits_cnn.py`` to the printed digest after ``--write``.
``--data-only`` keeps the packaged weights and their digest and recomputes only the data's (the
digits-C arrays are CPU-independent since data version 2; the weights are not, hence shipped).
The reference also records torch's CPU capability and the architecture of the process that writes
it, as those the README's main-job table is computed with: write it under the same
``ATEN_CPU_CAPABILITY`` as that table (``avx2``, docs/benchmarks.md).
``--model digits-vit`` does the same for the LayerNorm vision transformer
(:mod:`eatta.models.digits_vit`): it writes only ``digits_vit_v<VERSION>.pt``; update
``DIGITS_VIT_SHA256`` in ``digits_vit.py`` to the printed digest after ``--write``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from eatta.bench import provenance
from eatta.bench.provenance import corruption_stack_versions, dataset_digest
from eatta.data.digits import DIGITS_C_CORRUPTIONS, DIGITS_C_VERSION, digits_c
from eatta.models import digits_cnn as dm
from eatta.models import digits_vit as dv

PACKAGE = Path(provenance.__file__).parent  # the reference digests stay with the harness


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="overwrite the packaged files")
    p.add_argument("--cache-dir", default=None, help="digits-C cache folder")
    p.add_argument(
        "--data-only", action="store_true", help="keep the packaged weights; digest the data only"
    )
    p.add_argument(
        "--model",
        choices=("digits-cnn", "digits-vit"),
        default="digits-cnn",
        help="which packaged model to retrain",
    )
    args = p.parse_args()
    if args.model == "digits-vit":
        if args.data_only:
            p.error("--data-only belongs to the CNN's reference file; leave out --model")
        return vit(args.write)
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


def vit(write: bool) -> int:
    """Retrain the ViT (seed 0), compare with the packaged digest, write it with ``write``."""
    model, report = dv.train_digits_vit(seed=0)
    digest = dm.state_digest(model)
    acc = report["clean_test_accuracy"]
    print(f"trained: SHA-256 {digest}, clean test accuracy {acc:.4f}")
    print(f"packaged: SHA-256 {dv.DIGITS_VIT_SHA256}")
    if write and digest != dv.DIGITS_VIT_SHA256:
        torch.save({"state_dict": model.state_dict(), "report": report}, dv.PACKAGED_VIT_WEIGHTS)
        print(f"wrote {dv.PACKAGED_VIT_WEIGHTS.name}: set DIGITS_VIT_SHA256 = {digest!r}")
    return 0 if digest == dv.DIGITS_VIT_SHA256 or write else 1


if __name__ == "__main__":
    sys.exit(main())
