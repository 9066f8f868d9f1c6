"""The helpers Python models import (`from agent import pb_utils`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent import pb_utils
from agent.pb_utils.response import parameters_of
from agent.tensors import datatypes

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


def test_tensor_from_and_to_dlpack_share_the_array() -> None:
    source = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor.from_dlpack("OUT", source)
    assert tensor.name() == "OUT"
    assert tensor.is_cpu()
    source[0, 0] = 42  # shared memory, not a copy
    np.testing.assert_array_equal(tensor.as_numpy(), source)
    again = pb_utils.Tensor.from_dlpack("AGAIN", tensor.as_numpy())
    assert again.as_numpy().dtype == np.float32
    assert type(tensor.to_dlpack()).__name__ == "PyCapsule"


def test_tensor_needs_an_array() -> None:
    with pytest.raises(TypeError, match="numpy array"):
        pb_utils.Tensor("A", [1, 2])  # type: ignore[arg-type]


def test_a_received_request_answers_its_id_parameters_and_correlation_id() -> None:
    from agent.pb_utils.request import received_request

    x = pb_utils.Tensor("X", np.zeros(1, dtype=np.int32))
    described = {"request_id": "abc", "parameters": {"s": "v", "f": 0.5}, "correlation_id": 7}

    request = received_request([x], ["Y"], described)
    plain = received_request([x], ["Y"], {})

    assert (request.request_id(), request.correlation_id()) == ("abc", 7)
    assert json.loads(request.parameters()) == {"s": "v", "f": 0.5}  # the client's, as sent
    assert (plain.request_id(), plain.parameters(), plain.correlation_id()) == ("", "{}", 0)
    # Everything else as a request built without those fields answers it.
    built = pb_utils.InferenceRequest([x], ["Y"])
    for ask in ("inputs", "requested_output_names", "model_name", "model_version", "flags"):
        assert getattr(plain, ask)() == getattr(built, ask)(), ask
    assert (plain.timeout(), plain.is_cancelled(), plain.trace().index) == (0, False, None)


def test_a_response_sender_from_a_factory_is_made_once_on_first_use() -> None:
    from agent.pb_utils.request import received_request

    made: list[pb_utils.InferenceRequest] = []

    def make(request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponseSender:
        made.append(request)
        return pb_utils.InferenceResponseSender(lambda r, f: None, request.is_cancelled)

    request = received_request([], ["Y"], {})
    request.set_response_sender_factory(make)
    assert made == []  # nothing made until the model asks
    sender = request.get_response_sender()
    assert request.get_response_sender() is sender
    assert made == [request]
    with pytest.raises(pb_utils.TritonModelException, match="only available on the requests"):
        pb_utils.InferenceRequest([], ["Y"]).get_response_sender()  # a BLS request has none


def test_response_parameters_are_checked_as_triton_checks_them() -> None:
    ok = pb_utils.InferenceResponse([], parameters={"b": True, "i": 3, "s": "v"})
    from_json = pb_utils.InferenceResponse(parameters='{"i": 1}')

    assert json.loads(ok.parameters()) == {"b": True, "i": 3, "s": "v"}
    assert json.loads(from_json.parameters()) == {"i": 1}
    assert pb_utils.InferenceResponse().parameters() == "{}"
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str, found type <class 'f"):
        pb_utils.InferenceResponse(parameters={"f": 0.5})  # type: ignore[dict-item]
    with pytest.raises(pb_utils.TritonModelException, match="keys to have type str"):
        pb_utils.InferenceResponse(parameters={1: "x"})  # type: ignore[dict-item]
    with pytest.raises(pb_utils.TritonModelException, match="Expect dict, got <class 'list'>"):
        pb_utils.InferenceResponse(parameters=[])  # type: ignore[arg-type]


def test_parameters_of_a_response_are_what_its_json_gives_back() -> None:
    for response in (
        pb_utils.InferenceResponse([], parameters={"b": True, "i": 3, "s": "v"}),
        pb_utils.InferenceResponse(parameters='{"i": 1}'),
        pb_utils.InferenceResponse(),
    ):
        got = parameters_of(response)
        assert got == json.loads(response.parameters())
        got["added"] = 1  # a copy: the response keeps its own
        assert "added" not in json.loads(response.parameters())


def test_numpy_to_kserve_answers_as_a_scan_of_every_datatype_would() -> None:
    def scanned(dtype: np.dtype) -> str | None:
        if dtype.kind in "OSU":
            return "BYTES"
        return next((t.kserve for t in datatypes.BY_KSERVE.values() if t.numpy == dtype), None)

    dtypes = [t.numpy for t in datatypes.BY_KSERVE.values()]
    dtypes += [np.dtype(c) for c in ("<f4", ">f4", ">i8", "S3", "U2", "c8", "M8[s]", "V4")]
    for dtype in dtypes:
        expected = scanned(dtype)
        if expected is None:
            with pytest.raises(ValueError, match="has no KServe datatype"):
                pb_utils.numpy_to_kserve(dtype)
        else:
            assert pb_utils.numpy_to_kserve(dtype) == expected, dtype
