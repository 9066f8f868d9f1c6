"""Triton-style response cache: identical requests to a model version reuse its last outputs.

One cache serves the whole agent under one byte budget and evicts the least recently used entry
first. Entries are keyed by `cache_key`, a SHA-256 over everything that decides a response: the
model, its version, every input's name, datatype, shape and bytes, and the requested outputs.

Invariants:

* `used_bytes` is the sum of `entry_size` over the stored entries and never exceeds
  `capacity_bytes`; an entry larger than the capacity is refused, not stored.
* Stored outputs are private copies. Numeric arrays handed out by `get` are read-only views of
  immutable bytes, so a caller can neither write into them nor flip them back to writeable;
  BYTES (object) arrays are copied on every hit.
* Each entry remembers its model and version so `invalidate` can drop them on unload or swap.
* An entry keeps the response's parameters (a Python model's `InferenceResponse(parameters=...)`)
  with its outputs: a hit answers what the miss answered.
* Capacity 0 disables the cache: `get` returns None and `put` returns False, no counter moves.

The cache is NOT thread-safe by design: it is used from the event loop only. Example::

    cache = ResponseCache(64 << 20)
    key = cache_key("mlp", "1", request.inputs, ["OUTPUT0"])
    hit = cache.get(key)
    if hit is None:
        outputs = run_model(...)
        cache.put(key, outputs, model="mlp", version="1")
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agent.tensors.request import InferInput, OutputTensor

logger = logging.getLogger(__name__)

ENTRY_OVERHEAD_BYTES = 256  # key, bookkeeping record and ordered-dict slot, per entry
TENSOR_OVERHEAD_BYTES = 128  # OutputTensor and ndarray headers, per output tensor

_KEY_DOMAIN = b"edge-agent/response-cache/v1"


def cache_key(
    model: str, version: str, inputs: Sequence[InferInput], output_names: Sequence[str]
) -> bytes:
    """The cache key of a request: a SHA-256 digest over everything that decides the response.

    Inputs are hashed in name order, so the order a client lists them in does not matter. Every
    field is length-prefixed, so no two different requests share a byte stream.

    Args:
        model: the model's name.
        version: the version that will run (resolved, not empty).
        inputs: the request's decoded inputs.
        output_names: the outputs the response will hold, in response order (resolved: every
            output of the model when the request named none).

    Returns:
        The 32-byte digest.
    """
    digest = hashlib.sha256(_KEY_DOMAIN)
    _field(digest, model.encode())
    _field(digest, version.encode())
    digest.update(len(inputs).to_bytes(8, "little"))
    for tensor in sorted(inputs, key=lambda t: t.name):
        _field(digest, tensor.name.encode())
        _field(digest, tensor.datatype.encode())
        digest.update(len(tensor.shape).to_bytes(8, "little"))
        for dim in tensor.shape:
            digest.update(dim.to_bytes(8, "little", signed=True))
        if tensor.datatype == "BYTES":
            digest.update(tensor.data.size.to_bytes(8, "little"))
            for element in tensor.data.ravel():
                _field(digest, _as_bytes(element))
        else:
            data = np.ascontiguousarray(tensor.data)
            digest.update(data.dtype.str.encode())
            digest.update(data.nbytes.to_bytes(8, "little"))
            digest.update(data.reshape(-1).view(np.uint8).data)
    digest.update(len(output_names).to_bytes(8, "little"))
    for name in output_names:
        _field(digest, name.encode())
    return digest.digest()


def entry_size(outputs: Sequence[OutputTensor]) -> int:
    """The bytes an entry holding these outputs counts against the cache's capacity.

    Args:
        outputs: the response's output tensors.

    Returns:
        ENTRY_OVERHEAD_BYTES, plus for each tensor TENSOR_OVERHEAD_BYTES and its array's nbytes,
        plus for BYTES tensors the length of every element.
    """
    size = ENTRY_OVERHEAD_BYTES
    for out in outputs:
        size += TENSOR_OVERHEAD_BYTES + out.data.nbytes
        if out.data.dtype == np.object_:
            size += sum(len(_as_bytes(v)) for v in out.data.ravel())
    return size


@dataclass(frozen=True, slots=True)
class CachedResponse:
    """What a hit answers: the outputs and the response parameters stored with them."""

    outputs: tuple[OutputTensor, ...]
    parameters: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    model: str
    version: str
    outputs: tuple[OutputTensor, ...]
    parameters: Mapping[str, Any] | None
    size: int


class ResponseCache:
    """LRU cache of inference responses under one byte budget. Not thread-safe (event loop only)."""

    def __init__(self, capacity_bytes: int) -> None:
        """Create an empty cache.

        Args:
            capacity_bytes: the byte budget; 0 disables the cache.

        Raises:
            ValueError: a negative capacity.
        """
        if capacity_bytes < 0:
            raise ValueError(f"cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self._capacity = capacity_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recent first
        self._used = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    @property
    def capacity_bytes(self) -> int:
        """The byte budget; 0 when the cache is disabled."""
        return self._capacity

    @property
    def used_bytes(self) -> int:
        """Bytes counted against the budget by the stored entries."""
        return self._used

    @property
    def entries(self) -> int:
        """Number of stored entries."""
        return len(self._entries)

    @property
    def hits(self) -> int:
        """Lookups that found an entry."""
        return self._hits

    @property
    def misses(self) -> int:
        """Lookups that found nothing (not counted while the cache is disabled)."""
        return self._misses

    @property
    def evictions(self) -> int:
        """Entries dropped to make room (not those dropped by `invalidate`)."""
        return self._evictions

    def get(self, key: bytes) -> CachedResponse | None:
        """Look a response up and mark it most recently used.

        Args:
            key: a `cache_key` digest.

        Returns:
            The cached outputs (numeric arrays read-only) and parameters, or None on a miss.
        """
        if self._capacity == 0:
            return None
        entry = self._entries.get(key)
        if entry is None:
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return CachedResponse(tuple(_hand_out(out) for out in entry.outputs), entry.parameters)

    def put(
        self,
        key: bytes,
        outputs: tuple[OutputTensor, ...],
        *,
        model: str,
        version: str,
        parameters: Mapping[str, Any] | None = None,
    ) -> bool:
        """Store a response, evicting least recently used entries until it fits.

        The arrays are copied: later changes to the caller's arrays do not reach the cache.
        Storing under a key already present replaces that entry.

        Args:
            key: the `cache_key` digest of the request.
            outputs: the response's outputs.
            model: the model's name, for `invalidate`.
            version: the version that produced the outputs, for `invalidate`.
            parameters: the response's parameters (bool, int, float or str values), answered
                with the outputs on every hit.

        Returns:
            True when stored; False when the cache is disabled or the entry alone is larger than
            the capacity (nothing is evicted then).
        """
        size = entry_size(outputs) + _parameters_size(parameters)
        if size > self._capacity:
            if self._capacity:
                logger.debug(
                    "response of %s version %s not cached: %d bytes > capacity %d",
                    model,
                    version,
                    size,
                    self._capacity,
                )
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self._used -= old.size
        while self._used + size > self._capacity:
            _, evicted = self._entries.popitem(last=False)
            self._used -= evicted.size
            self._evictions += 1
        stored = tuple(OutputTensor(o.name, o.datatype, _frozen_copy(o.data)) for o in outputs)
        kept = dict(parameters) if parameters else None  # a private copy, as the arrays
        self._entries[key] = _Entry(model, version, stored, kept, size)
        self._used += size
        return True

    def invalidate(self, model: str, version: str | None = None) -> int:
        """Drop the entries of a model, or of one of its versions (on unload or swap).

        Args:
            model: the model's name.
            version: only this version's entries; None drops every version's.

        Returns:
            The number of entries dropped.
        """
        doomed = [
            key
            for key, entry in self._entries.items()
            if entry.model == model and (version is None or entry.version == version)
        ]
        for key in doomed:
            self._used -= self._entries.pop(key).size
        return len(doomed)


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def _field(digest: _Digest, value: bytes) -> None:
    digest.update(len(value).to_bytes(8, "little"))
    digest.update(value)


def _parameters_size(parameters: Mapping[str, Any] | None) -> int:
    """Bytes counted for an entry's parameters: their keys' and values' text."""
    if not parameters:
        return 0
    return sum(len(key) + len(str(value)) for key, value in parameters.items())


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()


def _frozen_copy(data: np.ndarray) -> np.ndarray:
    """A private copy; numeric ones live in immutable bytes so no view of them can be written."""
    if data.dtype == np.object_:
        copy = data.copy()
        copy.flags.writeable = False
        return copy
    return np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=data.dtype).reshape(data.shape)


def _hand_out(out: OutputTensor) -> OutputTensor:
    """What a hit returns: numeric arrays as they are stored, object arrays as fresh copies."""
    if out.data.dtype == np.object_:
        return OutputTensor(out.name, out.datatype, out.data.copy())
    return out
