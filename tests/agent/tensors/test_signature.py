"""A model's contract built from its completed config, and request validation against it."""

from __future__ import annotations

import numpy as np
import pytest

from agent.errors import InvalidInputError, ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.autocomplete import complete_config
from agent.repository.model_config import parse_model_config
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor
from agent.tensors.request import InferInput, InferRequest, RequestedOutput
from agent.tensors.signature import ModelSignature, TensorContract


def tensor(name: str, kserve: str, shape: tuple[int | None, ...]) -> ModelTensor:
    dt = datatypes.BY_KSERVE[kserve]
    return ModelTensor(name, dt, dt.onnx, shape)


def batched_signature() -> ModelSignature:
    """IMAGE FP32 [?, 4], MASK INT64 [?, 2] → PROBS FP32 [?, 3], LABEL BYTES [?]; max batch 4."""
    config = complete_config(
        mc.ModelConfig(),
        "clf",
        [tensor("IMAGE", "FP32", (None, 4)), tensor("MASK", "INT64", (None, 2))],
        [tensor("PROBS", "FP32", (None, 3)), tensor("LABEL", "BYTES", (None,))],
        auto_complete=True,
    )
    return ModelSignature.from_config(config)


FLAT_CONFIG = """
name: "flat"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3, 4 ] reshape: { shape: [ 2, 6 ] } } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3, 4 ] reshape: { shape: [ 2, 6 ] } } ]
"""


def flat_signature() -> ModelSignature:
    """Unbatched FP32 model [2, 6] served as [3, 4] through reshapes."""
    config = complete_config(
        parse_model_config(FLAT_CONFIG, "flat/config.pbtxt"),
        "flat",
        [tensor("X", "FP32", (2, 6))],
        [tensor("Y", "FP32", (2, 6))],
        auto_complete=True,
    )
    return ModelSignature.from_config(config)


def batched_reshape_signature() -> ModelSignature:
    """X FP32 served as [?, 4], model takes [?, 2, 2]; Y model [?, 1, 3] served as [?, 3]."""
    text = """
    max_batch_size: 2
    input [ { name: "X" dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
    output [ { name: "Y" dims: [ 3 ] reshape: { shape: [ 1, 3 ] } } ]
    """
    config = complete_config(
        parse_model_config(text, "r/config.pbtxt"),
        "r",
        [tensor("X", "FP32", (None, 2, 2))],
        [tensor("Y", "FP32", (None, 1, 3))],
        auto_complete=True,
    )
    return ModelSignature.from_config(config)


def infer_input(name: str, datatype: str, shape: tuple[int, ...]) -> InferInput:
    dt = datatypes.BY_KSERVE[datatype]
    return InferInput(name, datatype, shape, np.zeros(shape, dtype=dt.numpy))


def good_inputs(batch: int = 2) -> tuple[InferInput, ...]:
    image = InferInput(
        "IMAGE", "FP32", (batch, 4), np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
    )
    return image, infer_input("MASK", "INT64", (batch, 2))


def request_of(
    *inputs: InferInput, outputs: tuple[RequestedOutput, ...] | None = None
) -> InferRequest:
    return InferRequest(inputs=inputs, outputs=outputs)


# --- building the contract ----------------------------------------------------------------------


def test_from_config_builds_contracts() -> None:
    sig = batched_signature()

    assert sig.model_name == "clf"
    assert sig.max_batch_size == 4
    assert sig.batched is True
    assert sig.inputs == {
        "IMAGE": TensorContract("IMAGE", "FP32", (4,), None),
        "MASK": TensorContract("MASK", "INT64", (2,), None),
    }
    assert list(sig.outputs) == ["PROBS", "LABEL"]
    # Only the batch dimension: completed as Triton's ONNX Runtime backend does, dims [1] with an
    # empty reshape (clients see [batch, 1]).
    assert sig.outputs["LABEL"] == TensorContract("LABEL", "BYTES", (1,), ())


def test_from_config_keeps_reshape_and_optional() -> None:
    config = parse_model_config(
        'name: "o" input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } '
        "optional: true } ]",
        "o/config.pbtxt",
    )

    sig = ModelSignature.from_config(config)

    assert sig.inputs["A"] == TensorContract("A", "INT32", (1,), (), optional=True)
    assert sig.batched is False


def test_from_config_unsupported_datatype() -> None:
    config = parse_model_config(
        'name: "b" input [ { name: "A" data_type: TYPE_BF16 dims: [ 1 ] } ]', "b/config.pbtxt"
    )

    with pytest.raises(ModelConfigError, match="tensor 'A' has an unsupported data_type"):
        ModelSignature.from_config(config)


