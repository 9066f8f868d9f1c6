"""config.pbtxt parsing, Triton-style JSON rendering, and the version policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.layout import select_versions
from agent.repository.model_config import (
    config_from_json,
    config_to_json,
    load_model_config,
    parse_model_config,
)

# Written the way Triton's model configuration documentation shows it.
TRITON_CONFIG = """
# DenseNet, as in Triton's quick start, with most optional sections filled in.
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { latest: { num_versions: 2 } }
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape: { shape: [ 1, 3, 224, 224 ] }
  },
  {
    name: "scale"
    data_type: TYPE_FP32
    dims: [ 1 ]
    reshape: { shape: [ ] }
    optional: true
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape: { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
instance_group [
  {
    count: 2
    kind: KIND_CPU
  },
  {
    count: 1
    kind: KIND_GPU
    gpus: [ 0 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 5000000000
    max_queue_size: 16
  }
  priority_queue_policy {
    key: 1
    value: { max_queue_size: 4 }
  }
}
model_warmup [
  {
    name: "zero_sample"
    batch_size: 4
    count: 2
    inputs {
      key: "data_0"
      value: {
        data_type: TYPE_FP32
        dims: [ 3, 224, 224 ]
        zero_data: true
      }
    }
  }
]
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
response_cache { enable: true }
optimization { execution_accelerators {
  gpu_execution_accelerator : [ {
    name : "tensorrt"
    parameters { key: "precision_mode" value: "FP16" }
    parameters { key: "max_workspace_size_bytes" value: "1073741824" }
  } ]
}}
"""


def triton_config() -> mc.ModelConfig:
    return parse_model_config(TRITON_CONFIG, "densenet_onnx/config.pbtxt")


# --- parsing ------------------------------------------------------------------------------------


def test_parse_top_level_fields() -> None:
    config = triton_config()

    assert config.name == "densenet_onnx"
    assert config.platform == "onnxruntime_onnx"
    assert config.backend == ""
    assert config.max_batch_size == 8
    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    assert config.version_policy.latest.num_versions == 2


def test_parse_inputs_and_outputs() -> None:
    config = triton_config()

    data, scale = config.input
    assert data.name == "data_0"
    assert data.data_type == mc.TYPE_FP32
    assert data.format == mc.ModelInput.FORMAT_NCHW
    assert list(data.dims) == [3, 224, 224]
    assert list(data.reshape.shape) == [1, 3, 224, 224]
    assert scale.HasField("reshape")
    assert list(scale.reshape.shape) == []
    assert scale.optional is True
    assert not data.optional
    (out,) = config.output
    assert out.name == "fc6_1"
    assert list(out.dims) == [1000]
    assert list(out.reshape.shape) == [1, 1000, 1, 1]
    assert out.label_filename == "densenet_labels.txt"


def test_parse_instance_groups() -> None:
    cpu, gpu = triton_config().instance_group

    assert (cpu.count, cpu.kind) == (2, mc.ModelInstanceGroup.KIND_CPU)
    assert (gpu.count, gpu.kind) == (1, mc.ModelInstanceGroup.KIND_GPU)
    assert list(gpu.gpus) == [0]


def test_parse_dynamic_batching() -> None:
    config = triton_config()

    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [4, 8]
    assert batching.max_queue_delay_microseconds == 100
    assert batching.priority_levels == 2
    assert batching.default_priority_level == 1
    policy = batching.default_queue_policy
    assert policy.timeout_action == mc.ModelQueuePolicy.DELAY
    assert policy.default_timeout_microseconds == 5_000_000_000
    assert policy.max_queue_size == 16
    assert batching.priority_queue_policy[1].max_queue_size == 4


def test_parse_warmup_parameters_cache_and_accelerators() -> None:
    config = triton_config()

    (warm,) = config.model_warmup
    assert (warm.name, warm.batch_size, warm.count) == ("zero_sample", 4, 2)
    sample = warm.inputs["data_0"]
    assert sample.data_type == mc.TYPE_FP32
    assert list(sample.dims) == [3, 224, 224]
    assert sample.WhichOneof("input_data_type") == "zero_data"
    assert config.parameters["intra_op_thread_count"].string_value == "2"
    assert config.response_cache.enable is True
    (accel,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accel.name == "tensorrt"
    assert dict(accel.parameters) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": "1073741824",
    }


def test_parse_empty_text_is_an_empty_config() -> None:
    assert parse_model_config("", "c.pbtxt") == mc.ModelConfig()


def test_syntax_error_reports_file_line_and_column() -> None:
    text = 'name: "m"\nmax_batch_size: eight\n'

    with pytest.raises(ModelConfigError) as info:
        parse_model_config(text, "models/m/config.pbtxt")

    message = info.value.message
    assert message.startswith("models/m/config.pbtxt:2:17: ")
    assert "eight" in message
    assert "2:17 :" not in message  # the library's own prefix is not repeated


def test_syntax_error_column_points_at_the_bad_token() -> None:
    text = 'name: "m"\ninput [\n  {\n    name: "x"\n    dims: [ 1, 2 }\n  }\n]\n'

    with pytest.raises(ModelConfigError, match=r"^c\.pbtxt:5:18: "):
        parse_model_config(text, "c.pbtxt")


def test_unknown_field_is_an_error_naming_it() -> None:
    text = 'name: "m"\ninput [\n  {\n    name: "x"\n    data_typ: TYPE_FP32\n  }\n]\n'

    with pytest.raises(ModelConfigError) as info:
        parse_model_config(text, "c.pbtxt")

    assert info.value.message.startswith("c.pbtxt:5:5: ")
    assert '"data_typ"' in info.value.message


def test_unknown_top_level_field() -> None:
    with pytest.raises(ModelConfigError, match=r'^c\.pbtxt:1:1: .*no field named "max_batch"'):
        parse_model_config("max_batch: 4", "c.pbtxt")


def test_unknown_enum_value_is_an_error_naming_it() -> None:
    with pytest.raises(ModelConfigError, match="TYPE_FLOAT32"):
        parse_model_config('input [ { name: "x" data_type: TYPE_FLOAT32 } ]', "c.pbtxt")


def test_two_members_of_a_oneof_are_refused() -> None:
    with pytest.raises(ModelConfigError, match=r'^c\.pbtxt:1:\d+: .*"all".*"latest"'):
        parse_model_config("version_policy { latest { num_versions: 1 } all {} }", "c.pbtxt")


# --- loading from a model directory -------------------------------------------------------------


def test_load_model_config_missing_file_is_none(tmp_path: Path) -> None:
    assert load_model_config(tmp_path) is None


def test_load_model_config_reads_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text(TRITON_CONFIG, encoding="utf-8")

    config = load_model_config(tmp_path)

    assert config == triton_config()


def test_load_model_config_error_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nbogus: 1\n', encoding="utf-8")

    with pytest.raises(ModelConfigError) as info:
        load_model_config(tmp_path)

    assert info.value.message.startswith(f"{path}:2:1: ")
    assert "bogus" in info.value.message


def test_load_model_config_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_bytes(b'name: "\xff\xfe"\n')

    with pytest.raises(ModelConfigError, match="cannot read"):
        load_model_config(tmp_path)


# --- JSON rendering -----------------------------------------------------------------------------


def test_config_to_json_prints_64_bit_ints_as_numbers() -> None:
    doc = config_to_json(triton_config())

    assert doc["input"][0]["dims"] == [3, 224, 224]
    assert doc["input"][0]["reshape"] == {"shape": [1, 3, 224, 224]}
    assert doc["output"][0]["dims"] == [1000]
    batching = doc["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 2
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5_000_000_000
    assert doc["model_warmup"][0]["inputs"]["data_0"]["dims"] == [3, 224, 224]
    # Numbers, never the strings protobuf's own JSON printer makes for 64-bit fields.
    text = json.dumps(doc)
    assert '"max_queue_delay_microseconds": 100' in text
    assert '"dims": [3, 224, 224]' in text


def test_config_to_json_prints_enums_by_name() -> None:
    doc = config_to_json(triton_config())

    assert doc["input"][0]["data_type"] == "TYPE_FP32"
    assert doc["input"][0]["format"] == "FORMAT_NCHW"
    assert doc["input"][1]["format"] == "FORMAT_NONE"
    assert [g["kind"] for g in doc["instance_group"]] == ["KIND_CPU", "KIND_GPU"]
    assert doc["dynamic_batching"]["default_queue_policy"]["timeout_action"] == "DELAY"
    assert doc["optimization"]["priority"] == "PRIORITY_DEFAULT"


def test_config_to_json_keeps_defaults() -> None:
    doc = config_to_json(triton_config())

    assert doc["backend"] == ""
    assert doc["default_model_filename"] == ""
    assert doc["batch_input"] == []
    assert doc["cc_model_filenames"] == {}
    assert doc["input"][0]["is_shape_tensor"] is False
    assert doc["input"][0]["optional"] is False
    assert doc["instance_group"][0]["gpus"] == []
    assert doc["instance_group"][0]["name"] == ""
    assert doc["dynamic_batching"]["preserve_ordering"] is False


def test_config_to_json_maps_and_messages() -> None:
    doc = config_to_json(triton_config())

    assert doc["parameters"] == {"intra_op_thread_count": {"string_value": "2"}}
    assert doc["response_cache"] == {"enable": True}
    assert doc["version_policy"] == {"latest": {"num_versions": 2}}
    assert doc["model_warmup"][0]["inputs"]["data_0"]["zero_data"] is True
    accel = doc["optimization"]["execution_accelerators"]["gpu_execution_accelerator"][0]
    assert accel["parameters"]["precision_mode"] == "FP16"


def test_config_to_json_leaves_out_unset_messages_and_oneof_members() -> None:
    doc = config_to_json(triton_config())

    assert "sequence_batching" not in doc
    assert "ensemble_scheduling" not in doc
    assert "model_transaction_policy" not in doc
    sample = doc["model_warmup"][0]["inputs"]["data_0"]
    assert "random_data" not in sample
    assert "input_data_file" not in sample


def test_config_to_json_of_an_empty_config() -> None:
    doc = config_to_json(mc.ModelConfig())

    assert doc["name"] == ""
    assert doc["max_batch_size"] == 0
    assert doc["input"] == []
    assert "version_policy" not in doc
    assert "dynamic_batching" not in doc


def test_config_to_json_is_serializable() -> None:
    text = json.dumps(config_to_json(triton_config()))

    assert json.loads(text)["name"] == "densenet_onnx"


def test_config_json_round_trip() -> None:
    config = triton_config()

    assert config_from_json(config_to_json(config)) == config


def test_config_json_round_trip_through_text() -> None:
    config = triton_config()

    assert config_from_json(json.loads(json.dumps(config_to_json(config)))) == config


def test_config_from_json_accepts_protobuf_int64_strings() -> None:
    config = config_from_json({"input": [{"name": "x", "dims": ["3", "-1"]}]})

    assert list(config.input[0].dims) == [3, -1]


def test_config_from_json_unknown_field() -> None:
    with pytest.raises(ModelConfigError, match=r"invalid model config JSON.*max_batch"):
        config_from_json({"max_batch": 4})


def test_config_from_json_wrong_type() -> None:
    with pytest.raises(ModelConfigError, match="invalid model config JSON"):
        config_from_json({"max_batch_size": "many"})


# --- version policy -----------------------------------------------------------------------------


def policy(text: str) -> mc.ModelVersionPolicy:
    return parse_model_config(f"version_policy {{ {text} }}", "c.pbtxt").version_policy


def test_default_policy_is_latest_one() -> None:
    assert select_versions(mc.ModelVersionPolicy(), [1, 3, 2]) == [3]


def test_latest_two() -> None:
    assert select_versions(policy("latest { num_versions: 2 }"), [3, 1, 2]) == [2, 3]


def test_latest_zero_means_one() -> None:
    assert select_versions(policy("latest { }"), [1, 2]) == [2]


def test_latest_more_than_available() -> None:
    assert select_versions(policy("latest { num_versions: 5 }"), [2, 1]) == [1, 2]


def test_latest_with_nothing_on_disk() -> None:
    assert select_versions(policy("latest { num_versions: 2 }"), []) == []
    assert select_versions(mc.ModelVersionPolicy(), []) == []


def test_all_versions() -> None:
    assert select_versions(policy("all { }"), [3, 1, 7]) == [1, 3, 7]


def test_specific_versions() -> None:
    assert select_versions(policy("specific { versions: [ 3, 1 ] }"), [1, 2, 3]) == [1, 3]


def test_specific_version_not_on_disk_is_returned() -> None:
    chosen = select_versions(policy("specific { versions: [ 2, 9, 2 ] }"), [1, 2])

    assert chosen == [2, 9]


def test_config_to_json_prints_a_field_newer_than_triton_only_when_set() -> None:
    """Triton 2.51's EnsembleScheduling has no max_inflight_requests: left out while 0."""
    config = mc.ModelConfig(name="e", platform="ensemble")
    config.ensemble_scheduling.step.add(model_name="m", model_version=-1)
    assert "max_inflight_requests" not in config_to_json(config)["ensemble_scheduling"]
    config.ensemble_scheduling.max_inflight_requests = 4
    assert config_to_json(config)["ensemble_scheduling"]["max_inflight_requests"] == 4
