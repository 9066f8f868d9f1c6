"""Hypothesis strategies shared by the property tests: JSON values and KServe tensor headers."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

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
