"""Hypothesis strategies shared by the property tests: JSON values, KServe tensor headers and
gRPC ModelInferRequests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from agent.proto import grpc_service_pb2 as pb
from agent.tensors import datatypes

DATATYPES = sorted(datatypes.BY_KSERVE)

# Dimensions a hostile client sends: small ones that match data, and edge values.
DIMS = st.one_of(
    st.integers(0, 4),
    st.sampled_from([-1, -(2**63), 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**70]),
)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)

JSON: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def nested(depth: int) -> str:
    """A JSON array nested `depth` deep, as one string."""
    return "[" * depth + "]" * depth


def assert_reason(error: Exception) -> None:
    """A refusal must tell the client why (agent, sync and cache errors carry `message`)."""
    message = getattr(error, "message", "")
    assert isinstance(message, str), type(error).__name__
    assert message.strip(), f"{type(error).__name__} without a message"


_INT64 = st.integers(-(2**63), 2**63 - 1)
_SHAPE_DIMS = st.integers(0, 4) | st.sampled_from([-1, -(2**63), 2**31, 2**62, 2**63 - 1])

_CONTENTS = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": _INT64,
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}


@st.composite
def infer_request_messages(draw: st.DrawFn) -> pb.ModelInferRequest:
    """ModelInferRequests as a hostile client makes them: any inputs, datatypes, shapes, typed
    contents, raw buffers, shared-memory parameters and outputs."""
    message = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=4)))
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add(
            name=draw(st.sampled_from(["INPUT0", "INPUT1", ""])),
            datatype=draw(st.sampled_from([*DATATYPES, "", "FP8"])),
            shape=draw(st.lists(_SHAPE_DIMS, max_size=3)),
        )
        if draw(st.booleans()):
            field = draw(st.sampled_from(sorted(_CONTENTS)))
            getattr(tensor.contents, field).extend(draw(st.lists(_CONTENTS[field], max_size=6)))
        if draw(st.integers(0, 3)) == 0:
            params = tensor.parameters
            params["shared_memory_region"].string_param = draw(st.text(max_size=3))
            params["shared_memory_byte_size"].int64_param = draw(_INT64)
            if draw(st.booleans()):
                params["shared_memory_offset"].uint64_param = draw(st.integers(0, 2**64 - 1))
            if draw(st.booleans()):
                del params[draw(st.sampled_from(sorted(params)))]
    for raw in draw(st.lists(st.binary(max_size=24), max_size=3)):
        message.raw_input_contents.append(raw)
    for _ in range(draw(st.integers(0, 2))):
        output = message.outputs.add(name=draw(st.text(max_size=3)))
        if draw(st.booleans()):
            output.parameters["shared_memory_region"].bool_param = draw(st.booleans())
            output.parameters["shared_memory_byte_size"].string_param = "x"
    return message
