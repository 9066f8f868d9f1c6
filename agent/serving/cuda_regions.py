"""CUDA shared-memory regions: device memory another process exported with a CUDA IPC handle.

A camera or pre-processing pipeline on the same GPU allocates device memory, exports it
(`cudaIpcGetMemHandle`, 64 bytes) and registers it under a name (Triton's `cudasharedmemory`
extension: HTTP sends the handle base64-encoded as `{"raw_handle": {"b64": ...}}`, gRPC as
bytes). The agent opens the handle once (`cudaIpcOpenMemHandle`) and then:

* copies input tensors out of the region into host memory before the request is queued (the
  backends take host arrays; the client may rewrite the region meanwhile), one `cudaMemcpy`;
* copies outputs into the region once the inference is done.

The CUDA calls sit behind a narrow seam (`IpcOpener` -> `DeviceBuffer`: open, read, write,
close), so the registry's rules run on a CPU with a fake opener; `CudaRuntimeOpener` is the real
one over cuda-python (`cuda.bindings.runtime`, or `cuda.cudart` before 12.6).
`open_cuda_regions` returns the registry where cuda-python and a device are present, else None
with the reason (the endpoints then answer as Triton built without GPU support). The registry
implements `agent.serving.cuda_shared_memory.CudaRegions`, what the endpoints call.

Invariants: region names are unique here and against the system shared-memory regions (a taken
name is Triton's ALREADY_EXISTS, `ConflictError`); every span read or written lies inside its
region; at most `max_regions` regions. Used from the event loop only (no lock); the CUDA calls
are synchronous copies of what a request carries, as the system shared-memory ones are.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent.errors import ConflictError, InvalidInputError, SharedMemoryNotFoundError
from agent.serving.shared_memory import check_count, check_room, check_span

logger = logging.getLogger(__name__)

__all__ = [
    "IPC_HANDLE_SIZE",
    "CudaRegionRegistry",
    "CudaRegionStatus",
    "CudaRuntimeOpener",
    "DeviceBuffer",
    "IpcOpener",
    "open_cuda_regions",
    "register_request_from_json",
]

IPC_HANDLE_SIZE = 64  # bytes in a cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE)
MAX_REGIONS = 64


class DeviceBuffer(Protocol):
    """Device memory opened from an IPC handle."""

    def read(self, offset: int, nbytes: int) -> bytes | bytearray:
        """Copy `nbytes` at `offset` to the host."""
        ...

    def write(self, offset: int, data: memoryview) -> None:
        """Copy `data` from the host to `offset`."""
        ...

    def close(self) -> None:
        """Close the IPC mapping (the exporting process still owns the memory)."""
        ...


class IpcOpener(Protocol):
    """Opens CUDA IPC handles; raises `CudaCallError` on a CUDA error."""

    def open(self, raw_handle: bytes, device_id: int, byte_size: int) -> DeviceBuffer: ...


class CudaCallError(Exception):
    """A CUDA call failed; the message is CUDA's error name."""


@dataclass(frozen=True, slots=True)
class CudaRegionStatus:
    """A registered region as Triton's CUDA status endpoints report it."""

    name: str
    device_id: int
    byte_size: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