def test_metadata_shapes() -> None:
    sig = batched_signature()

    assert sig.inputs["IMAGE"].metadata(sig.batched) == {
        "name": "IMAGE",
        "datatype": "FP32",
        "shape": [-1, 4],
    }
    assert flat_signature().inputs["X"].metadata(False)["shape"] == [3, 4]


# --- validate -----------------------------------------------------------------------------------


def test_good_request_produces_feeds_and_batch_size() -> None:
    image, mask = good_inputs(batch=3)

    valid = batched_signature().validate(request_of(mask, image))

    assert set(valid.feeds) == {"IMAGE", "MASK"}
    assert valid.feeds["IMAGE"] is image.data
    assert valid.feeds["MASK"] is mask.data
    assert valid.batch_size == 3
    assert valid.output_names == ("PROBS", "LABEL")


def test_requested_outputs_are_kept_in_request_order() -> None:
    request = request_of(
        *good_inputs(), outputs=(RequestedOutput("LABEL", True), RequestedOutput("PROBS"))
    )

    valid = batched_signature().validate(request)

    assert valid.output_names == ("LABEL", "PROBS")


def test_unbatched_request_has_batch_size_one() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)

    valid = flat_signature().validate(request_of(InferInput("X", "FP32", (3, 4), data)))

    assert valid.batch_size == 1


def test_unknown_input() -> None:
    image, _ = good_inputs()
    with pytest.raises(InvalidInputError) as info:
        batched_signature().validate(request_of(image, infer_input("EXTRA", "FP32", (2, 4))))

    message = info.value.message
    assert message.startswith("unexpected inference input 'EXTRA' for model 'clf'")
    assert "IMAGE, MASK" in message


def test_more_inputs_than_the_model_has() -> None:
    """Triton's words: the inputs given, last to first as Triton lists them, and none missing
    (Triton writes that empty list as `]`)."""
    with pytest.raises(InvalidInputError) as info:
        batched_signature().validate(
            request_of(*good_inputs(), infer_input("EXTRA", "FP32", (2, 4)))
        )

    assert info.value.message == (
        "expected 2 inputs but got 3 inputs for model 'clf'. Got input(s) "
        "['EXTRA','MASK','IMAGE'], but missing required input(s) ]. "
        "Please provide all required input(s)."
    )


def test_duplicate_input() -> None:
    image, mask = good_inputs()

    with pytest.raises(InvalidInputError, match="input 'IMAGE' already exists in request"):
        batched_signature().validate(request_of(image, mask, image))


def test_several_wrong_inputs_name_the_last_as_triton() -> None:
    image = infer_input("IMAGE", "FP64", (2, 4))
    mask = infer_input("MASK", "INT32", (2, 2))

    with pytest.raises(InvalidInputError, match="input 'MASK' data-type is 'INT32'"):
        batched_signature().validate(request_of(image, mask))
    with pytest.raises(InvalidInputError, match="input 'IMAGE' data-type is 'FP64'"):
        batched_signature().validate(request_of(mask, image))


def test_feeds_keep_the_request_order() -> None:
    image, mask = good_inputs()

    assert list(batched_signature().validate(request_of(mask, image)).feeds) == ["MASK", "IMAGE"]


def test_wrong_datatype() -> None:
    _, mask = good_inputs()

    with pytest.raises(
        InvalidInputError, match="input 'IMAGE' data-type is 'FP64', but model 'clf' expects 'FP32'"
    ):
        batched_signature().validate(request_of(infer_input("IMAGE", "FP64", (2, 4)), mask))


def test_missing_input() -> None:
    image, _ = good_inputs()

    with pytest.raises(InvalidInputError) as info:
        batched_signature().validate(request_of(image))

    assert info.value.message == (
        "expected 2 inputs but got 1 inputs for model 'clf'. Got input(s) ['IMAGE'], but missing "
        "required input(s) ['MASK']. Please provide all required input(s)."
    )


def test_missing_optional_input_is_fine() -> None:
    config = parse_model_config(
        'name: "o" input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] }, '
        '{ name: "B" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]',
        "o/config.pbtxt",
    )
    sig = ModelSignature.from_config(config)

    valid = sig.validate(request_of(infer_input("A", "INT32", (1,))))

    assert set(valid.feeds) == {"A"}
    with pytest.raises(InvalidInputError) as info:
        sig.validate(request_of(infer_input("B", "INT32", (1,))))
    assert info.value.message == (
        "expected number of inputs between 1 and 2 but got 1 inputs for model 'o'. Got input(s) "
        "['B'], but missing required input(s) ['A']. Please provide all required input(s)."
    )


