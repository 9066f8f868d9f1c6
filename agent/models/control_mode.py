"""Triton's `--model-control-mode` (`models.control_mode`): a closed choice of its own module, so
that the config can name it without importing the model-control machinery (and ONNX Runtime)."""

from __future__ import annotations

from enum import Enum

__all__ = ["ModelControlMode"]


class ModelControlMode(str, Enum):
    """Triton's --model-control-mode."""

    NONE = "none"  # load what is there at start, never change
    POLL = "poll"  # watch the repository and reload what changed
    EXPLICIT = "explicit"  # load and unload on request only
