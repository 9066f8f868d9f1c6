"""TensorRT auto-complete against a fake engine (TensorRT is not installable here: no GPU).

`FakeTrtEngine` answers the part of TensorRT's Python API (`tensorrt.ICudaEngine`, TensorRT 10) that
`complete_from_engine` reads, with enums whose member names are TensorRT's. Each expected config
or message is Triton's, from tensorrt_backend `src/model_state.cc` (`AutoCompleteConfigHelper`,
`GetMaxSupportedBatchSize`, `GetProfileMaxBatchSize`, `ExtractBatchHintFromIOConfig`,
`GetRefIO`, `InitIODims`, `FixIO`), `src/tensorrt_utils.cc` (`ConvertTrtTypeToConfigDataType`)
and core `src/model_config_utils.cc` (`CheckAllowedModelInput`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from google.protobuf import text_format

from agent.backends.tensorrt.config import complete_from_engine
from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.autocomplete import complete_config
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor
from tests.fakes import (
    FakeTrtDataType,
    FakeTrtEngine,
    FakeTrtImplicitBatchEngine,
    FakeTrtTensor,
    FakeTrtTensorFormat,
    FakeTrtTensorIOMode,
)


def dynamic_engine(*max_batches: int) -> FakeTrtEngine:
    """INPUT0 FP32 [-1, 16] -> OUTPUT0 FP32 [-1, 16]; one profile per max batch."""
    profiles = [((1, 16), (max(1, b // 2), 16), (b, 16)) for b in max_batches]
    return FakeTrtEngine(
        FakeTrtTensor("INPUT0", FakeTrtTensorIOMode.INPUT, (-1, 16), profiles=profiles),
        FakeTrtTensor("OUTPUT0", FakeTrtTensorIOMode.OUTPUT, (-1, 16)),
        profiles=len(max_batches),
    )


def complete(text: str, engine: FakeTrtEngine) -> mc.ModelConfig:
    config = text_format.Parse('platform: "tensorrt_plan" ' + text, mc.ModelConfig())
    return complete_from_engine(config, engine, "trt")


def tensors(
    config: Sequence[mc.ModelInput] | Sequence[mc.ModelOutput],
) -> list[tuple[str, str, list[int], bool]]:
    return [
        (t.name, mc.DataType.Name(t.data_type), list(t.dims), t.HasField("reshape")) for t in config
    ]


def refusal(text: str, engine: FakeTrtEngine) -> str:
    with pytest.raises(ModelConfigError) as caught:
        complete(text, engine)
    return caught.value.message


# --- max_batch_size and the dynamic batcher --------------------------------------------------


def test_fake_engine_no_config_gets_the_profile_max_batch_and_a_batcher() -> None:
    # GetProfileMaxBatchSize: the kMAX shape's first dimension; > 1 with no scheduler: an empty
    # dynamic_batching; InitIODims leaves the batch dimension out.
    config = complete("", dynamic_engine(8))

    assert config.max_batch_size == 8
    assert config.HasField("dynamic_batching")
    assert tensors(config.input) == [("INPUT0", "TYPE_FP32", [16], False)]
    assert tensors(config.output) == [("OUTPUT0", "TYPE_FP32", [16], False)]
    assert not config.input[0].is_shape_tensor
    assert not config.input[0].is_non_linear_format_io


def test_fake_engine_profiles_named_by_instance_groups_set_the_max_batch() -> None:
    # GetProfileIndices: profile 0 when no group names one; else the largest over those named.
    assert complete("", dynamic_engine(4, 16)).max_batch_size == 4
    named = complete('instance_group [ { profile: [ "1" ] } ]', dynamic_engine(4, 16))
    assert named.max_batch_size == 16


def test_fake_engine_smallest_input_max_batch_wins() -> None:
    engine = FakeTrtEngine(
        FakeTrtTensor("A", FakeTrtTensorIOMode.INPUT, (-1, 2), profiles=[((1, 2), (2, 2), (8, 2))]),
        FakeTrtTensor("B", FakeTrtTensorIOMode.INPUT, (-1, 3), profiles=[((1, 3), (2, 3), (6, 3))]),
        FakeTrtTensor("Y", FakeTrtTensorIOMode.OUTPUT, (-1, 2)),
    )

    assert complete("", engine).max_batch_size == 6


def test_fake_engine_max_batch_of_one_adds_no_batcher() -> None:
    config = complete("", dynamic_engine(1))

    assert config.max_batch_size == 1
    assert not config.HasField("dynamic_batching")


def test_fake_engine_keeps_the_configs_scheduler() -> None:
    config = complete(
        "max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 50 }", dynamic_engine(8)
    )

    assert config.max_batch_size == 4
    assert config.dynamic_batching.max_queue_delay_microseconds == 50
    sequence = complete("sequence_batching { }", dynamic_engine(8))
    assert not sequence.HasField("dynamic_batching")


def test_fake_engine_full_rank_dims_hint_no_batching() -> None:
    # Listed dims as long as the engine's shape: "hints that batching is unavailable".
    config = complete('input [ { name: "INPUT0" dims: [ -1, 16 ] } ]', dynamic_engine(8))

    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert tensors(config.input) == [("INPUT0", "TYPE_FP32", [-1, 16], False)]
    assert tensors(config.output) == [("OUTPUT0", "TYPE_FP32", [-1, 16], False)]


def test_fake_engine_dims_without_batch_hint_batching() -> None:
    config = complete('output [ { name: "OUTPUT0" dims: [ 16 ] } ]', dynamic_engine(8))

    assert config.max_batch_size == 8
    assert tensors(config.input) == [("INPUT0", "TYPE_FP32", [16], False)]


def test_fake_engine_implicit_batch_engine_uses_its_max_batch_size() -> None:
    # TensorRT 8 engines: has_implicit_batch_dimension, getMaxBatchSize, shapes without batch.
    engine = FakeTrtImplicitBatchEngine(
        FakeTrtTensor("X", FakeTrtTensorIOMode.INPUT, (3, 4)),
        FakeTrtTensor("Y", FakeTrtTensorIOMode.OUTPUT, (4,), dtype=FakeTrtDataType.HALF),
        max_batch_size=32,
    )

    config = complete("", engine)

    assert config.max_batch_size == 32
    assert tensors(config.input) == [("X", "TYPE_FP32", [3, 4], False)]
    assert tensors(config.output) == [("Y", "TYPE_FP16", [4], False)]


# --- tensors -----------------------------------------------------------------------------------


def test_fake_engine_data_types_map_as_tritons() -> None:
    engine = FakeTrtEngine(
        FakeTrtTensor(
            "I",
            FakeTrtTensorIOMode.INPUT,
            (-1, 1),
            FakeTrtDataType.INT64,
            [((1, 1), (1, 1), (2, 1))],
        ),
        FakeTrtTensor("B", FakeTrtTensorIOMode.OUTPUT, (-1, 1), FakeTrtDataType.BOOL),
        FakeTrtTensor("H", FakeTrtTensorIOMode.OUTPUT, (-1, 1), FakeTrtDataType.BF16),
        FakeTrtTensor(
            "Q", FakeTrtTensorIOMode.OUTPUT, (-1, 1), FakeTrtDataType.FP8
        ),  # no config type
    )

    config = complete("", engine)

    assert [mc.DataType.Name(t.data_type) for t in config.output] == [
        "TYPE_BOOL",
        "TYPE_BF16",
        "TYPE_INVALID",
    ]


def test_fake_engine_batch_only_tensor_gets_dims_one_and_an_empty_reshape() -> None:
    engine = FakeTrtEngine(
        FakeTrtTensor("X", FakeTrtTensorIOMode.INPUT, (-1, 3), profiles=[((1, 3), (2, 3), (4, 3))]),
        FakeTrtTensor("CLASS", FakeTrtTensorIOMode.OUTPUT, (-1,), FakeTrtDataType.INT32),
    )

    config = complete("", engine)

    assert tensors(config.output) == [("CLASS", "TYPE_INT32", [1], True)]
    assert list(config.output[0].reshape.shape) == []


def test_fake_engine_shape_tensor_dims_are_its_length_less_the_batch() -> None:
    # InitIODims for a shape tensor: [len - 1] when batching; profile values give the batch.
    engine = FakeTrtEngine(
        FakeTrtTensor(
            "X",
            FakeTrtTensorIOMode.INPUT,
            (-1, -1, -1),
            profiles=[((1, 1, 1), (2, 4, 4), (8, 8, 8))],
        ),
        FakeTrtTensor(
            "SHAPE",
            FakeTrtTensorIOMode.INPUT,
            (3,),
            FakeTrtDataType.INT32,
            [((1, 1, 1), (4, 4, 4), (6, 8, 8))],
            shape_tensor=True,
        ),
        FakeTrtTensor("Y", FakeTrtTensorIOMode.OUTPUT, (-1, -1, -1)),
    )

    config = complete("", engine)

    assert config.max_batch_size == 6
    shape = config.input[1]
    assert (shape.name, list(shape.dims), shape.is_shape_tensor) == ("SHAPE", [2], True)


def test_fake_engine_listed_tensors_get_what_they_leave_out() -> None:
    # FixIO: data_type and dims filled, flags taken from the engine; the list is not extended.
    engine = FakeTrtEngine(
        FakeTrtTensor(
            "X",
            FakeTrtTensorIOMode.INPUT,
            (-1, 4),
            profiles=[((1, 4), (2, 4), (8, 4))],
            io_format=FakeTrtTensorFormat.CHW4,
        ),
        FakeTrtTensor("Y", FakeTrtTensorIOMode.OUTPUT, (-1, 4)),
        FakeTrtTensor("Z", FakeTrtTensorIOMode.OUTPUT, (-1, 4)),
    )

    config = complete('output [ { name: "Z" } ]', engine)

    assert tensors(config.output) == [("Z", "TYPE_FP32", [4], False)]
    assert config.input[0].is_non_linear_format_io


# --- refusals, in Triton's words ----------------------------------------------------------------


def test_fake_engine_config_max_batch_over_the_engines_is_refused() -> None:
    assert refusal("max_batch_size: 16", dynamic_engine(8)) == (
        "autofill failed for model 'trt': configuration specified max-batch 16 but TensorRT "
        "engine only supports max-batch 8"
    )


def test_fake_engine_invalid_profile_is_refused() -> None:
    assert refusal('instance_group [ { profile: [ "2" ] } ]', dynamic_engine(4, 16)) == (
        "unable to autofill for 'trt', configuration specified invalid profile 2 . Number of "
        "profiles supported by TensorRT engine: 2"
    )


def test_fake_engine_unknown_listed_tensor_is_refused() -> None:
    assert refusal('input [ { name: "NOPE" dims: [ 16 ] } ]', dynamic_engine(8)) == (
        "unexpected inference input 'NOPE', allowed inputs are: INPUT0"
    )


def test_fake_engine_contradicting_batch_hints_are_refused() -> None:
    text = (
        'input [ { name: "INPUT0" dims: [ 16 ] } ] output [ { name: "OUTPUT0" dims: [ -1, 16 ] } ]'
    )

    assert refusal(text, dynamic_engine(8)) == (
        "unable to autofill for 'trt', model tensor configurations are contradicting each other "
        "in terms of whether batching is supported"
    )


def test_fake_engine_batch_hint_on_an_engine_that_cannot_batch_is_refused() -> None:
    engine = FakeTrtEngine(
        FakeTrtTensor("S", FakeTrtTensorIOMode.INPUT, (), profiles=[((), (), ())]),
        FakeTrtTensor("X", FakeTrtTensorIOMode.INPUT, (-1, 4), profiles=[((1, 4), (2, 4), (8, 4))]),
        FakeTrtTensor("Y", FakeTrtTensorIOMode.OUTPUT, (-1, 4)),
    )

    assert refusal('input [ { name: "X" dims: [ 4 ] } ]', engine) == (
        "autofill failed for model 'trt': model tensor shape configuration hints for dynamic "
        "batching but the underlying engine doesn't support batching."
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'input [ { name: "INPUT0" is_shape_tensor: true } ]',
            "'INPUT0' is incorrectly specified as a shape tensor.",
        ),
        (
            'output [ { name: "OUTPUT0" is_non_linear_format_io: true } ]',
            "'OUTPUT0' uses a linear IO format, but 'is_non_linear_format_io' is incorrectly set "
            "to true in the model configuration.",
        ),
    ],
)
def test_fake_engine_wrong_tensor_flags_are_refused(text: str, message: str) -> None:
    assert refusal(text, dynamic_engine(8)) == message


# --- then the server side, as the loader runs it ---------------------------------------------


def test_fake_engine_completed_config_passes_the_servers_completion() -> None:
    declared = complete("", dynamic_engine(8))
    fp32 = datatypes.BY_KSERVE["FP32"]
    # What TensorRTBackend reports for the engine: -1 read as a dynamic dimension.
    inputs = [ModelTensor("INPUT0", fp32, "float32", (None, 16))]
    outputs = [ModelTensor("OUTPUT0", fp32, "float32", (None, 16))]

    completed = complete_config(declared, "trt", inputs, outputs, auto_complete=True)

    assert (completed.platform, completed.backend) == ("tensorrt_plan", "tensorrt")
    assert completed.default_model_filename == "model.plan"
    assert completed.max_batch_size == 8
    assert list(completed.dynamic_batching.preferred_batch_size) == [8]
    assert tensors(completed.input) == [("INPUT0", "TYPE_FP32", [16], False)]


def test_fake_engine_fixed_first_dimension_batches_as_in_triton() -> None:
    # A static engine: its profile's kMAX first dimension (2) is the max batch, and
    # tensorrt_backend CompareDimsSupported accepts the fixed first dimension as the batch one.
    engine = FakeTrtEngine(
        FakeTrtTensor("X", FakeTrtTensorIOMode.INPUT, (2, 6), profiles=[((2, 6), (2, 6), (2, 6))]),
        FakeTrtTensor("Y", FakeTrtTensorIOMode.OUTPUT, (2, 6)),
    )
    declared = complete("", engine)
    fp32 = datatypes.BY_KSERVE["FP32"]

    completed = complete_config(
        declared,
        "trt",
        [ModelTensor("X", fp32, "float32", (2, 6))],
        [ModelTensor("Y", fp32, "float32", (2, 6))],
        auto_complete=True,
    )

    assert completed.max_batch_size == 2
    assert tensors(completed.input) == [("X", "TYPE_FP32", [6], False)]
