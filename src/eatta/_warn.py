"""Warnings that point at the user's line, however deep in eatta and torch they are raised."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

import torch

_INTERNAL = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,  # eatta
    os.path.dirname(os.path.abspath(torch.nn.modules.module.__file__)) + os.sep,  # Module.__call__
)


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` with the stack level of the first frame outside eatta and
    ``torch.nn.modules`` (a method is called through ``nn.Module.__call__``, whose depth varies
    across torch versions)."""
    level = 2  # the frame that called this function
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)
