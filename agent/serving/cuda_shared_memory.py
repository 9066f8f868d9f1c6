"""Triton's CUDA shared-memory extension: what its endpoints call, and the answers without CUDA.

`CudaRegions` is the one interface the HTTP and gRPC `cudasharedmemory` endpoints call. Two
classes implement it: `agent.serving.cuda_regions.CudaRegionRegistry` (device memory opened from
CUDA IPC handles, where cuda-python and a GPU are present) and `CudaSharedMemory` below, which
answers as Triton built without GPU support: clients written for Triton often clear CUDA regions
before they start, so the status is an empty table and unregister is a no-op; only register is
refused, with Triton's words. `DataPlane.cuda_shared_memory` picks one.
"""

from __future__ import annotations

from typing import Protocol

from agent.errors import InvalidInputError, SharedMemoryNotFoundError
from agent.serving.cuda_regions import CudaRegionStatus
from agent.serving.shared_memory import SharedMemoryRegistry

__all__ = ["CudaRegionStatus", "CudaRegions", "CudaSharedMemory"]


class CudaRegions(Protocol):
    """The CUDA shared-memory regions, as the `cudasharedmemory` endpoints use them."""

    def status(self, name: str | None = None) -> list[CudaRegionStatus]:
        """Every region, or the one named (`SharedMemoryNotFoundError` when it is not one)."""
        ...

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open the 64-byte CUDA IPC handle `raw_handle`, exported on GPU `device_id`."""
        ...

    def unregister(self, name: str | None = None) -> None:
        """Drop one region (an unknown name is not an error), or every region."""
        ...


class CudaSharedMemory:
    """CUDA shared-memory regions without CUDA: none can be registered, so none is listed."""

    def __init__(self, system: SharedMemoryRegistry) -> None:
        self._system = system  # only to word a status request that names a system region

    def status(self, name: str | None = None) -> list[CudaRegionStatus]:
        """Every CUDA region (none), or the one named.

        Raises:
            SharedMemoryNotFoundError: `name` is given (no CUDA region is ever registered).
        """
        if name is None:
            return []
        if self._system.has(name):
            raise SharedMemoryNotFoundError(
                f"The region named '{name}' is registered as system shared memory, "
                "not CUDA shared memory"
            )
        raise SharedMemoryNotFoundError(f"Unable to find cuda shared memory region: '{name}'")

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Refused as Triton without GPU support refuses it, whatever the handle.

        Raises:
            InvalidInputError: always.
        """
        if not name:
            raise InvalidInputError(
                "'region name' is necessary to register cuda shared memory region"
            )
        raise InvalidInputError(
            f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
        )

    def unregister(self, name: str | None = None) -> None:
        """Nothing to release: unregistering an unknown region succeeds, as in Triton."""
