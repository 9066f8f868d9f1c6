"""Completing and checking a config against the tensors a model declares."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.autocomplete import complete_config
from agent.repository.model_config import parse_model_config
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor


def tensor(name: str, kserve: str, shape: tuple[int | None, ...]) -> ModelTensor:
    dt = datatypes.BY_KSERVE[kserve]
    return ModelTensor(name, dt, dt.onnx, shape)


# A model with a dynamic batch dimension: INPUT0 FP32 [?, 4], INPUT1 INT64 [?, 2, ?] → OUTPUT0.
BATCHING_INPUTS = (tensor("INPUT0", "FP32", (None, 4)), tensor("INPUT1", "INT64", (None, 2, None)))
BATCHING_OUTPUTS = (tensor("OUTPUT0", "FP32", (None, 3)),)

# A model with a fixed first dimension: X FP32 [2, 6] → Y FP32 [2, 6].
FIXED_INPUTS = (tensor("X", "FP32", (2, 6)),)
FIXED_OUTPUTS = (tensor("Y", "FP32", (2, 6)),)


def config_of(text: str) -> mc.ModelConfig:
    return parse_model_config(text, "config.pbtxt")


def complete(
    text: str,
    inputs: Sequence[ModelTensor] = BATCHING_INPUTS,
    outputs: Sequence[ModelTensor] = BATCHING_OUTPUTS,
    *,
    auto_complete: bool = True,
    name: str = "m",
) -> mc.ModelConfig:
    return complete_config(config_of(text), name, inputs, outputs, auto_complete=auto_complete)


# --- auto-complete ------------------------------------------------------------------------------


def test_empty_config_is_completed() -> None:
    config = complete("")

    assert config.name == "m"
    assert config.platform == "onnxruntime_onnx"
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 4
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", mc.TYPE_FP32, [4]),
        ("INPUT1", mc.TYPE_INT64, [2, -1]),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("OUTPUT0", mc.TYPE_FP32, [3]),
    ]


def test_completed_defaults_version_policy_and_instance_group() -> None:
    config = complete("")

    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    assert config.version_policy.latest.num_versions == 1
    # Triton: the group it adds is named after the model; 2 CPU instances for onnxruntime.
    (group,) = config.instance_group
    assert group.name == "m"
    assert group.count == 2
    assert group.kind == mc.ModelInstanceGroup.KIND_CPU


def test_instance_group_gaps_are_filled() -> None:
    config = complete(
        'instance_group [ { kind: KIND_AUTO }, { name: "gpu" count: 3 kind: KIND_GPU } ]'
    )

    first, second = config.instance_group
    assert (first.name, first.count, first.kind) == ("m_0", 2, mc.ModelInstanceGroup.KIND_CPU)
    assert (second.name, second.count, second.kind) == ("gpu", 3, mc.ModelInstanceGroup.KIND_GPU)


def test_config_values_are_kept() -> None:
    config = complete(
        'platform: "onnxruntime_onnx" max_batch_size: 16 '
        "version_policy { all { } } "
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" } ]'
    )

    assert config.max_batch_size == 16
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    assert config.backend == "onnxruntime"
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]


def test_completion_does_not_change_the_given_config() -> None:
    original = config_of("")

    complete_config(original, "m", BATCHING_INPUTS, BATCHING_OUTPUTS, auto_complete=True)

    assert original == mc.ModelConfig()


def test_fixed_first_dim_gets_max_batch_size_zero() -> None:
    config = complete("", FIXED_INPUTS, FIXED_OUTPUTS)

    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [2, 6]
    assert list(config.output[0].dims) == [2, 6]


def test_one_fixed_output_disables_batching() -> None:
    outputs = (tensor("OUTPUT0", "FP32", (1, 3)),)

    config = complete("", BATCHING_INPUTS, outputs)

    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [-1, 4]


def test_inputs_and_outputs_listed_keep_max_batch_size_zero() -> None:
    # onnxruntime_backend AutoCompleteConfig returns before AutoCompleteMaxBatch when the config
    # lists inputs and outputs: max_batch_size stays 0 and no dynamic_batching is added, so the
    # listed dims are the full shapes.
    config = complete(
        'input [ { name: "INPUT0" dims: [ -1, 4 ] }, { name: "INPUT1" dims: [ -1, 2, -1 ] } ] '
        'output [ { name: "OUTPUT0" dims: [ -1, 3 ] } ]'
    )

    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, 4]
    assert list(config.input[1].dims) == [-1, 2, -1]
    assert config.input[0].data_type == mc.TYPE_FP32


def test_inputs_and_outputs_listed_without_batch_dim_and_no_max_batch_size_are_refused() -> None:
    # Triton leaves max_batch_size 0 here too, so the dims without the batch dimension contradict
    # the model (onnxruntime_backend CompareDimsSupported refuses the config).
    text = (
        'input [ { name: "INPUT0" dims: [ 4 ] }, { name: "INPUT1" dims: [ 2, -1 ] } ] '
        'output [ { name: "OUTPUT0" dims: [ 3 ] } ]'
    )

    with pytest.raises(ModelConfigError) as info:
        complete(text)

    assert info.value.message == (
        "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,4]) but the model "
        "configuration specifies 1 dimensions (shape [4])"
    )


def test_a_partial_input_list_is_refused() -> None:
    # onnxruntime_backend: AutoCompleteIO fills only an empty input list, then ValidateInputs
    # compares the counts: "unable to load model '<m>', configuration expects <n> inputs, model
    # provides <k>".
    with pytest.raises(ModelConfigError) as info:
        complete('input [ { name: "INPUT0" } ]')

    assert info.value.message == (
        "unable to load model 'm', configuration expects 1 inputs, model provides 2"
    )


def test_declared_outputs_are_a_subset() -> None:
    outputs = (*BATCHING_OUTPUTS, tensor("OUTPUT1", "INT32", (None,)))

    config = complete('output [ { name: "OUTPUT1" } ]', BATCHING_INPUTS, outputs)

    # Only the batch dimension: Triton's ONNX Runtime backend writes dims [1] and an empty reshape.
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("OUTPUT1", mc.TYPE_INT32, [1]),
    ]
    assert config.output[0].HasField("reshape")
    assert list(config.output[0].reshape.shape) == []


def test_every_datatype_is_completed() -> None:
    inputs = [tensor(f"IN_{t.kserve}", t.kserve, (None, 3)) for t in datatypes.BY_KSERVE.values()]

    config = complete("", inputs, BATCHING_OUTPUTS)

    assert [mc.DataType.Name(i.data_type) for i in config.input] == [
        t.config for t in datatypes.BY_KSERVE.values()
    ]


# --- contradictions -----------------------------------------------------------------------------


def test_contradicting_dtype_names_both_types() -> None:
    with pytest.raises(ModelConfigError) as info:
        complete('input [ { name: "INPUT0" data_type: TYPE_INT32 }, { name: "INPUT1" } ]')

    message = info.value.message
    assert "input 'INPUT0'" in message
    assert "TYPE_INT32" in message
    assert "TYPE_FP32" in message


def test_contradicting_output_dtype() -> None:
    with pytest.raises(ModelConfigError, match=r"output 'OUTPUT0'.*TYPE_FP16.*TYPE_FP32"):
        complete('output [ { name: "OUTPUT0" data_type: TYPE_FP16 } ]')


@pytest.mark.parametrize(
    "dims",
    [
        "[ 5 ]",  # fixed dimension differs
        "[ 4, 1 ]",  # rank differs
        "[ -1, 4 ]",  # batch dimension included while max_batch_size > 0
    ],
)
def test_contradicting_dims(dims: str) -> None:
    text = f'max_batch_size: 8 input [ {{ name: "INPUT0" dims: {dims} }}, {{ name: "INPUT1" }} ]'

    with pytest.raises(ModelConfigError) as info:
        complete(text)

    # onnxruntime_backend CompareDimsSupported.
    full = "[-1," + dims.strip("[ ]").replace(" ", "") + "]"
    assert info.value.message == (
        "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,4]) but the model "
        f"configuration specifies {full.count(',') + 1} dimensions (an initial batch dimension "
        "because max_batch_size > 0 followed by the explicit tensor shape, making complete shape "
        f"{full})"
    )


def test_dims_with_wildcards_are_compatible() -> None:
    config = complete('input [ { name: "INPUT1" dims: [ -1, 7 ] }, { name: "INPUT0" } ]')

    assert list(config.input[0].dims) == [-1, 7]


def test_unknown_config_input() -> None:
    with pytest.raises(ModelConfigError) as info:
        complete('input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" } ]')

    message = info.value.message
    assert "config input 'IMAGE' is not an input of the model" in message
    assert "INPUT0, INPUT1" in message


def test_unknown_config_output() -> None:
    with pytest.raises(ModelConfigError, match="config output 'PROBS' is not an output"):
        complete('output [ { name: "PROBS" } ]')


def test_name_mismatch() -> None:
    with pytest.raises(ModelConfigError, match=r"config name 'other' does not match .* 'm'"):
        complete('name: "other"')


def test_matching_name_is_fine() -> None:
    assert complete('name: "m"').name == "m"


@pytest.mark.parametrize(
    "text",
    [
        'platform: "pytorch_libtorch"',
        'platform: "tensorrt_plan" backend: "onnxruntime"',
        'backend: "pytorch"',
        'platform: "onnxruntime_onnx" backend: "python"',
    ],
)
def test_unsupported_platform(text: str) -> None:
    with pytest.raises(ModelConfigError, match="is not supported"):
        complete(text)


def test_backend_alone_gets_the_platform() -> None:
    config = complete('backend: "onnxruntime"')

    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")


def test_negative_max_batch_size() -> None:
    with pytest.raises(ModelConfigError, match="max_batch_size must be >= 0"):
        complete("max_batch_size: -1")


# onnxruntime_backend AutoCompleteMaxBatch, when it runs (inputs or outputs not listed).
AUTOFILL_NO_BATCHING = (
    "autofill failed for model 'm': model does not support batching while non-zero "
    "max_batch_size is specified"
)


def test_max_batch_size_without_dynamic_batch_dim_is_refused() -> None:
    with pytest.raises(ModelConfigError) as info:
        complete("max_batch_size: 8", FIXED_INPUTS, FIXED_OUTPUTS)

    assert info.value.message == AUTOFILL_NO_BATCHING


def test_max_batch_size_with_a_scalar_model_tensor_is_refused() -> None:
    inputs = (tensor("S", "FP32", ()),)

    with pytest.raises(ModelConfigError) as info:
        complete("max_batch_size: 2", inputs, BATCHING_OUTPUTS)

    assert info.value.message == AUTOFILL_NO_BATCHING


def test_max_batch_size_on_a_listed_model_that_cannot_batch_is_refused() -> None:
    # Auto-complete skipped (both lists given): the refusal names the tensor at fault.
    text = (
        'max_batch_size: 8 input [ { name: "X" dims: [ 6 ] } ] output [ { name: "Y" dims: [ 6 ] } ]'
    )

    with pytest.raises(ModelConfigError) as info:
        complete(text, FIXED_INPUTS, FIXED_OUTPUTS)

    assert "'X' has no dynamic batch dimension (shape [2, 6])" in info.value.message


def test_unsupported_model_type() -> None:
    inputs = (ModelTensor("C", None, "tensor(complex64)", (None, 2)),)

    with pytest.raises(ModelConfigError, match=r"input 'C'.*tensor\(complex64\) is not supported"):
        complete("", inputs, BATCHING_OUTPUTS)


# --- reshape ------------------------------------------------------------------------------------


def test_reshape_checked_against_model_shape() -> None:
    config = complete(
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 3, 4 ] reshape: { shape: [ 2, 6 ] } } ]',
        FIXED_INPUTS,
        FIXED_OUTPUTS,
    )

    assert list(config.input[0].dims) == [3, 4]
    assert list(config.input[0].reshape.shape) == [2, 6]


def test_reshape_contradicting_model_shape() -> None:
    text = 'input [ { name: "X" dims: [ 12 ] reshape: { shape: [ 3, 4 ] } } ]'

    with pytest.raises(ModelConfigError) as info:
        complete(text, FIXED_INPUTS, FIXED_OUTPUTS)

    message = info.value.message
    assert "specifies 2 dimensions (shape [3,4])" in message
    assert "the model expects 2 dimensions (shape [2,6])" in message


def test_reshape_with_batching_excludes_batch_dim() -> None:
    inputs = (tensor("X", "FP32", (None, 1, 4)),)
    outputs = (tensor("Y", "FP32", (None, 4)),)

    config = complete(
        'input [ { name: "X" dims: [ 4 ] reshape: { shape: [ 1, 4 ] } } ]', inputs, outputs
    )

    assert config.max_batch_size == 4
    assert list(config.input[0].dims) == [4]


def test_reshape_with_a_different_element_count_than_dims_is_refused() -> None:
    text = 'input [ { name: "X" dims: [ 3, 4 ] reshape: { shape: [ 2, 5 ] } } ]'
    inputs = (tensor("X", "FP32", (2, 5)),)
    outputs = (tensor("Y", "FP32", (2, 5)),)

    with pytest.raises(ModelConfigError, match="reshape"):
        complete(text, inputs, outputs)


# --- strict mode (auto_complete=False) ----------------------------------------------------------


STRICT_FULL = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
input { name: "INPUT1" data_type: TYPE_INT64 dims: [ 2, -1 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }
"""


