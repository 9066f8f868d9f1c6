"""Triton's config rules: each config Triton refuses is refused here with Triton's wording.

One case per rule: the config.pbtxt text and a piece of the message Triton gives for it. The
config-only rules run through `validate_config` (as the loader runs them, before auto-complete),
the rules on the completed config through `validate_completed`, a config that contradicts the
model through `check_against_model`; the end-to-end test shows a few of them UNAVAILABLE in the
index with their reason while a good model serves.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.ensemble.plan import build_plan
from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.model_rules import check_against_model
from agent.repository.triton_rules import validate_completed
from agent.repository.validation import validate_config, validate_dims
from agent.runtime.demo import mlp_model
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor
from tests.models import write_model
from tests.server import failure_reason, running_agent


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


_X = 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]'
_Y = 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
_ENSEMBLE_IO = (
    'platform: "ensemble" max_batch_size: 8 '
    'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] '
    'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ] '
)
_ONE_STEP = (
    'ensemble_scheduling { step [ { model_name: "a" model_version: -1 '
    'input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } } ] }'
)
_SEQ = "max_batch_size: 8 sequence_batching { "


# Rules that need no model file: the config as written, checked before auto-complete.
BEFORE_COMPLETE: list[tuple[str, str]] = [
    # zero and negative dims (inputs, outputs, reshape)
    (
        'input [ { name: "x" dims: [ 2, 0 ] } ]',
        "model input 'x' dimension must be integer >= 1, or -1 to indicate a variable-size "
        "dimension for m",
    ),
    (
        'output [ { name: "y" dims: [ -3 ] } ]',
        "model output 'y' dimension must be integer >= 1, or -1",
    ),
    (
        'input [ { name: "x" dims: [ 4 ] reshape { shape: [ 0, 4 ] } } ]',
        "model input 'x' reshape dimensions must be integer >= 1, or -1 to indicate a "
        "variable-size dimension for m",
    ),
    # reshape sizes, fixed and variable
    (
        'input [ { name: "x" dims: [ 6 ] reshape { shape: [ 4, 2 ] } } ]',
        "model input 'x' has different size for dims and reshape for m",
    ),
    (
        'output [ { name: "y" dims: [ -1, 4 ] reshape { shape: [ -1, 2, -1 ] } } ]',
        "model output 'y' has different number of variable-size dimensions for dims and reshape",
    ),
    (
        'input [ { name: "x" dims: [ 2, -1, 6 ] reshape { shape: [ 3, -1, 6 ] } } ]',
        "model input 'x' has different size for dims and reshape for m",
    ),
    (
        'input [ { name: "x" dims: [ 4 ] reshape { shape: [ -1 ] } } ]',
        "model input 'x' has different size for dims and reshape",
    ),
    # batch_input / batch_output kinds and source counts
    (
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "c" data_type: TYPE_FP32 '
        'source_input: [ "a", "b" ] } ]',
        "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2 for m",
    ),
    (
        'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "c" data_type: TYPE_FP32 } ]',
        "batch input kind 'BATCH_ITEM_SHAPE' expects 1 source input, got 0",
    ),
    (
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "c" data_type: TYPE_INT64 '
        'source_input: [ "a" ] } ]',
        "batch input data type must be TYPE_INT32 or TYPE_FP32 for m",
    ),
    (
        "batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "
        '[ "y" ] source_input: [ "a", "b" ] } ]',
        "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 2",
    ),
    (
        'batch_output [ { target_name: [ "y", "y" ] source_input: [ "a" ] } ]',
        "target output name 'y' can only be specified once for m",
    ),
    # dynamic batching: preferred sizes, priority levels, preserve_ordering
    (
        "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 4, -1 ] }",
        "dynamic batching preferred size must be positive for m",
    ),
    (
        "max_batch_size: 8 dynamic_batching { priority_levels: 3 }",
        "default priority level must be in range [1, 3] for m",
    ),
    (
        "max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
        "default priority level must be in range [1, 2] for m",
    ),
    (
        "max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 3 value { max_queue_size: 4 } } }",
        "priority queue policy must have priority level in range [1, 2] for m",
    ),
    (
        "max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 0 value { max_queue_size: 4 } } }",
        "priority queue policy must have priority level in range [1, 2] for m",
    ),
    (
        "max_batch_size: 8 dynamic_batching { preserve_ordering: true priority_levels: 2 "
        "default_priority_level: 1 }",
        "Only one priority level is allowed when 'preserve_ordering' is true for m",
    ),
    (
        "max_batch_size: 8 dynamic_batching { preserve_ordering: true default_queue_policy { "
        "timeout_action: DELAY default_timeout_microseconds: 100 } }",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
    ),
    (
        "max_batch_size: 8 dynamic_batching { preserve_ordering: true priority_levels: 1 "
        "default_priority_level: 1 priority_queue_policy { key: 1 value { timeout_action: DELAY "
        "default_timeout_microseconds: 100 } } }",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true",
    ),
    # sequence batching control inputs
    (
        _SEQ + "control_input [ { control [ { kind: CONTROL_SEQUENCE_START "
        "int32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence batching control tensor must have a name for m",
    ),
    (
        _SEQ + 'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
        'int32_false_true: [ 0, 1 ] } ] }, { name: "S" control [ { kind: CONTROL_SEQUENCE_END '
        "int32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence batching control tensor 'S' is specified for multiple control kinds for m",
    ),
    (
        _SEQ + 'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY '
        'int32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: CONTROL_SEQUENCE_READY '
        "int32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence batching specifies multiple CONTROL_SEQUENCE_READY tensors for m",
    ),
    (
        _SEQ + 'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ] }',
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
        "'bool_false_true' for CONTROL_SEQUENCE_START for m",
    ),
    (
        _SEQ + 'control_input [ { name: "E" control [ { kind: CONTROL_SEQUENCE_END '
        "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
        "and 'bool_false_true' for CONTROL_SEQUENCE_END for m",
    ),
    (
        _SEQ + 'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
        "int32_false_true: [ 1 ] } ] } ] }",
        "sequence batching control 'int32_false_true' must have exactly 2 entries for "
        "CONTROL_SEQUENCE_START for m",
    ),
    (
        _SEQ + 'control_input [ { name: "R" control [ { kind: CONTROL_SEQUENCE_READY '
        "bool_false_true: [ false, true, true ] } ] } ] }",
        "sequence batching control 'bool_false_true' must have exactly 2 entries",
    ),
    (
        _SEQ + 'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
        "data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
        "'bool_false_true' for CONTROL_SEQUENCE_CORRID for m",
    ),
    (
        _SEQ + 'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
        "data_type: TYPE_FP32 } ] } ] }",
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are "
        "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
    ),
    (
        _SEQ + "oldest { preferred_batch_size: [ 0 ] } }",
        "sequence batching preferred batch size must be positive for m",
    ),
    (
        _SEQ + "direct { minimum_slot_utilization: 1.5 } }",
        "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
    ),
    (
        _SEQ + "} response_cache { enable: true }",
        "Response Cache does not currently support model m with sequence batching scheduler",
    ),
    (
        "model_transaction_policy { decoupled: true } response_cache { enable: true }",
        "Response Cache does not currently support model m with 'decoupled' transaction policy",
    ),
    # ensemble scheduling where it does not belong, and what an ensemble may not set
    (
        'platform: "onnxruntime_onnx" ' + _ONE_STEP,
        "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
    ),
    (
        'backend: "python" ' + _ONE_STEP,
        "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
    ),
    (
        _ENSEMBLE_IO,
        "ensemble scheduling must be set for ensemble m whose platform is ensemble",
    ),
    (
        _ENSEMBLE_IO + 'backend: "onnxruntime" ' + _ONE_STEP,
        "Ensemble model 'm' must have platform type 'ensemble' and empty backend type",
    ),
    (
        _ENSEMBLE_IO + "instance_group [ { kind: KIND_CPU } ] " + _ONE_STEP,
        "instance group should not be specified for ensemble 'm'",
    ),
    (
        _ENSEMBLE_IO + "optimization { priority: PRIORITY_MAX } " + _ONE_STEP,
        "optimization should not be specified for ensemble 'm'",
    ),
    (
        _ENSEMBLE_IO + 'model_warmup [ { name: "w" batch_size: 1 } ] ' + _ONE_STEP,
        "model_warmup can not be specified for ensemble 'm'",
    ),
    (
        _ENSEMBLE_IO + "ensemble_scheduling { }",
        "must specify 'step' for ensemble 'm'",
    ),
    (
        _ENSEMBLE_IO + 'ensemble_scheduling { step [ { model_name: "a" '
        'output_map { key: "y" value: "OUT" } } ] }',
        "must specify 'input_map' in step 0 of ensemble 'm'",
    ),
    # ensemble data flow: unused inputs and tensors, outputs nothing writes
    (
        'platform: "ensemble" max_batch_size: 8 '
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "SPARE" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ] ' + _ONE_STEP,
        "ensemble input 'SPARE' for ensemble m' is not used",
    ),
    (
        _ENSEMBLE_IO + 'ensemble_scheduling { step [ { model_name: "a" '
        'input_map { key: "x" value: "IN" } output_map [ { key: "y" value: "OUT" }, '
        '{ key: "z" value: "LEFTOVER" } ] } ] }',
        "ensemble tensor 'LEFTOVER' is unused in ensemble 'm'",
    ),
    (
        _ENSEMBLE_IO + 'ensemble_scheduling { step [ { model_name: "a" '
        'input_map [ { key: "x" value: "IN" }, { key: "w" value: "MISSING" } ] '
        'output_map { key: "y" value: "OUT" } } ] }',
        "output 'OUT' for ensemble 'm' is not written: at least one of its depending tensors, "
        "'MISSING', is not connected",
    ),
    (
        _ENSEMBLE_IO + "ensemble_scheduling { step [ "
        '{ model_name: "a" input_map { key: "x" value: "IN" } output_map { key: "y" value: "T" } },'
        '{ model_name: "b" input_map { key: "x" value: "T" } output_map { key: "y" value: "T" } },'
        '{ model_name: "c" input_map { key: "x" value: "T" } output_map { key: "y" value: "OUT" }}'
        " ] }",
        "ensemble tensor 'T' can appear in an output map only once for ensemble 'm' step 1",
    ),
    # model_metrics
    (
        "model_metrics { metric_control [ { histogram_options { buckets: [ 1 ] } } ] }",
        "metric control must specify 'metric_identifier'",
    ),
    (
        "model_metrics { metric_control [ { metric_identifier { } "
        "histogram_options { buckets: [ 1 ] } } ] }",
        "metric identifier must specify non-empty 'family'",
    ),
    (
        'model_metrics { metric_control [ { metric_identifier { family: "nv_inference" } } ] }',
        "metric control must specify 'histogram_options'",
    ),
    (
        'model_metrics { metric_control [ { metric_identifier { family: "nv_inference" } '
        "histogram_options { } } ] }",
        "histogram options must specify non-empty 'buckets'",
    ),
    # instance groups: GPU ids and kinds
    (
        "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
        "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs",
    ),
    (
        'instance_group [ { name: "g" kind: KIND_MODEL gpus: [ 1 ] } ]',
        "instance group g of model m has kind KIND_MODEL but specifies one or more GPUs",
    ),
    (
        "instance_group [ { kind: KIND_GPU gpus: [ -1 ] } ]",
        "instance group m_0 of model m specifies invalid or unsupported gpu id -1",
    ),
    (
        'platform: "onnxruntime_onnx" instance_group [ { kind: KIND_CPU profile: [ "0" ] } ]',
        "instance group m_0 of model m and platform onnxruntime_onnx specifies profile field "
        "which is only supported for TensorRT models",
    ),
    (
        'platform: "tensorrt_plan" instance_group [ { kind: KIND_GPU profile: [ "first" ] } ]',
        "specifies invalid profile first. The field should contain the string representation "
        "of a non-negative integer.",
    ),
]


@pytest.mark.parametrize(("text", "message"), BEFORE_COMPLETE)
def test_triton_refuses_it_before_auto_complete(text: str, message: str) -> None:
    config = _config(text)

    def check() -> None:
        validate_config(config, "m")
        validate_dims(config, "m")  # as the loader runs it for each version

    with pytest.raises(ModelConfigError) as caught:
        check()
    assert message in caught.value.message


# Rules on the completed config (auto-complete has filled max_batch_size, backend and tensors).
AFTER_COMPLETE: list[tuple[str, str]] = [
    (
        'backend: "python" ' + _X + ' output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] '
        "reshape { } } ]",
        "model output 'y' cannot have empty reshape for non-batching model as scalar tensors "
        "are not supported for m",
    ),
    (
        "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 2, 8 ] } " + _X + _Y,
        "dynamic batching preferred size must be <= max batch size for m",
    ),
    (
        "max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: [ 8 ] } } " + _X + _Y,
        "sequence batching preferred batch size must be <= max batch size for m",
    ),
    (
        "max_batch_size: 4 "
        + _X
        + _Y
        + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT32 '
        'source_input: [ "nope" ] } ]',
        "unknown source input name 'nope' for m",
    ),
    (
        "max_batch_size: 4 "
        + _X
        + _Y
        + 'batch_output [ { target_name: [ "z" ] source_input: [ "x" ] } ]',
        "unknown target output name 'z' for m",
    ),
    (
        'platform: "onnxruntime_onnx" backend: "onnxruntime" '
        + 'input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 4 ] } ] '
        + _Y,
        "model input NHWC/NCHW require 3 dims for m",
    ),
    (
        'platform: "onnxruntime_onnx" backend: "onnxruntime" '
        + 'input [ { name: "x" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ] '
        + _Y,
        "shape tensors are only supported for TensorRT platform for m",
    ),
    (
        'platform: "onnxruntime_onnx" backend: "onnxruntime" '
        + _X
        + 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] is_non_linear_format_io: true } ]',
        "Non-linear IO format is only supported for the TensorRT platform for m",
    ),
    (
        'platform: "tensorrt_plan" backend: "tensorrt" '
        + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] is_non_linear_format_io: true } ] '
        + _Y,
        "Non-linear IO format input requires 3 dims for m",
    ),
    (
        'platform: "onnxruntime_onnx" backend: "onnxruntime" '
        "model_transaction_policy { decoupled: true } " + _X + _Y,
        "the 'onnxruntime' backend does not support the 'decoupled' model transaction policy",
    ),
]


@pytest.mark.parametrize(("text", "message"), AFTER_COMPLETE)
def test_triton_refuses_it_once_the_config_is_complete(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        validate_completed(_config(text), "m")
    assert message in caught.value.message


def test_decoupled_is_accepted_on_the_python_backend() -> None:
    config = _config('backend: "python" model_transaction_policy { decoupled: true } ' + _X + _Y)
    validate_completed(config, "m")
    validate_config(config, "m")


@pytest.mark.parametrize(
    ("text", "gpus", "message"),
    [
        (
            "instance_group [ { kind: KIND_GPU } ]",
            (),
            "instance group m_0 of model m has kind KIND_GPU but server does not support GPUs",
        ),
        (
            'instance_group [ { name: "g" kind: KIND_GPU gpus: [ 0, 3 ] } ]',
            (0, 1),
            "instance group g of model m specifies invalid or unsupported gpu id 3",
        ),
    ],
)
def test_gpu_instance_groups_need_gpus_the_agent_has(
    text: str, gpus: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ModelConfigError) as caught:
        validate_completed(_config(text + _X + _Y), "m", gpus=gpus)
    assert message in caught.value.message
    validate_completed(_config(text + _X + _Y), "m", gpus=None)  # unknown: not checked


def _tensor(name: str, config_type: str = "TYPE_FP32") -> ModelTensor:
    return ModelTensor(name, datatypes.from_config(config_type), config_type, (None, 4))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'input [ { name: "a" }, { name: "nope" } ]',
            "unexpected inference input 'nope', allowed inputs are: a, b for m",
        ),
        (
            'output [ { name: "zz" } ]',
            "unexpected inference output 'zz', allowed outputs are: y for m",
        ),
        (
            'input [ { name: "a" }, { name: "b" data_type: TYPE_INT32 } ]',
            "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'b', "
            "model provides TYPE_FP32",
        ),
        # onnxruntime_backend ValidateInputs: the count first, whatever the names.
        (
            'input [ { name: "b" } ]',
            "unable to load model 'm', configuration expects 1 inputs, model provides 2",
        ),
        (
            'input [ { name: "a" }, { name: "b" }, { name: "c" } ]',
            "unable to load model 'm', configuration expects 3 inputs, model provides 2",
        ),
        (
            'input [ { name: "a" } ] batch_input [ { kind: BATCH_ELEMENT_COUNT '
            'target_name: "b" data_type: TYPE_FP32 source_input: "a" } ] '
            'sequence_batching { control_input [ { name: "s" control [ { kind: '
            "CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ] }",
            "unable to load model 'm', configuration expects 3 inputs, model provides 2",
        ),
    ],
)
def test_a_partial_tensor_list_that_contradicts_the_model_is_refused(
    text: str, message: str
) -> None:
    with pytest.raises(ModelConfigError) as caught:
        check_against_model(_config(text), "m", [_tensor("a"), _tensor("b")], [_tensor("y")])
    assert message in caught.value.message
    check_against_model(
        _config('input [ { name: "b" }, { name: "a" } ]'), "m", [_tensor("a"), _tensor("b")], []
    )
    # A partial output list is fine; the Python backend's inputs come from its own config.
    check_against_model(_config('output [ { name: "y" } ]'), "m", [_tensor("a")], [_tensor("y")])
    check_against_model(
        _config('backend: "python" input [ { name: "b" } ]'), "m", [_tensor("a"), _tensor("b")], []
    )


# Triton core ModelRepositoryManager::CheckNode: a step's model_version other than -1 must be
# loaded: "ensemble 'E' depends on 'M' whose required version N is not loaded."
def _step_version(version: int) -> mc.ModelConfig:
    return _config(_ENSEMBLE_IO + 'name: "e" ' + _ONE_STEP.replace("-1", str(version)))


def test_an_ensemble_step_version_no_version_policy_serves_is_refused() -> None:
    composing = _config(
        'name: "a" max_batch_size: 8 version_policy { specific { versions: [ 1, 2 ] } } ' + _X + _Y
    )
    with pytest.raises(ModelConfigError) as caught:
        build_plan(_step_version(3), {"a": composing}.get)
    assert (
        caught.value.message
        == "ensemble 'e' depends on 'a' whose required version 3 is not loaded."
    )
    build_plan(_step_version(2), {"a": composing}.get)


@pytest.mark.parametrize(
    ("policy", "loaded", "refused", "accepted"),
    [
        ("", (3,), 2, 3),  # no policy: latest 1, the newest of versions 1..3
        ("version_policy { latest { num_versions: 2 } }", (2, 3), 1, 2),
        ("version_policy { all { } }", (1, 2, 3), 4, 1),
    ],
)
def test_an_ensemble_step_version_the_model_has_not_loaded_is_refused(
    policy: str, loaded: tuple[int, ...], refused: int, accepted: int
) -> None:
    composing = _config(f'name: "a" max_batch_size: 8 {policy} {_X} {_Y}')
    versions = {"a": loaded}.get
    with pytest.raises(ModelConfigError) as caught:
        build_plan(_step_version(refused), {"a": composing}.get, versions)
    assert caught.value.message == (
        f"ensemble 'e' depends on 'a' whose required version {refused} is not loaded."
    )
    build_plan(_step_version(accepted), {"a": composing}.get, versions)
    build_plan(_step_version(-1), {"a": composing}.get, versions)


@pytest.mark.parametrize(
    "text",
    [
        "",
        _ENSEMBLE_IO + _ONE_STEP,
        "max_batch_size: 8 dynamic_batching { preserve_ordering: true priority_levels: 1 "
        "default_priority_level: 1 default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 100 } }",
        _SEQ + 'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
        'fp32_false_true: [ 0, 1 ] } ] }, { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
        "data_type: TYPE_STRING } ] } ] oldest { preferred_batch_size: [ 4 ] } }",
        'input [ { name: "x" dims: [ 2, -1, 6 ] reshape { shape: [ 2, -1, 2, 3 ] } } ]',
        'max_batch_size: 8 input [ { name: "x" dims: [ 1 ] reshape { } } ]',
        "instance_group [ { kind: KIND_GPU gpus: [ 0 ] }, { kind: KIND_CPU } ]",
        'model_metrics { metric_control [ { metric_identifier { family: "f" } '
        "histogram_options { buckets: [ 1, 2 ] } } ] }",
    ],
)
def test_configs_triton_accepts_pass(text: str) -> None:
    validate_config(_config(text), "m")


# End to end: a few of Triton's refusals, each UNAVAILABLE with its reason, next to a good model.
E2E: dict[str, tuple[str, str]] = {
    "preserve_with_priorities": (
        "max_batch_size: 8 dynamic_batching { preserve_ordering: true priority_levels: 2 "
        "default_priority_level: 1 }",
        "Only one priority level is allowed when 'preserve_ordering' is true",
    ),
    "scheduling_not_ensemble": (
        _ONE_STEP,
        "ensemble scheduling cannot be set for model 'scheduling_not_ensemble'",
    ),
    "cpu_group_with_gpus": (
        "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
        "has kind KIND_CPU but specifies one or more GPUs",
    ),
    "unknown_input": (
        'input [ { name: "NOPE" data_type: TYPE_FP32 dims: [ 64 ] } ]',
        "unexpected inference input 'NOPE', allowed inputs are: INPUT0",
    ),
    "onnx_decoupled": (
        "model_transaction_policy { decoupled: true }",
        "does not support the 'decoupled' model transaction policy",
    ),
    "batch_input_two_sources": (
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 '
        'source_input: [ "INPUT0", "INPUT0" ] } ]',
        "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2",
    ),
}


def test_triton_refusals_fail_their_model_and_the_good_one_serves(tmp_path: Path) -> None:
    model = mlp_model()
    write_model(tmp_path, "good", model)
    for name, (config, _) in E2E.items():
        write_model(tmp_path, name, model)
        (tmp_path / name / "config.pbtxt").write_text(config)
    # Versions 1 and 2 under the default policy (latest 1): only 2 is loaded.
    write_model(tmp_path, "two", model, versions=(1, 2))
    for name, version in (("ensemble_v1", 1), ("ensemble_v2", 2)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(
            f'platform: "ensemble" max_batch_size: 4 '
            'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 64 ] } ] '
            'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 10 ] } ] '
            f'ensemble_scheduling {{ step [ {{ model_name: "two" model_version: {version} '
            'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } '
            "} ] }"
        )
    settings = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=tmp_path, exit_on_error=False, load_models=("*",)),
    )
    with running_agent(settings) as agent:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
        index = {row["name"]: row for row in client.get_model_repository_index()}
        for name, (_, reason) in E2E.items():
            assert not client.is_model_ready(name)
            assert reason in failure_reason(client, name), name
        assert index["good"]["state"] == "READY"
        assert index["ensemble_v2"]["state"] == "READY"
        assert index["ensemble_v1"]["state"] == "UNAVAILABLE"
        assert index["ensemble_v1"]["reason"] == (
            "Invalid argument: "
            "ensemble 'ensemble_v1' depends on 'two' whose required version 1 is not loaded."
        )
        data = httpclient.InferInput("INPUT0", [2, 64], "FP32")
        data.set_data_from_numpy(np.full((2, 64), 0.25, np.float32))
        out = client.infer("good", [data]).as_numpy("OUTPUT0")
        assert out is not None
        assert out.shape == (2, 10)
