"""One bad model config fails that model with its reason, never the agent.

The agent starts on a repository holding one good model and one model for each kind of broken
config.pbtxt; the good one serves through tritonclient, each broken one is UNAVAILABLE in the
index with a reason that names the problem, and the agent keeps answering.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.demo import mlp_model
from tests.models import write_model
from tests.server import running_agent

# model name -> (config.pbtxt, a piece of the reason the index must give)
BROKEN: dict[str, tuple[str, str]] = {
    "negative_batch": ("max_batch_size: -2", "max_batch_size -2 is not in 0.."),
    "absurd_batch": ("max_batch_size: 2000000000", "max_batch_size 2000000000 is not in 0.."),
    "unknown_enum": (
        'input [ { name: "INPUT0" data_type: TYPE_NOPE dims: [ 64 ] } ]',
        'Enum type "inference.DataType" has no value named TYPE_NOPE',
    ),
    "unknown_field": ("max_batch_sizes: 4", 'no field named "max_batch_sizes"'),
    "syntax_error": ("max_batch_size: {{", "Couldn't parse integer"),
    "not_text": ("\x00\xff garbage", "config.pbtxt"),
    "zero_dim": (
        'max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 0 ] } ]',
        "dimension must be integer >= 1, or -1 to indicate a variable-size dimension",
    ),
    "negative_dim": (
        'max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -7 ] } ]',
        "variable-size dimension for negative_dim",
    ),
    "reshape_mismatch": (
        'max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] '
        "reshape: { shape: [ 7, 9 ] } } ]",
        "model input 'INPUT0' has different size for dims and reshape for reshape_mismatch",
    ),
    "nameless_input": (
        "max_batch_size: 8\ninput [ { data_type: TYPE_FP32 dims: [ 64 ] } ]",
        "input 0 has no name",
    ),
    "duplicate_input": (
        'max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] }, '
        '{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]',
        "input 'INPUT0' is declared twice",
    ),
    "unknown_output": (
        'max_batch_size: 8\noutput [ { name: "NOPE" data_type: TYPE_FP32 dims: [ 10 ] } ]',
        "unexpected inference output 'NOPE', allowed outputs are: OUTPUT0",
    ),
    "wrong_type": (
        'max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 64 ] } ]',
        "INPUT0",
    ),
    "misnamed": ('name: "other"', "config name 'other' does not match the model directory"),
    "negative_instances": (
        "instance_group [ { count: -3 kind: KIND_CPU } ]",
        "instance_group 0 count -3 is not in 0..",
    ),
    "absurd_instances": (
        "instance_group [ { count: 100000 kind: KIND_CPU } ]",
        "instance_group 0 count 100000 is not in 0..",
    ),
    "negative_version": (
        "version_policy: { specific: { versions: [ -1 ] } }",
        "specific versions [-1] are not positive numbers",
    ),
    "negative_queue_delay": (
        "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: -5 }",
        "Value out of range: -5",
    ),
    "preferred_over_max": (
        "max_batch_size: 4\ndynamic_batching { preferred_batch_size: [ 8 ] }",
        "dynamic batching preferred size must be <= max batch size for preferred_over_max",
    ),
    "priority_out_of_range": (
        "max_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 5 }",
        "default priority level must be in range [1, 2] for priority_out_of_range",
    ),
    "unknown_platform": ('platform: "caffe2_netdef"', "platform 'caffe2_netdef'"),
}


@pytest.fixture(scope="module")
def broken_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("broken-repo")
    model = mlp_model()
    write_model(repo, "good", model)
    for name, (config, _) in BROKEN.items():
        write_model(repo, name, model)
        (repo / name / "config.pbtxt").write_bytes(config.encode("latin-1"))
    return repo


def _config(repo: Path, mode: ModelControlMode = ModelControlMode.NONE) -> AgentConfig:
    return AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(
            repository=repo, exit_on_error=False, control_mode=mode, load_models=("*",)
        ),
    )


def _infer_good(client: httpclient.InferenceServerClient) -> np.ndarray:
    x = np.full((2, 64), 0.25, dtype=np.float32)
    data = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    data.set_data_from_numpy(x)
    result = client.infer("good", [data])
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    return np.asarray(out)


def test_each_broken_config_fails_its_model_and_the_good_one_serves(
    broken_repository: Path,
) -> None:
    with running_agent(_config(broken_repository)) as agent:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
        assert client.is_server_live()
        assert client.is_model_ready("good")
        out = _infer_good(client)
        assert out.shape == (2, 10)
        np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)  # softmax rows
        index = {row["name"]: row for row in client.get_model_repository_index()}
        for name, (_, reason) in BROKEN.items():
            row = index[name]
            request = httpclient.InferInput("INPUT0", [1, 64], "FP32")
            request.set_data_from_numpy(np.zeros((1, 64), np.float32))
            with pytest.raises(InferenceServerException) as refused:
                client.infer(name, [request])
            assert reason in str(refused.value.message()), (name, refused.value)
            assert not client.is_model_ready(name)
            if "version" in row:  # a version failed: UNAVAILABLE, with Triton's status code
                assert row["state"] == "UNAVAILABLE", (name, row)
                assert reason in row["reason"], (name, row["reason"])
                assert row["reason"].startswith(("Invalid argument: ", "Internal: ")), row
                assert "has no available versions" in str(refused.value.message())
            else:  # the config failed: as in Triton, the index has the name alone
                assert row == {"name": name}, row
                assert f"Request for unknown model: '{name}' is not found: " in str(
                    refused.value.message()
                )
        assert index["good"]["state"] == "READY"
        # Still answering after every failure; not ready, as Triton's strict readiness says
        # while a model the repository holds failed to load.
        assert client.is_server_live()
        assert not client.is_server_ready()
        assert _infer_good(client).shape == (2, 10)


def test_a_bad_config_override_in_a_load_request_is_a_400_and_the_old_model_serves(
    broken_repository: Path,
) -> None:
    with running_agent(_config(broken_repository, mode=ModelControlMode.EXPLICIT)) as agent:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
        for override in ({"max_batch_size": -2}, {"max_batch_size": 2000000000}):
            with pytest.raises(InferenceServerException) as caught:
                client.load_model("good", config=json.dumps(override))
            assert caught.value.status() == "400"
            assert "max_batch_size" in str(caught.value.message())
            assert client.is_model_ready("good")
            assert _infer_good(client).shape == (2, 10)