def test_strict_complete_config_is_accepted() -> None:
    config = complete(STRICT_FULL, auto_complete=False)

    assert config.max_batch_size == 8
    assert config.name == "m"
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_strict_still_fills_backend_fields() -> None:
    # Triton core fills backend, platform and model file name even with auto-complete off.
    text = STRICT_FULL.replace('platform: "onnxruntime_onnx"', "")
    assert "platform" not in text

    config = complete(text, auto_complete=False)

    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert config.default_model_filename == "model.onnx"


def test_strict_refuses_missing_input() -> None:
    text = STRICT_FULL.replace('input { name: "INPUT1" data_type: TYPE_INT64 dims: [ 2, -1 ] }', "")
    assert "INPUT1" not in text

    with pytest.raises(ModelConfigError) as info:
        complete(text, auto_complete=False)

    # onnxruntime_backend ValidateInputs, with or without auto-complete.
    assert info.value.message == (
        "unable to load model 'm', configuration expects 1 inputs, model provides 2"
    )


def test_strict_refuses_missing_outputs() -> None:
    text = STRICT_FULL.replace('output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] }', "")
    assert "OUTPUT0" not in text

    # Triton has no output count check (it would serve a model that answers nothing): refused
    # here, in the words of its input count check.
    with pytest.raises(ModelConfigError) as info:
        complete(text, auto_complete=False)

    assert info.value.message.startswith(
        "unable to load model 'm', configuration expects 0 outputs, model provides 1"
    )
    assert "'OUTPUT0'" in info.value.message


