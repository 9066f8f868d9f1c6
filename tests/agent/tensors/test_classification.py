"""The classification extension's top-K formatting (Triton's "value:index[:label]")."""

from __future__ import annotations

import numpy as np
import pytest

from agent.errors import InvalidInputError
from agent.tensors.classification import top_k


def test_floats_have_six_decimals_and_labels_where_known() -> None:
    data = np.array([[1.5, 2.5, 3.5, 4.5]], dtype=np.float32)
    out = top_k(data, 2, "FP32", ("zero", "one", "two", "three"), batched=True)
    assert out.shape == (1, 2)
    assert out.tolist() == [[b"4.500000:3:three", b"3.500000:2:two"]]


def test_without_labels_value_and_index_only() -> None:
    data = np.array([[0.5, 1.5, 2.5, 3.5]], dtype=np.float32)
    out = top_k(data, 3, "FP32", (), batched=True)
    assert out.tolist() == [[b"3.500000:3", b"2.500000:2", b"1.500000:1"]]


def test_each_batch_item_ranked_on_its_own_and_k_capped_at_its_elements() -> None:
    data = np.array([[1, 9], [7, 2]], dtype=np.int32)
    out = top_k(data, 5, "INT32", ("a",), batched=True)
    assert out.tolist() == [[b"9:1", b"1:0:a"], [b"7:0:a", b"2:1"]]


def test_ties_keep_the_lower_index_first_and_unbatched_is_flat() -> None:
    out = top_k(np.array([2.0, 5.0, 5.0, 1.0]), 3, "FP64", (), batched=False)
    assert out.tolist() == [b"5.000000:1", b"5.000000:2", b"2.000000:0"]


@pytest.mark.parametrize("datatype", ["FP16", "BOOL", "BYTES"])
def test_types_triton_does_not_rank_are_refused(datatype: str) -> None:
    numpy_type = {"FP16": np.float16, "BOOL": np.bool_, "BYTES": np.object_}[datatype]
    with pytest.raises(InvalidInputError, match="unsupported type"):
        top_k(np.zeros((1, 2), dtype=numpy_type), 1, datatype, (), batched=True)


def test_k_must_be_positive() -> None:
    with pytest.raises(InvalidInputError):
        top_k(np.zeros((1, 2), dtype=np.float32), 0, "FP32", (), batched=True)
