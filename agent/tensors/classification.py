"""Triton's classification extension: an output asked for with `classification: K` comes back as
the top K of each batch item, as BYTES "value:index" or "value:index:label" strings.

Pure: the labels (the output's `label_filename`, one per line) are read by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.errors import InvalidInputError

# What Triton ranks: integers and FP32/FP64 (FP16, BF16, BOOL and BYTES are refused).
_RANKED = frozenset("iu")


def top_k(
    data: np.ndarray, k: int, datatype: str, labels: Sequence[str], *, batched: bool
) -> np.ndarray:
    """The K largest values of each batch item (all of `data` when not batched), largest first
    (ties: lower index first), formatted as Triton formats them: floats with six decimals.

    Returns:
        An object array of bytes, shape [batch, K'] (batched) or [K'], K' = min(K, elements).

    Raises:
        InvalidInputError: K < 1, or a datatype Triton does not rank.
    """
    if k < 1:
        raise InvalidInputError("classification count must be a positive integer")
    kind = data.dtype.kind
    if not (kind in _RANKED or datatype in ("FP32", "FP64")):
        raise InvalidInputError(
            f"class result not available for output due to unsupported type '{datatype}'"
        )
    rows = data.reshape(data.shape[0], -1) if batched else data.reshape(1, -1)
    count = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], count), dtype=np.object_)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        for c, index in enumerate(order):
            value = row[index]
            text = f"{value:f}" if kind == "f" else str(int(value))
            label = labels[index] if index < len(labels) else ""
            entry = f"{text}:{index}:{label}" if label else f"{text}:{index}"
            out[r, c] = entry.encode()
    return out if batched else out.reshape(count)
