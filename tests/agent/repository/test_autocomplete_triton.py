"""The completed config equals the one Triton reports for the same ONNX model and config.

Each expected config below is written out in full, field by field, as Triton's config endpoint
(`GET /v2/models/M/config`) returns it on a device without GPUs. Sources (Triton's public
repositories; the facts, not their code):

- [mcu] core `src/model_config_utils.cc`: `AutoCompleteBackendFields` (name, backend, platform,
  default_model_filename; runs even with auto-complete off), `NormalizeModelConfig` (version
  policy latest 1; `dynamic_batching.preferred_batch_size` = [max_batch_size] when empty; input
  and output pinned memory on), `NormalizeInstanceGroup` (a missing group is added and named
  after the model; unnamed groups are `<model>_<index>`; KIND_AUTO is KIND_CPU without GPUs),
  `SetDefaultInstanceCount` (2 for a KIND_CPU group of the onnxruntime backend, else 1),
  `ModelConfigToJson` (protobuf JSON with field names as in the .proto, every scalar and repeated
  field printed, sub-messages only when set, 64-bit integers as numbers).
- [ort] onnxruntime_backend `src/onnxruntime.cc`: `AutoCompleteConfig` (skipped when the config
  lists inputs and outputs), `AutoCompleteMaxBatch` (batchable when every tensor's first dim is
  dynamic; max_batch_size 0 becomes the server's default-max-batch-size; an empty
  `dynamic_batching` is added when max_batch_size > 1 and no scheduler is set),
  `AutoCompleteIO` (dims without the batch dim; none left: dims [1] and, when batching, an empty
  reshape; an input list is filled only when empty), `ValidateInputs` (the config's input count
  against the model's: "unable to load model 'M', configuration expects N inputs, model provides
  K"; a scalar model tensor takes dims of ones, fed as rank 0, and an output is reported in the
  config's dims).
- [core] core `src/backend_model.cc`: `default-max-batch-size` defaults to 4;
  `UpdateModelConfig` takes max_batch_size, inputs, outputs and the scheduler from the backend
  and normalises again.
- [doc] server `docs/user_guide/model_configuration.md`: "Auto-Generated Model Configuration",
  "Default Max Batch Size and Dynamic Batcher" (4; dynamic batching set when max batch > 1 and no
  scheduler), "CPU Model Instance" (default count 2 for Onnxruntime, 1 for other backends).
- [qa] server `qa/L0_model_config/autofill_noplatform_success/onnx/{no_config, empty_config,
  no_config_no_batch, cpu_instance}/expected`: Triton's own expected configs for these cases
  (with a GPU for the first two: there the group is KIND_GPU count 1 gpus [0]; here KIND_CPU 2).

GPU-dependent defaults, taken here as on a CPU-only device: KIND_AUTO resolves to KIND_CPU (with
a GPU: KIND_GPU), and a model without instance_group gets one KIND_CPU group of 2 (with GPUs:
KIND_GPU, count 1, `gpus` all GPUs) [mcu]. Triton orders auto-completed inputs and outputs as
ONNX Runtime's unordered map yields them ([qa] accepts any order); here they keep the model's
order.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from agent.backends.onnx import OnnxBackend
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.errors import ModelConfigError
from agent.repository.autocomplete import complete_config
from agent.repository.model_config import config_to_json, parse_model_config
from agent.runtime.daemon import RunningAgent
from tests.models import save_ready, write_model
from tests.server import running_agent

# --- models -------------------------------------------------------------------------------------


def add_sub_model(batch: bool) -> onnx.ModelProto:
    """INPUT0, INPUT1 INT32 [(batch,) 16] -> OUTPUT0 = INT8(a + b), OUTPUT1 = INT8(a - b).

    The model of Triton's own ONNX autofill tests [qa], with or without a batch dimension.
    """
    shape: list[str | int] = ["batch", 16] if batch else [16]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["sum"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["diff"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.INT8),
        helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.INT8),
    ]
    graph = helper.make_graph(
        nodes,
        "add_sub",
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.INT8, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return save_ready(graph)


def argmax_model() -> onnx.ModelProto:
    """SCORES FP32 [batch, 3] -> CLASS INT64 [batch]: an output that is only the batch dim."""
    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["SCORES"], ["CLASS"], axis=1, keepdims=0)],
        "argmax",
        [helper.make_tensor_value_info("SCORES", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("CLASS", TensorProto.INT64, ["batch"])],
    )
    return save_ready(graph)


def scalar_model() -> onnx.ModelProto:
    """A FP32 scalar -> B FP32 scalar (B = A + A): rank-0 tensors, so no batching."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "A"], ["B"])],
        "scalar",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("B", TensorProto.FLOAT, [])],
    )
    return save_ready(graph)