class CudaRegionRegistry:
    """The CUDA shared-memory regions clients have registered.

    Implements `agent.serving.cuda_shared_memory.CudaRegions` (the endpoints' interface; its
    other implementation answers without a GPU) and `shared_memory.DeviceRegions` (tensors).

    Args:
        opener: opens IPC handles (cuda-python, or a fake in tests).
        taken: whether a name is taken by a system shared-memory region.
        max_regions: the most regions at once.
    """

    def __init__(
        self,
        opener: IpcOpener,
        taken: Callable[[str], bool] = lambda _name: False,
        max_regions: int = MAX_REGIONS,
    ) -> None:
        self._opener = opener
        self._taken = taken
        self._max_regions = max_regions
        self._regions: dict[str, tuple[CudaRegionStatus, DeviceBuffer]] = {}

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open `raw_handle` (exported on GPU `device_id`) as region `name` of `byte_size` bytes.

        Raises:
            ConflictError: a region (CUDA or system) of that name is registered already.
            InvalidInputError: no name, a handle that is not 64 bytes, a bad device id or size,
                too many regions, or CUDA cannot open the handle.
        """
        if not name:
            raise InvalidInputError(
                "'region name' is necessary to register cuda shared memory region"
            )
        if name in self._regions or self._taken(name):
            raise ConflictError(f"shared memory region '{name}' already in manager")
        if len(raw_handle) != IPC_HANDLE_SIZE:
            raise InvalidInputError(
                f"failed to register CUDA shared memory region '{name}': raw_handle must be a "
                f"{IPC_HANDLE_SIZE}-byte CUDA IPC handle, got {len(raw_handle)} bytes"
            )
        check_count("device_id", device_id, minimum=0)
        check_count("byte_size", byte_size, minimum=1)
        check_room(name, len(self._regions), self._max_regions)
        try:
            buffer = self._opener.open(raw_handle, device_id, byte_size)
        except CudaCallError as exc:
            raise InvalidInputError(
                f"failed to register CUDA shared memory region '{name}': failed to open CUDA "
                f"IPC handle: {exc}"
            ) from None
        self._regions[name] = (CudaRegionStatus(name, device_id, byte_size), buffer)
        logger.info(
            "registered CUDA shared memory region %s (device %d, %d bytes)",
            name,
            device_id,
            byte_size,
        )

    def unregister(self, name: str | None = None) -> None:
        """Drop one region (an unknown name is not an error, as in Triton), or all of them."""
        for key in [name] if name else list(self._regions):
            found = self._regions.pop(key, None)
            if found is not None:
                try:
                    found[1].close()
                except CudaCallError as exc:  # the exporter may have freed it already
                    logger.warning("closing CUDA shared memory region %s: %s", key, exc)
                logger.info("unregistered CUDA shared memory region %s", key)

    def status(self, name: str | None = None) -> list[CudaRegionStatus]:
        """Every region, or the one named.

        Raises:
            SharedMemoryNotFoundError: `name` is not a registered CUDA region.
        """
        if name is None:
            return [status for status, _ in self._regions.values()]
        return [self._get(name)[0]]

    def has(self, name: str) -> bool:
        """Whether a CUDA region of that name is registered."""
        return name in self._regions

    def read(self, name: str, offset: int, byte_size: int) -> memoryview:
        """A host copy of `byte_size` bytes at `offset` in the region.

        Raises:
            SharedMemoryNotFoundError: no such region.
            InvalidInputError: the span is not inside the region, or the copy failed.
        """
        status, buffer = self._get(name)
        _check_span(status, offset, byte_size)
        try:
            return memoryview(buffer.read(offset, byte_size))
        except CudaCallError as exc:
            raise InvalidInputError(f"failed to read CUDA shared memory '{name}': {exc}") from None

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        """Copy `data` into the region at `offset`.

        Raises:
            SharedMemoryNotFoundError: no such region.
            InvalidInputError: the data does not fit in the region from `offset`, or the copy
                failed.
        """
        status, buffer = self._get(name)
        view = memoryview(data).cast("B")
        _check_span(status, offset, view.nbytes)
        try:
            buffer.write(offset, view)
        except CudaCallError as exc:
            raise InvalidInputError(f"failed to write CUDA shared memory '{name}': {exc}") from None

    def check(self, name: str, offset: int, byte_size: int) -> None:
        """Fail early when a span is not inside the region."""
        _check_span(self._get(name)[0], offset, byte_size)

    def _get(self, name: str) -> tuple[CudaRegionStatus, DeviceBuffer]:
        found = self._regions.get(name)
        if found is None:
            raise SharedMemoryNotFoundError(f"Unable to find cuda shared memory region: '{name}'")
        return found


def register_request_from_json(doc: Mapping[str, Any]) -> tuple[bytes, int, int]:
    """(raw handle, device id, byte size) from Triton's HTTP register body:
    `{"raw_handle": {"b64": "..."}, "device_id": 0, "byte_size": N}`.

    The handle is decoded as tritonclient's gRPC client decodes it (characters outside base64's
    alphabet are skipped); a handle that is not 64 bytes then is refused by `register`.

    Raises:
        InvalidInputError: a missing or malformed field.
    """
    raw, device_id, byte_size = doc.get("raw_handle"), doc.get("device_id"), doc.get("byte_size")
    b64 = raw.get("b64") if isinstance(raw, Mapping) else None
    if not isinstance(b64, str) or not isinstance(device_id, int) or not isinstance(byte_size, int):
        raise InvalidInputError(
            'cuda shared memory register request body must be {"raw_handle": {"b64": string}, '
            '"device_id": integer, "byte_size": integer}'
        )
    try:
        handle = base64.b64decode(b64)
    except (binascii.Error, ValueError):
        raise InvalidInputError("'raw_handle.b64' is not valid base64") from None
    return handle, device_id, byte_size


def _check_span(status: CudaRegionStatus, offset: int, byte_size: int) -> None:
    check_span(status.name, status.byte_size, offset, byte_size)


# -- cuda-python -----------------------------------------------------------------------------


def _runtime() -> Any:
    """cuda-python's runtime module; ImportError where cuda-python is missing."""
    try:
        return importlib.import_module("cuda.bindings.runtime")
    except ImportError:
        return importlib.import_module("cuda.cudart")  # cuda-python before 12.6


