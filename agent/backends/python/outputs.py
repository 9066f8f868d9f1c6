"""The outputs a Python model's `execute` returned, checked against the config's declaration.

A Python model declares its outputs in the config only, so the agent checks each returned
array's shape (and, for a batched model, its batch rows) before serving it; a mismatch is the
request's BackendError, worded so the model's author knows the fix. An array of another datatype
than declared is answered with its own datatype, as Triton's Python backend answers it; one of
no datatype the protocol knows is refused.

As Triton's Python backend, a response holds the requested outputs the model returned, in the
order the model returned them: a requested output the model left out is simply absent (a model
with optional inputs answers only for those it received).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from agent.errors import BackendError
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor


def requested_outputs(
    model_name: str,
    declared_outputs: Mapping[str, ModelTensor],
    names: Sequence[str],
    returned: Mapping[str, np.ndarray],
    rows: int | None,
) -> dict[str, np.ndarray]:
    """The outputs of `returned` (one response, in the model's order) that `names` asks for,
    each checked against its declaration; those the model did not return are left out.

    `rows`: the batch's row count, for a batched model (None: not checked).

    Raises:
        BackendError: a returned output's datatype or shape is not declared.
    """
    wanted = set(names)
    return {
        name: checked_output(model_name, declared_outputs, name, array, rows)
        for name, array in returned.items()
        if name in wanted
    }


def in_requested_order(
    model_name: str, outputs: Mapping[str, np.ndarray], names: Sequence[str]
) -> list[np.ndarray]:
    """`outputs` as a list aligned with `names`, for the callers that need every one of them
    (`Backend.run`: warm-up, merged batches).

    Raises:
        BackendError: the model did not return one of `names`.
    """
    missing = [n for n in names if n not in outputs]
    if missing:
        raise BackendError(
            f"python model '{model_name}' output '{missing[0]}': execute returned no tensor of "
            "that name"
        )
    return [outputs[n] for n in names]


def checked_output(
    model_name: str,
    declared_outputs: Mapping[str, ModelTensor],
    name: str,
    array: np.ndarray,
    rows: int | None,
) -> np.ndarray:
    """`array`, what the model returned as output `name`, if it fits that output's declaration.

    `rows`: the batch's row count, for a batched model (None: not checked).

    Raises:
        BackendError: its datatype or shape is not declared.
    """
    declared = declared_outputs[name]
    datatype = declared.datatype
    assert datatype is not None
    dtype = array.dtype
    if dtype != datatype.numpy:  # nearly every output is of its declared type: no lookup then
        got = "BYTES" if dtype == np.object_ else _kserve(dtype)
        # Another known datatype is answered as returned, as Triton does (its bls_decoupled
        # example sums INT32 values into an INT64 array); only an array no protocol can carry
        # is refused.
        if got != datatype.kserve and got not in datatypes.BY_KSERVE:
            raise BackendError(
                f"{_where(model_name, name)} is {got} but the config says {declared.type_name} "
                "(convert it with .astype before returning it)"
            )
    shape = declared.shape
    have = array.shape
    fits = len(have) == len(shape) and (rows is None or have[0] == rows)
    if fits:
        for want, size in zip(shape, have, strict=True):  # a loop, not all(<generator>)
            if want is not None and want != size:
                fits = False
                break
    if not fits:
        expected = ["-1" if d is None else str(d) for d in shape]
        if rows is not None:
            expected[0] = str(rows)
        raise BackendError(
            f"{_where(model_name, name)} has shape {list(have)}, expected [{', '.join(expected)}]"
        )
    return array


def _where(model_name: str, name: str) -> str:
    return f"python model '{model_name}' output '{name}'"  # for errors only: not per call


def _kserve(dtype: np.dtype) -> str:
    known = datatypes.BY_NUMPY.get(dtype)  # every output of every call: a lookup first
    if known is not None:
        return known.kserve
    for kind in datatypes.BY_KSERVE.values():
        if kind.numpy == dtype:
            return kind.kserve
    return str(dtype)
