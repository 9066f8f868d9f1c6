"""Size limits on a request's tensors, checked on their declared shapes before any allocation.

Pure: the codecs call `check_declared` on each input as soon as its name, datatype and shape are
parsed, so a shape that would need more memory than the limits allow is refused with
`PayloadTooLargeError` before its data is split, copied or read out of shared memory.

* A fixed-size tensor may need at most `max_bytes` (the `server.max_request_bytes` setting).
* A BYTES tensor may have at most `max_bytes_elements` elements: every element becomes a Python
  object (about 40 bytes besides its payload), so millions of empty strings would cost far more
  memory and CPU than their 4-byte length prefixes in the body.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agent.errors import PayloadTooLargeError
from agent.tensors import datatypes

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