def _checked(result: Any, what: str) -> Any:
    """Unpack cuda-python's `(error, *values)`; CudaCallError on an error code."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CudaCallError(f"{what}: {getattr(err, 'name', err)}")
    return values[0] if len(values) == 1 else tuple(values)


class _IpcBuffer:
    """An opened IPC mapping: `ptr` on device `device_id`, `size` bytes."""

    def __init__(self, rt: Any, ptr: int, device_id: int) -> None:
        self._rt = rt
        self._ptr = ptr
        self._device = device_id

    def read(self, offset: int, nbytes: int) -> bytes | bytearray:
        host = bytearray(nbytes)
        if nbytes:
            target = (ctypes.c_char * nbytes).from_buffer(host)
            # cudaMemcpyDefault: unified addressing gives the direction, whatever device is current.
            _checked(
                self._rt.cudaMemcpy(
                    ctypes.addressof(target),
                    self._ptr + offset,
                    nbytes,
                    self._rt.cudaMemcpyKind.cudaMemcpyDefault,
                ),
                "cudaMemcpy",
            )
            del target  # release the export so the bytearray is a plain buffer again
        return host

    def write(self, offset: int, data: memoryview) -> None:
        if not data.nbytes:
            return
        host = (ctypes.c_char * data.nbytes).from_buffer_copy(data)
        _checked(
            self._rt.cudaMemcpy(
                self._ptr + offset,
                ctypes.addressof(host),
                data.nbytes,
                self._rt.cudaMemcpyKind.cudaMemcpyDefault,
            ),
            "cudaMemcpy",
        )

    def close(self) -> None:
        _checked(self._rt.cudaSetDevice(self._device), "cudaSetDevice")
        _checked(self._rt.cudaIpcCloseMemHandle(self._ptr), "cudaIpcCloseMemHandle")


class CudaRuntimeOpener:
    """`IpcOpener` over cuda-python's runtime API."""

    def __init__(self, runtime: Any) -> None:
        self._rt = runtime

    def open(self, raw_handle: bytes, device_id: int, byte_size: int) -> DeviceBuffer:
        rt = self._rt
        count = _checked(rt.cudaGetDeviceCount(), "cudaGetDeviceCount")
        if device_id >= count:
            raise CudaCallError(f"no GPU {device_id} (this host has {count})")
        _checked(rt.cudaSetDevice(device_id), "cudaSetDevice")
        handle = rt.cudaIpcMemHandle_t()
        # cuda-bindings 13 exposes the handle's bytes only through its address (no `reserved`).
        ctypes.memmove(handle.getPtr(), raw_handle, IPC_HANDLE_SIZE)
        ptr = int(
            _checked(
                rt.cudaIpcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess),
                "cudaIpcOpenMemHandle",
            )
        )
        return _IpcBuffer(rt, ptr, device_id)


def open_cuda_regions(
    taken: Callable[[str], bool] = lambda _name: False,
) -> tuple[CudaRegionRegistry | None, str]:
    """The registry over cuda-python where a CUDA device is present; else (None, why)."""
    try:
        rt = _runtime()
    except ImportError as exc:
        return None, f"cuda-python is not installed ({exc})"
    try:
        count = _checked(rt.cudaGetDeviceCount(), "cudaGetDeviceCount")
    except CudaCallError as exc:
        return None, f"no CUDA device ({exc})"
    if not count:
        return None, "no CUDA device"
    return CudaRegionRegistry(CudaRuntimeOpener(rt), taken), f"CUDA, {count} device(s)"
