"""Triton's `pb_utils.Tensor`: a named numpy array, as requests and responses carry them.

Re-exported by `agent.pb_utils`; needs only numpy.
"""

from __future__ import annotations

import numpy as np

from agent.pb_utils.convert import numpy_to_kserve


class Tensor:
    """A named tensor holding a numpy array (object arrays of bytes for BYTES)."""

    def __init__(self, name: str, data: np.ndarray) -> None:
        if not isinstance(data, np.ndarray):
            raise TypeError(f"Tensor '{name}' needs a numpy array, got {type(data).__name__}")
        self._name = name
        self._data = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._data

    def triton_dtype(self) -> str:
        """The KServe datatype of the array ("FP32", "BYTES", ...)."""
        return numpy_to_kserve(self._data.dtype)