def test_strict_refuses_missing_data_type() -> None:
    text = STRICT_FULL.replace('name: "INPUT0" data_type: TYPE_FP32', 'name: "INPUT0"')

    with pytest.raises(ModelConfigError) as info:
        complete(text, auto_complete=False)

    # Triton core ValidateIOShape.
    assert info.value.message == "model input 'INPUT0' must specify 'data_type' for m"


def test_strict_refuses_missing_dims() -> None:
    text = STRICT_FULL.replace("TYPE_FP32 dims: [ 3 ]", "TYPE_FP32")

    with pytest.raises(ModelConfigError) as info:
        complete(text, auto_complete=False)

    assert info.value.message == "model output 'OUTPUT0' must specify 'dims' for m"


def test_strict_does_not_fill_max_batch_size() -> None:
    text = STRICT_FULL.replace("max_batch_size: 8", "")

    with pytest.raises(ModelConfigError, match=r"expects 2 dimensions \(shape \[-1,4\]\)"):
        complete(text, auto_complete=False)


def test_strict_still_checks_dtype() -> None:
    text = STRICT_FULL.replace("TYPE_INT64", "TYPE_INT32")

    with pytest.raises(ModelConfigError, match=r"TYPE_INT32.*TYPE_INT64"):
        complete(text, auto_complete=False)