@pytest.mark.parametrize("batch", [5, 0])
def test_batch_outside_max_batch_size(batch: int) -> None:
    with pytest.raises(InvalidInputError) as info:
        batched_signature().validate(request_of(*good_inputs(batch)))

    message = info.value.message
    assert "batch-size must be <= 4 for 'clf'" in message
    assert f"got {batch} in input 'MASK'" in message  # the last input is checked first


def test_max_batch_size_itself_is_accepted() -> None:
    assert batched_signature().validate(request_of(*good_inputs(4))).batch_size == 4


def test_mismatched_batch_sizes_across_inputs() -> None:
    image, _ = good_inputs(batch=2)
    mask = infer_input("MASK", "INT64", (3, 2))

    with pytest.raises(
        InvalidInputError,
        match=r"input 'IMAGE' batch size does not match other inputs for 'clf' \(2, the others 3\)",
    ):
        batched_signature().validate(request_of(image, mask))


def test_batched_input_without_batch_dim() -> None:
    _, mask = good_inputs()

    with pytest.raises(
        InvalidInputError, match=r"input 'IMAGE' needs a batch dimension.*\[-1, 4\]"
    ):
        batched_signature().validate(request_of(infer_input("IMAGE", "FP32", ()), mask))


@pytest.mark.parametrize("shape", [(2, 5), (2, 4, 1), (2,)])
def test_wrong_item_shape(shape: tuple[int, ...]) -> None:
    _, mask = good_inputs()

    with pytest.raises(InvalidInputError) as info:
        batched_signature().validate(request_of(infer_input("IMAGE", "FP32", shape), mask))

    message = info.value.message
    assert "unexpected shape for input 'IMAGE' for model 'clf'" in message
    got = ",".join(map(str, shape))
    assert f"Expected [-1,4], got [{got}]. NOTE: Setting a non-zero max_batch_size" in message


def test_wrong_shape_unbatched() -> None:
    with pytest.raises(InvalidInputError, match=r"Expected \[3,4\], got \[2,6\]"):
        flat_signature().validate(request_of(infer_input("X", "FP32", (2, 6))))


def test_variable_dims_accept_any_size() -> None:
    config = complete_config(
        mc.ModelConfig(),
        "v",
        [tensor("T", "INT32", (None, None))],
        [tensor("U", "INT32", (None, None))],
        auto_complete=True,
    )
    sig = ModelSignature.from_config(config)

    valid = sig.validate(request_of(infer_input("T", "INT32", (1, 17))))

    assert valid.feeds["T"].shape == (1, 17)


def test_unknown_requested_output() -> None:
    request = request_of(*good_inputs(), outputs=(RequestedOutput("PROBS"), RequestedOutput("X")))

    with pytest.raises(InvalidInputError, match="unexpected inference output 'X' for model 'clf'"):
        batched_signature().validate(request)


# --- reshapes -----------------------------------------------------------------------------------


def test_reshape_applied_to_feeds_unbatched() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)

    valid = flat_signature().validate(request_of(InferInput("X", "FP32", (3, 4), data)))

    feed = valid.feeds["X"]
    assert feed.shape == (2, 6)
    assert feed.ravel().tolist() == list(range(12))


def test_reshape_applied_to_feeds_batched() -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 4)

    valid = batched_reshape_signature().validate(request_of(InferInput("X", "FP32", (2, 4), data)))

    assert valid.feeds["X"].shape == (2, 2, 2)
    assert valid.feeds["X"][1].tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert valid.batch_size == 2


def test_shape_output_undoes_reshape_unbatched() -> None:
    out = np.arange(12, dtype=np.float32).reshape(2, 6)

    shaped = flat_signature().shape_output("Y", out)

    assert shaped.shape == (3, 4)
    assert shaped.ravel().tolist() == list(range(12))


def test_shape_output_undoes_reshape_batched() -> None:
    out = np.arange(6, dtype=np.float32).reshape(2, 1, 3)

    shaped = batched_reshape_signature().shape_output("Y", out)

    assert shaped.shape == (2, 3)
    assert shaped.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_shape_output_without_reshape_is_unchanged() -> None:
    out = np.zeros((2, 3), dtype=np.float32)

    assert batched_signature().shape_output("PROBS", out) is out
