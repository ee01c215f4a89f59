"""Optional-dependency imports, handled in one place.

The PyPI torchvision wheel is a CUDA build. Paired with a CPU-only torch its compiled extension does
not load and ``import torchvision`` fails with ``operator torchvision::nms does not exist``, which
also breaks timm (it imports torchvision). Models and transforms do not need the compiled ops, so
:func:`import_torchvision` declares the two op schemas torchvision registers at import time and
imports again. Compiled ops (``nms``, ``roi_align``, ``torchvision.io`` decoding) stay unavailable.
Any other import error propagates unchanged.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

import torch

__all__ = ["TorchvisionOpsWarning", "import_timm", "import_torchvision", "import_transformers"]

_MISSING_OP = "operator torchvision::nms does not exist"
_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
_fragment: torch.library.Library | None = None


class TorchvisionOpsWarning(RuntimeWarning):
    """torchvision's compiled ops could not be loaded; models and transforms still work."""


def _purge(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


def _declare_torchvision_ops() -> None:
    global _fragment
    if _fragment is not None:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name in ("nms", "qnms"):
        lib.define(f"{name}{_SCHEMA}")
    _fragment = lib  # keep a reference: the schemas live as long as the library object


def import_torchvision() -> ModuleType:
    """Import torchvision, working around a CUDA wheel next to a CPU-only torch (warns once)."""
    loaded = sys.modules.get("torchvision")
    if loaded is not None and hasattr(loaded, "models"):
        return loaded
    try:
        import torchvision
    except RuntimeError as err:
        if _MISSING_OP not in str(err):
            raise
        _purge("torchvision")
        _declare_torchvision_ops()
        warnings.warn(
            "torchvision's compiled extension does not match this torch build (a CUDA torchvision "
            "next to a CPU torch?); eatta declared its op schemas so models and transforms work, "
            "but compiled ops such as nms, roi_align and torchvision.io decoding are unavailable.",
            TorchvisionOpsWarning,
            stacklevel=2,
        )
        import torchvision
    return torchvision


def import_timm() -> ModuleType:
    """Import timm (which imports torchvision) through :func:`import_torchvision`."""
    import_torchvision()
    import timm

    return timm


def import_transformers() -> ModuleType:
    """Import Hugging Face ``transformers`` through :func:`import_torchvision`: its vision
    models import torchvision when it is installed, so next to a CPU torch and PyPI's CUDA
    torchvision ``from transformers import ViTForImageClassification`` fails otherwise."""
    import_torchvision()
    import transformers

    return transformers
