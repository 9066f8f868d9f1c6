"""What a Python model's response holds: the requested outputs it returned, in its order."""

from __future__ import annotations

import numpy as np
import pytest

from agent.backends.python.outputs import in_requested_order, requested_outputs
from agent.errors import BackendError
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor

FP32 = datatypes.BY_KSERVE["FP32"]
DECLARED = {n: ModelTensor(n, FP32, "TYPE_FP32", (None,)) for n in ("A", "B", "C")}


def returned() -> dict[str, np.ndarray]:
    """A response that holds B, then A (never C), as the model built it."""
    return {"B": np.zeros(2, np.float32), "A": np.ones(2, np.float32)}


def test_the_model_s_order_is_kept_and_what_it_left_out_is_absent() -> None:
    answer = requested_outputs("m", DECLARED, ("A", "B", "C"), returned(), None)
    assert list(answer) == ["B", "A"]
    np.testing.assert_array_equal(answer["A"], np.ones(2, np.float32))


def test_only_the_requested_outputs_are_kept() -> None:
    assert list(requested_outputs("m", DECLARED, ("A",), returned(), None)) == ["A"]
    assert requested_outputs("m", DECLARED, ("C",), returned(), None) == {}


def test_a_returned_output_is_still_checked_against_its_declaration() -> None:
    other = {"A": np.ones(2, np.float64)}  # another known datatype: answered as returned
    assert requested_outputs("m", DECLARED, ("A",), other, None)["A"].dtype == np.float64
    unknown = {"A": np.ones(2, np.complex64)}
    with pytest.raises(BackendError, match="output 'A' is complex64 but the config says TYPE_FP32"):
        requested_outputs("m", DECLARED, ("A",), unknown, None)
    with pytest.raises(BackendError, match=r"has shape \[2\], expected \[3\]"):
        requested_outputs("m", DECLARED, ("A",), returned(), 3)


def test_a_caller_that_needs_every_output_in_its_order_is_told_which_is_missing() -> None:
    answer = requested_outputs("m", DECLARED, ("A", "B"), returned(), None)
    assert [a.dtype for a in in_requested_order("m", answer, ("A", "B"))] == [np.float32] * 2
    with pytest.raises(BackendError, match="output 'C': execute returned no tensor"):
        in_requested_order("m", answer, ("A", "C"))
