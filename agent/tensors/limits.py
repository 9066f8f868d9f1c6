"""Size limits on a request's tensors, checked on their declared shapes before any allocation.

Pure: the codecs call `check_declared` on each input as soon as its name, datatype and shape are
parsed, so a shape that would need more memory than the limits allow is refused with
`PayloadTooLargeError` before its data is split, copied or read out of shared memory.

* A fixed-size tensor may need at most `max_bytes` (the `server.max_request_bytes` setting).
* A BYTES tensor may have at most `max_bytes_elements` elements: every element becomes a Python
  object (about 40 bytes besides its payload), so millions of empty strings would cost far more
  memory and CPU than their 4-byte length prefixes in the body.

The scheduler uses `tensor_bytes` and `rows_within` to keep each batch's tensors within the
bytes the model's memory plan allows one execution (see `agent.scheduling.scheduler`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agent.errors import PayloadTooLargeError
from agent.tensors import datatypes
from agent.tensors.signature import ModelSignature, ValidatedRequest

DEFAULT_MAX_BYTES_ELEMENTS = 1 << 20


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """The most one input tensor may declare."""

    max_bytes: int  # fixed-size datatypes: elements * itemsize
    max_bytes_elements: int = DEFAULT_MAX_BYTES_ELEMENTS  # BYTES: element count


def check_declared(name: str, datatype: str, shape: Sequence[int], limits: TensorLimits) -> None:
    """Refuse an input whose declared shape is over the limits (unknown datatypes pass: the
    caller reports them).

    Raises:
        PayloadTooLargeError: the shape needs more bytes, or more BYTES elements, than allowed.
    """
    dtype = datatypes.from_kserve(datatype)
    if dtype is None:
        return
    count = math.prod(shape)  # Python ints: a hostile shape cannot overflow
    if datatype == "BYTES":
        if count > limits.max_bytes_elements:
            raise PayloadTooLargeError(
                f"input '{name}': BYTES tensor of shape {list(shape)} has {count} elements, "
                f"over the limit of {limits.max_bytes_elements} (server.max_bytes_elements)"
            )
        return
    nbytes = count * dtype.itemsize
    if nbytes > limits.max_bytes:
        raise PayloadTooLargeError(
            f"input '{name}': shape {list(shape)} of {datatype} needs {nbytes} bytes, over the "
            f"limit of {limits.max_bytes} bytes (server.max_request_bytes)"
        )


# --- a batch's tensors against the model's memory plan ---------------------------------------

_OBJECT_BYTES = 8  # a BYTES element's pointer; its payload is counted where it is known


def output_row_bytes(signature: ModelSignature) -> int:
    """A lower bound on the output bytes of one row (one request when the model does not
    batch): variable dims count as 1, a BYTES element as a pointer."""
    total = 0
    for contract in signature.outputs.values():
        dtype = datatypes.from_kserve(contract.datatype)
        size = _OBJECT_BYTES if dtype is None or not dtype.itemsize else dtype.itemsize
        total += math.prod(max(d, 1) for d in contract.dims) * size
    return total


def tensor_bytes(request: ValidatedRequest, row_output_bytes: int) -> int:
    """The bytes a request's tensors take in an execution: its inputs as decoded, plus
    `row_output_bytes` per row."""
    return sum(int(feed.nbytes) for feed in request.feeds.values()) + (
        request.batch_size * row_output_bytes
    )


def rows_within(max_bytes: int, head_rows: int, row_bytes: int) -> int:
    """The most rows a batch may take so that `row_bytes` per row stays within `max_bytes`;
    never fewer than `head_rows` (the first request always runs whole)."""
    if row_bytes <= 0:
        return max(head_rows, 1 << 30)
    return max(head_rows, max_bytes // row_bytes)
