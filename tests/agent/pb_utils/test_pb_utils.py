"""The helpers Python models import (`from agent import pb_utils`)."""

from __future__ import annotations

import numpy as np
import pytest

from agent import pb_utils

CONFIG = {
    "input": [{"name": "A", "data_type": "TYPE_FP32"}, {"name": "B", "data_type": "TYPE_STRING"}],
    "output": [{"name": "Y", "data_type": "TYPE_INT64"}],
}


def test_request_and_response_accessors() -> None:
    a = pb_utils.Tensor("A", np.ones(3, dtype=np.float32))
    request = pb_utils.InferenceRequest([a], ["Y"], "id-1")
    assert pb_utils.get_input_tensor_by_name(request, "A") is a
    assert pb_utils.get_input_tensor_by_name(request, "Z") is None
    assert request.requested_output_names() == ["Y"]
    assert request.request_id() == "id-1"
    y = pb_utils.Tensor("Y", np.arange(3))
    response = pb_utils.InferenceResponse(output_tensors=[y])
    assert not response.has_error()
    assert pb_utils.get_output_tensor_by_name(response, "Y") is y
    assert y.name() == "Y"
    np.testing.assert_array_equal(y.as_numpy(), [0, 1, 2])


def test_error_response_and_triton_alias() -> None:
    assert pb_utils.TritonError is pb_utils.ModelError
    response = pb_utils.InferenceResponse(error=pb_utils.TritonError("bad input"))
    assert response.has_error()
    error = response.error()
    assert error is not None
    assert error.message() == "bad input"
    assert response.output_tensors() == []


def test_config_lookups() -> None:
    assert pb_utils.get_input_config_by_name(CONFIG, "B") == CONFIG["input"][1]
    assert pb_utils.get_output_config_by_name(CONFIG, "Y") == CONFIG["output"][0]
    assert pb_utils.get_input_config_by_name(CONFIG, "Y") is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("TYPE_FP32", np.float32),
        ("TYPE_FP16", np.float16),
        ("TYPE_BOOL", np.bool_),
        ("TYPE_UINT64", np.uint64),
        ("TYPE_STRING", np.object_),
    ],
)
def test_triton_string_to_numpy(name: str, expected: type) -> None:
    assert pb_utils.triton_string_to_numpy(name) is expected


def test_unknown_type_string_is_refused() -> None:
    with pytest.raises(ValueError, match="TYPE_BF16"):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


def test_tensor_needs_an_array() -> None:
    with pytest.raises(TypeError, match="numpy array"):
        pb_utils.Tensor("A", [1, 2])  # type: ignore[arg-type]