# --- Triton's JSON, field by field ----------------------------------------------------------------


def io(name: str, data_type: str, dims: list[int], *, output: bool = False) -> dict[str, Any]:
    """A ModelInput / ModelOutput as Triton prints it: every scalar and repeated field [mcu]."""
    if output:
        return {
            "name": name,
            "data_type": data_type,
            "dims": dims,
            "label_filename": "",
            "is_shape_tensor": False,
            "is_non_linear_format_io": False,
        }
    return {
        "name": name,
        "data_type": data_type,
        "format": "FORMAT_NONE",
        "dims": dims,
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": False,
        "is_non_linear_format_io": False,
    }


def group(name: str, count: int) -> dict[str, Any]:
    """An instance group on a CPU-only device: KIND_CPU, no GPUs [mcu NormalizeInstanceGroup]."""
    return {
        "name": name,
        "kind": "KIND_CPU",
        "count": count,
        "gpus": [],
        "secondary_devices": [],
        "profile": [],
        "passive": False,
        "host_policy": "",
    }


def dynamic_batching(preferred: list[int], delay_us: int = 0) -> dict[str, Any]:
    return {
        "preferred_batch_size": preferred,
        "max_queue_delay_microseconds": delay_us,
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "priority_queue_policy": {},
    }


def triton_config(name: str, max_batch_size: int, inputs: list[Any], outputs: list[Any]) -> Any:
    """What Triton reports for an ONNX model with every default applied; cases edit a copy."""
    return {
        "name": name,  # [mcu AutoCompleteBackendFields] the model's folder name
        "platform": "onnxruntime_onnx",  # [mcu] from backend onnxruntime (or model.onnx)
        "backend": "onnxruntime",  # [mcu] from platform or the model.onnx file
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},  # [mcu NormalizeModelConfig]
        "max_batch_size": max_batch_size,  # [ort AutoCompleteMaxBatch], 4 by [core]/[doc]
        "input": inputs,  # [ort AutoCompleteIO]
        "output": outputs,
        "batch_input": [],
        "batch_output": [],
        "optimization": {  # [mcu NormalizeModelConfig]: pinned memory on when not set
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": {"enable": True},
            "output_pinned_memory": {"enable": True},
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": False,
        },
        # [mcu NormalizeInstanceGroup + SetDefaultInstanceCount], [doc] "CPU Model Instance"
        "instance_group": [group(name, 2)],
        "default_model_filename": "model.onnx",  # [mcu AutoCompleteBackendFields]
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": [],
        # model_transaction_policy, response_cache, dynamic_batching: unset sub-messages are not
        # printed [mcu ModelConfigToJson]; nothing fills the first two for an ONNX model.
    }


ADD_SUB_IO = (
    [io("INPUT0", "TYPE_INT32", [16]), io("INPUT1", "TYPE_INT32", [16])],
    [io(n, "TYPE_INT8", [16], output=True) for n in ("OUTPUT0", "OUTPUT1")],
)


def add_sub_expected(name: str, max_batch_size: int) -> Any:
    expected = triton_config(name, max_batch_size, *copy.deepcopy(ADD_SUB_IO))
    if max_batch_size > 1:
        # [ort AutoCompleteMaxBatch] adds dynamic_batching, [mcu NormalizeModelConfig] prefers
        # max_batch_size; [qa] no_config / empty_config: preferred_batch_size: 4.
        expected["dynamic_batching"] = dynamic_batching([max_batch_size])
    return expected


