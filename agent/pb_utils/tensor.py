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

    @classmethod
    def from_dlpack(cls, name: str, tensor: object) -> Tensor:
        """A tensor sharing the memory of `tensor`, an object with `__dlpack__` (a numpy array,
        a CPU torch tensor ...), as Triton's `Tensor.from_dlpack` takes it. CPU memory only: the
        agent's Python models run on the CPU."""
        return cls(name, np.from_dlpack(tensor))  # type: ignore[arg-type]

    def to_dlpack(self) -> object:
        """A DLPack capsule of the array (`torch.from_dlpack` and others take it)."""
        return self._data.__dlpack__()

    def is_cpu(self) -> bool:
        """Always true: the agent's Python models hold their tensors in CPU memory."""
        return True

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._data

    def triton_dtype(self) -> str:
        """The KServe datatype of the array ("FP32", "BYTES", ...)."""
        return numpy_to_kserve(self._data.dtype)
