"""torchvision and timm in your own code, on a CPU-only torch with PyPI's torchvision.

PyPI's torchvision wheel is a CUDA build. Next to a CPU-only torch (installed without PyTorch's
CPU index) its compiled extension does not load, and a plain ``import torchvision`` or
``import timm`` fails with ``operator torchvision::nms does not exist``. Call
:func:`import_torchvision` (or :func:`import_timm`) once, before your own imports: where the
plain import works it is that import; where it fails with that error, it declares the schemas of
torchvision's two ops registered at import, warns once (:class:`TorchvisionOpsWarning`) and
imports again. From then on ``import torchvision`` and ``import timm`` work in the process; models
and transforms do, compiled ops (``nms``, ``roi_align``, ``torchvision.io`` decoding) do not. Any
other import error propagates. eatta's own loaders go through the same functions.

    from eatta.compat import import_timm

    import_timm()
    import timm
    import torchvision
"""

from __future__ import annotations

from eatta._compat import TorchvisionOpsWarning, import_timm, import_torchvision

__all__ = ["TorchvisionOpsWarning", "import_timm", "import_torchvision"]