FULL_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT8 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT8 dims: [ 16 ] } ]
"""


def case_batch_no_config(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # [qa] no_config: max_batch_size 4, both inputs and outputs, dynamic_batching preferred 4.
    return add_sub_model(batch=True), None, add_sub_expected(name, 4)


def case_batch_empty_config(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # [qa] empty_config: an empty config.pbtxt completes exactly like no config.
    return add_sub_model(batch=True), "", add_sub_expected(name, 4)


def case_batch_max_batch_size_only(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # [ort] no inputs or outputs listed, so the backend completes; max_batch_size 8 is kept and,
    # being > 1 with no scheduler, turns dynamic batching on, preferring 8 [mcu].
    return add_sub_model(batch=True), "max_batch_size: 8", add_sub_expected(name, 8)


def case_batch_inputs_and_batcher(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # Inputs listed, outputs not: [ort] still completes (fills max_batch_size 4 and the outputs);
    # the config's own dynamic_batching is kept and gets preferred_batch_size [4] [mcu].
    text = (
        FULL_IO.split("output", maxsplit=1)[0]
        + 'platform: "onnxruntime_onnx" dynamic_batching { max_queue_delay_microseconds: 100 }'
    )
    expected = add_sub_expected(name, 4)
    expected["dynamic_batching"] = dynamic_batching([4], delay_us=100)
    return add_sub_model(batch=True), text, expected


def case_batch_full_config_cpu_group(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # [qa] cpu_instance: inputs and outputs listed, so [ort] skips auto-complete (no
    # dynamic_batching although max_batch_size is 8); the named KIND_CPU group gets count 2.
    text = f'max_batch_size: 8 {FULL_IO} instance_group {{ name: "cpu_group" kind: KIND_CPU }}'
    expected = add_sub_expected(name, 8)
    del expected["dynamic_batching"]
    expected["instance_group"] = [group("cpu_group", 2)]
    return add_sub_model(batch=True), text, expected


def case_no_batch_cpu_group(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # [qa] no_config_no_batch: fixed shapes keep max_batch_size 0, dims are the full shape, no
    # dynamic_batching; the unnamed group is `<model>_0`, count 2.
    expected = add_sub_expected(name, 0)
    expected["instance_group"] = [group(f"{name}_0", 2)]
    return add_sub_model(batch=False), "instance_group [ { kind: KIND_CPU } ]", expected


def case_no_batch_no_config(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # No group at all: Triton adds one named after the model [mcu], KIND_AUTO -> KIND_CPU, 2.
    return add_sub_model(batch=False), None, add_sub_expected(name, 0)


def case_batch_dim_only_output(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # [ort AutoCompleteIO]: CLASS [batch] has no dims left: dims [1] with an empty reshape.
    inputs = [io("SCORES", "TYPE_FP32", [3])]
    output = io("CLASS", "TYPE_INT64", [1], output=True)
    expected = triton_config(name, 4, inputs, [{**output, "reshape": {"shape": []}}])
    expected["dynamic_batching"] = dynamic_batching([4])
    return argmax_model(), None, expected


def case_batch_full_config_no_max_batch(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # [ort AutoCompleteConfig] inputs and outputs listed: auto-complete is skipped before
    # AutoCompleteMaxBatch, so max_batch_size stays 0 on a batchable model (dims are then the full
    # shapes) and the config's dynamic_batching is kept as written; [mcu NormalizeModelConfig]
    # prefers max_batch_size only when it is > 0, so preferred_batch_size stays empty.
    text = (
        FULL_IO.replace("[ 16 ]", "[ -1, 16 ]")
        + "dynamic_batching { max_queue_delay_microseconds: 100 }"
    )
    inputs, outputs = copy.deepcopy(ADD_SUB_IO)
    for tensor in (*inputs, *outputs):
        tensor["dims"] = [-1, 16]
    expected = triton_config(name, 0, inputs, outputs)
    expected["dynamic_batching"] = dynamic_batching([], delay_us=100)
    return add_sub_model(batch=True), text, expected


def case_no_batch_scalar(name: str) -> tuple[onnx.ModelProto, str | None, Any]:
    # [ort AutoCompleteIO]: a rank-0 tensor has no dims, so it gets dims [1]; the empty reshape
    # is added only when max_batch_size > 0 (without batching it would be an invalid config).
    inputs = [io("A", "TYPE_FP32", [1])]
    outputs = [io("B", "TYPE_FP32", [1], output=True)]
    return scalar_model(), None, triton_config(name, 0, inputs, outputs)


CASES = {
    "batch_no_config": case_batch_no_config,
    "batch_empty_config": case_batch_empty_config,
    "batch_max_batch_size_only": case_batch_max_batch_size_only,
    "batch_inputs_and_batcher": case_batch_inputs_and_batcher,
    "batch_full_config_cpu_group": case_batch_full_config_cpu_group,
    "no_batch_cpu_group": case_no_batch_cpu_group,
    "no_batch_no_config": case_no_batch_no_config,
    "batch_dim_only_output": case_batch_dim_only_output,
    "batch_full_config_no_max_batch": case_batch_full_config_no_max_batch,
    "no_batch_scalar": case_no_batch_scalar,
}


def completed_json(
    tmp_path: Path, name: str, model: onnx.ModelProto, text: str | None, *, auto_complete: bool
) -> dict[str, Any]:
    """Load the ONNX model as the loader does and complete its config."""
    model_dir = write_model(tmp_path, name, model, text)
    config = parse_model_config(text or "", str(model_dir / "config.pbtxt"))
    backend = OnnxBackend(model_dir / "1" / "model.onnx", config, 1)
    try:
        completed = complete_config(
            config, name, backend.inputs, backend.outputs, auto_complete=auto_complete
        )
    finally:
        backend.close()
    return config_to_json(completed)


def assert_same_fields(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    """Field by field, so that a failure names the field (JSON key order is not compared)."""
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert actual[key] == value, key


@pytest.mark.parametrize("case", sorted(CASES))
def test_completed_config_is_tritons(tmp_path: Path, case: str) -> None:
    model, text, expected = CASES[case](case)

    actual = completed_json(tmp_path, case, model, text, auto_complete=True)

    assert_same_fields(actual, expected)


def test_auto_complete_off_still_gets_tritons_server_side_defaults(tmp_path: Path) -> None:
    # `--disable-auto-complete-config`: the backend completes nothing, but the server still
    # fills backend, platform and file name [mcu AutoCompleteBackendFields], normalises
    # (a given dynamic_batching prefers max_batch_size) and adds the instance group [doc].
    text = f"max_batch_size: 8 {FULL_IO} dynamic_batching {{ }}"
    name = "strict"

    actual = completed_json(tmp_path, name, add_sub_model(batch=True), text, auto_complete=False)

    assert_same_fields(actual, add_sub_expected(name, 8))


def test_auto_complete_off_adds_no_batcher(tmp_path: Path) -> None:
    text = f"max_batch_size: 8 {FULL_IO}"
    expected = add_sub_expected("strict", 8)
    del expected["dynamic_batching"]

    actual = completed_json(
        tmp_path, "strict", add_sub_model(batch=True), text, auto_complete=False
    )

    assert_same_fields(actual, expected)


def test_a_partial_input_list_is_refused_as_triton_refuses_it(tmp_path: Path) -> None:
    # [ort] AutoCompleteIO fills only an empty input list; ValidateInputs then counts.
    text = 'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]'

    with pytest.raises(ModelConfigError) as info:
        completed_json(tmp_path, "partial", add_sub_model(batch=True), text, auto_complete=True)

    assert info.value.message == (
        "unable to load model 'partial', configuration expects 1 inputs, model provides 2"
    )


@pytest.mark.parametrize("dims", ["[ 2 ]", "[ 1, 3 ]"])
def test_a_scalar_given_dims_other_than_ones_is_refused_as_triton_refuses_it(
    tmp_path: Path, dims: str
) -> None:
    # [ort ValidateInputs] on a rank-0 model input.
    text = f'input [ {{ name: "A" data_type: TYPE_FP32 dims: {dims} }} ]'
    shown = dims.replace(" ", "")  # Triton's ShapeToString: [1,3]

    with pytest.raises(ModelConfigError) as info:
        completed_json(tmp_path, "scalar", scalar_model(), text, auto_complete=True)

    assert info.value.message == (
        "unable to load model 'scalar', scalar tensor 'A', should only provide 1 in the model "
        f"configuration when the model doesn't support batching. Model configuration provided: "
        f"{shown}."
    )


# --- end to end: the config endpoint of a running agent --------------------------------------


@pytest.fixture(scope="module")
def triton_repo_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("triton_autocomplete") / "models"
    for case, build in CASES.items():
        model, text, _ = build(case)
        write_model(repo, case, model, text)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=0),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        yield agent


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_endpoint_returns_tritons_config(triton_repo_agent: RunningAgent, case: str) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{triton_repo_agent.http_port}")
    try:
        assert client.is_model_ready(case)
        actual = client.get_model_config(case)
    finally:
        client.close()

    assert_same_fields(actual, CASES[case](case)[2])


def test_a_scalar_model_serves_its_dims_of_one(triton_repo_agent: RunningAgent) -> None:
    # [ort]: the request's [1] is fed as a scalar and the scalar result comes back as [1].
    client = httpclient.InferenceServerClient(f"127.0.0.1:{triton_repo_agent.http_port}")
    try:
        a = httpclient.InferInput("A", [1], "FP32")
        a.set_data_from_numpy(np.array([1.5], dtype=np.float32))
        result = client.infer("no_batch_scalar", [a])
    finally:
        client.close()

    b = result.as_numpy("B")
    assert b is not None
    assert b.shape == (1,)
    assert b.tolist() == [3.0]
