"""torchvision, timm and transformers in your own code, on a CPU-only torch with PyPI's
torchvision.

PyPI's torchvision wheel is a CUDA build. Next to a CPU-only torch (installed without PyTorch's
CPU index) its compiled extension does not load, and a plain ``import torchvision`` or
``import timm`` fails with ``operator torchvision::nms does not exist``; Hugging Face
``transformers``, whose vision models import torchvision, fails with ``Could not import module
'ViTForImageClassification'``. Call :func:`import_torchvision` (or :func:`import_timm`,
:func:`import_transformers`) once, before your own imports: where the plain import works it is
that import; where it fails with that error, it declares the schemas of torchvision's two ops
registered at import, warns once (:class:`TorchvisionOpsWarning`) and imports again. From then on
torchvision, timm and transformers' vision models import in the process; models and transforms
work, compiled ops (``nms``, ``roi_align``, ``torchvision.io`` decoding) do not. Any other import
error propagates. eatta's own loaders go through the same functions.

    from eatta.compat import import_transformers

    import_transformers()
    from transformers import AutoModelForImageClassification
"""

from __future__ import annotations

from eatta._compat import (
    TorchvisionOpsWarning,
    import_timm,
    import_torchvision,
    import_transformers,
)

__all__ = ["TorchvisionOpsWarning", "import_timm", "import_torchvision", "import_transformers"]
