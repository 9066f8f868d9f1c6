"""Triton's system shared-memory extension: regions clients register, and tensors that live there.

A local client creates a POSIX shared-memory object (`/dev/shm/KEY`), registers a window of it
under a name once, and then its requests only reference `(region, offset, byte_size)` instead of
carrying tensor bytes. The agent maps the window itself (`O_NOFOLLOW`, regular files only) and:

* copies input tensors out of the region before the request is queued: the client may rewrite
  the region while the request waits in the batcher, and a region may be unregistered while a
  request is in flight. One memcpy is far cheaper than moving the bytes through HTTP.
* writes output tensors into the region once the inference is done; the response then carries
  only name, datatype and shape (as Triton's; its C++ client reads output parameters as binary).

Invariants: region names are unique (registering a taken name is a `RegionExistsError`, as Triton's
ALREADY_EXISTS); every registered window lies inside its object; at most `max_regions` regions.
Unregistering an unknown name is not an error (Triton does the same). The registry is used from
the event loop only, so it needs no lock.

Tensors may also name a CUDA shared-memory region (`agent.serving.cuda_regions`, set as
`device`): reads, writes and span checks of a name that is not a system region go there, and
a system region cannot take a name a CUDA region holds.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agent.errors import (
    AccessDeniedError,
    InvalidInputError,
    RegionExistsError,
    SharedMemoryNotFoundError,
)
from agent.tensors.request import (
    InferInput,
    InferRequest,
    OutputTensor,
    SharedMemoryRef,
    tensor_from_bytes,
    tensor_to_bytes,
)

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")  # noqa: S108 - where POSIX shm_open keeps its objects, by design
MAX_REGIONS = 64


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered region as Triton's status endpoints report it."""

    name: str
    key: str
    offset: int
    byte_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


class DeviceRegions(Protocol):
    """CUDA shared-memory regions, as `agent.serving.cuda_regions.CudaRegionRegistry` has them."""

    def has(self, name: str) -> bool: ...
    def read(self, name: str, offset: int, byte_size: int) -> memoryview: ...
    def write(self, name: str, offset: int, data: bytes | memoryview) -> None: ...
    def check(self, name: str, offset: int, byte_size: int) -> None: ...


class _Region:
    """One mapped window: `byte_size` bytes at `offset` in the object `key`."""

    __slots__ = ("mapping", "status")

    def __init__(self, status: RegionStatus, mapping: mmap.mmap) -> None:
        self.status = status
        self.mapping = mapping

    def close(self) -> None:
        # A view still alive somewhere keeps the mapping until it goes (no unmap under it).
        with contextlib.suppress(BufferError):
            self.mapping.close()


