"""Triton's CUDA shared-memory extension, as Triton built without GPU support answers it.

The agent maps no CUDA IPC handles (on a Jetson the GPU shares the system's memory, and system
shared memory serves local clients). Clients written for Triton often clear CUDA regions before
they start, so the read and clear requests succeed as Triton's do on a host without a GPU: the
status is an empty table, unregister is a no-op; only register is refused, with Triton's words.
"""

from __future__ import annotations

from agent.errors import InvalidInputError, SharedMemoryNotFoundError
from agent.serving.shared_memory import SharedMemoryRegistry


class CudaSharedMemory:
    """CUDA shared-memory regions: none can be registered, so none is ever listed."""

    def __init__(self, system: SharedMemoryRegistry) -> None:
        self._system = system  # only to word a status request that names a system region

    def status(self, name: str | None = None) -> list[dict[str, object]]:
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

    def register(self, name: str) -> None:
        """Refused as Triton without GPU support refuses it.

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