class SharedMemoryRegistry:
    """The system shared-memory regions clients have registered."""

    def __init__(
        self, directory: Path = SHM_DIR, max_regions: int = MAX_REGIONS, *, enabled: bool = True
    ) -> None:
        self._directory = directory
        self._max_regions = max_regions
        self._regions: dict[str, _Region] = {}
        # Off (`server.shared_memory = false`): clients cannot make the agent map /dev/shm objects.
        self.enabled = enabled
        self.device: DeviceRegions | None = None  # CUDA regions, where the host has CUDA

    def _on_device(self, name: str) -> DeviceRegions | None:
        """The CUDA regions when `name` is one of them (and not a system region)."""
        if name in self._regions or self.device is None or not self.device.has(name):
            return None
        return self.device

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise InvalidInputError(
                "system shared memory is turned off on this agent (server.shared_memory = "
                "false): send tensor data in the request"
            )

    def register(self, name: str, key: str, offset: int, byte_size: int) -> RegionStatus:
        """Map `byte_size` bytes at `offset` of the shared-memory object `key` as region `name`.

        Raises:
            RegionExistsError: a region of that name is registered already.
            AccessDeniedError: the object belongs to another user.
            InvalidInputError: bad name, key, offset or size; the key names no shared-memory
                object; the window runs past the object's end; too many regions.
        """
        self._require_enabled()
        if not name:
            raise InvalidInputError("shared memory region name must not be empty")
        if name in self._regions or self._on_device(name) is not None:
            raise RegionExistsError(f"shared memory region '{name}' already in manager")
        check_count("offset", offset, minimum=0)
        check_count("byte_size", byte_size, minimum=1)
        check_room(name, len(self._regions), self._max_regions)
        path = self._directory / _file_name(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidInputError(
                f"unable to open shared memory region: '{key}' ({exc.strerror})"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInputError(f"'{key}' is not a shared memory object")
            if info.st_uid != os.geteuid():  # a region name is a path: only the agent's own
                raise AccessDeniedError(
                    f"shared memory object '{key}' belongs to another user (uid {info.st_uid}); "
                    "only the agent's own user's objects can be registered"
                )
            if offset + byte_size > info.st_size:
                raise InvalidInputError(
                    f"failed to register shared memory region '{name}': offset {offset} + "
                    f"byte_size {byte_size} is past the end of '{key}' ({info.st_size} bytes)"
                )
            mapping = mmap.mmap(fd, offset + byte_size)
        finally:
            os.close(fd)
        status = RegionStatus(name, key, offset, byte_size)
        self._regions[name] = _Region(status, mapping)
        logger.info("registered shared memory region %s (key %s, %d bytes)", name, key, byte_size)
        return status

    def unregister(self, name: str) -> None:
        """Drop one region; an unknown name is not an error."""
        region = self._regions.pop(name, None)
        if region is not None:
            region.close()
            logger.info("unregistered shared memory region %s", name)

    def unregister_all(self) -> None:
        for name in list(self._regions):
            self.unregister(name)

    def status(self, name: str | None = None) -> list[RegionStatus]:
        """Every region, or the one named.

        Raises:
            SharedMemoryNotFoundError: `name` is not registered.
        """
        if name is None:
            return [r.status for r in self._regions.values()]
        region = self._regions.get(name)
        if region is None:  # Triton's status wording names the kind of region
            raise SharedMemoryNotFoundError(f"Unable to find system shared memory region: '{name}'")
        return [region.status]

    def has(self, name: str) -> bool:
        """Whether a region of that name is registered."""
        return name in self._regions

    def read(self, name: str, offset: int, byte_size: int) -> memoryview:
        """A view of `byte_size` bytes at `offset` in the region (valid until it is unregistered;
        the client may change the bytes at any time, so copy what must stay put).

        Raises:
            SharedMemoryNotFoundError: no such region.
            InvalidInputError: the span is not inside the region.
        """
        device = self._on_device(name)
        if device is not None:
            return device.read(name, offset, byte_size)  # a host copy already
        region = self._get(name)
        start = self._span(region, offset, byte_size)
        return memoryview(region.mapping)[start : start + byte_size]

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        """Copy `data` into the region at `offset`.

        Raises:
            SharedMemoryNotFoundError: no such region.
            InvalidInputError: the data does not fit in the region from `offset`.
        """
        device = self._on_device(name)
        if device is not None:
            device.write(name, offset, data)
            return
        region = self._get(name)
        size = memoryview(data).nbytes
        start = self._span(region, offset, size)
        region.mapping[start : start + size] = data

    def check(self, ref: SharedMemoryRef) -> None:
        """Fail early when a tensor's span is not inside its region."""
        device = self._on_device(ref.region)
        if device is not None:
            device.check(ref.region, ref.offset, ref.byte_size)
            return
        self._span(self._get(ref.region), ref.offset, ref.byte_size)

    def resolve_inputs(self, request: InferRequest) -> InferRequest:
        """The request with every shared-memory input copied out of its region, and every
        shared-memory output's span checked (so a bad one fails before the model runs).

        Raises:
            SharedMemoryNotFoundError: a referenced region is not registered.
            InvalidInputError: a span outside its region, or a byte size that does not match an
                input's shape and datatype.
        """
        if any(t.shm is not None for t in request.inputs) or any(
            o.shm is not None for o in request.outputs or ()
        ):
            self._require_enabled()
        inputs = tuple(
            tensor if tensor.shm is None else self._input_from(tensor) for tensor in request.inputs
        )
        for output in request.outputs or ():
            if output.shm is not None:
                try:
                    self.check(output.shm)
                except (InvalidInputError, SharedMemoryNotFoundError) as exc:
                    raise type(exc)(f"output '{output.name}': {exc.message}") from None
        return replace(request, inputs=inputs)

    def place_outputs(
        self, outputs: tuple[OutputTensor, ...], wanted: Mapping[str, SharedMemoryRef]
    ) -> None:
        """Write the outputs the client asked for in shared memory into their regions.

        Raises:
            SharedMemoryNotFoundError: the region was unregistered meanwhile.
            InvalidInputError: an output is larger than the client's shared_memory_byte_size.
        """
        if not wanted:
            return
        for out in outputs:
            ref = wanted.get(out.name)
            if ref is None:
                continue
            if out.datatype == "BYTES":
                raw: bytes | memoryview = tensor_to_bytes(out.data, out.datatype)
            else:
                raw = np.ascontiguousarray(out.data).data.cast("B")
            if len(raw) > ref.byte_size:
                raise InvalidInputError(
                    f"shared memory size specified with the request for output '{out.name}' "
                    f"({ref.byte_size} bytes) should be at least {len(raw)} bytes to hold the "
                    "results"
                )
            self.write(ref.region, ref.offset, raw)

    def _input_from(self, tensor: InferInput) -> InferInput:
        ref = tensor.shm
        assert ref is not None
        try:
            view = self.read(ref.region, ref.offset, ref.byte_size)
        except (InvalidInputError, SharedMemoryNotFoundError) as exc:
            raise type(exc)(f"{exc.message} (input '{tensor.name}')") from None  # Triton's first
        try:
            data = tensor_from_bytes(view, tensor.datatype, tensor.shape)
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"input '{tensor.name}': shared_memory_byte_size {ref.byte_size} does not match "
                f"the tensor: {exc.message}"
            ) from None
        if tensor.datatype != "BYTES":
            data = data.copy()  # the one copy: out of client-writable memory, before batching
        del view  # drop the export so that an unregister can unmap the region
        return replace(tensor, data=data)

    def _get(self, name: str) -> _Region:
        region = self._regions.get(name)
        if region is None:
            raise SharedMemoryNotFoundError(f"Unable to find shared memory region: '{name}'")
        return region

    @staticmethod
    def _span(region: _Region, offset: int, byte_size: int) -> int:
        """The span's start in the mapping, after checking it lies inside the region."""
        check_span(region.status.name, region.status.byte_size, offset, byte_size)
        return region.status.offset + offset


def check_span(name: str, size: int, offset: int, byte_size: int) -> None:
    """Check that `byte_size` bytes at `offset` lie inside region `name` of `size` bytes.

    Shared by the system and the CUDA regions (`agent.serving.cuda_regions`), so both
    refuse a bad span with the same (Triton's) wording.
    """
    if offset < 0 or byte_size < 0:
        raise InvalidInputError(f"negative offset or byte size for shared memory '{name}'")
    if offset >= size:
        raise InvalidInputError(
            f"Invalid offset for shared memory region: '{name}' (offset {offset}, region of "
            f"{size} bytes)"
        )
    if offset + byte_size > size:
        raise InvalidInputError(
            f"Invalid offset + byte size for shared memory region: '{name}' (offset {offset} + "
            f"{byte_size} bytes, region of {size} bytes)"
        )


def _file_name(key: str) -> str:
    """The object's file name in the shm directory: POSIX keys are '/name' (one component)."""
    name = key.lstrip("/")
    if not name or "/" in name or name in (".", "..") or "\0" in name or not _encodable(name):
        raise InvalidInputError(
            f"invalid shared memory key {key!r}: expected '/name' of one path component"
        )
    return name


def _encodable(name: str) -> bool:
    """False for a name with a lone surrogate (JSON can carry one) that no file name can hold."""
    try:
        os.fsencode(name)
    except UnicodeEncodeError:
        return False
    return True


def check_count(label: str, value: object, *, minimum: int) -> None:
    """Check a register request's integer field (bools refused, as JSON true is not a count)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidInputError(f"'{label}' must be an integer >= {minimum}, got {value!r}")


def check_room(name: str, registered: int, max_regions: int) -> None:
    """Refuse registering region `name` when `max_regions` are registered already."""
    if registered >= max_regions:
        raise InvalidInputError(
            f"cannot register shared memory region '{name}': {max_regions} regions "
            "are registered already (unregister some first)"
        )
