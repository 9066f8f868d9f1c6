"""Python pre-processing → ONNX classifier → Python post-processing as one ensemble.

Served through tritonclient (HTTP and gRPC); the results must equal the three steps run by hand
(numpy for the Python steps, ONNX Runtime in-process for the classifier).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from agent.runtime.demo import mlp_model
from tests.models import write_model
from tests.server import running_agent

PRE_PY = """
import json

import numpy as np

from agent import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.out_type = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "FEATURES")["data_type"]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            features = ((raw.astype(np.float32) / 255.0) - 0.5) * 2.0
            tensor = pb_utils.Tensor("FEATURES", features.astype(self.out_type))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
"""

POST_PY = """
import numpy as np

from agent import pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.names = np.array([f"class_{i}".encode() for i in range(10)], dtype=np.object_)

    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs = shifted / shifted.sum(axis=1, keepdims=True)
            label = probs.argmax(axis=1).astype(np.int64).reshape(-1, 1)
            score = probs.max(axis=1).astype(np.float32).reshape(-1, 1)
            name = self.names[label[:, 0]].reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("LABEL", label),
                        pb_utils.Tensor("SCORE", score),
                        pb_utils.Tensor("LABEL_NAME", name),
                    ]
                )
            )
        return responses
"""

PRE_CONFIG = """
name: "pre" backend: "python" max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_UINT8 dims: [ 64 ] } ]
output [ { name: "FEATURES" data_type: TYPE_FP32 dims: [ 64 ] } ]
"""
CLASSIFIER_CONFIG = """
name: "classifier" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { }
"""
POST_CONFIG = """
name: "post" backend: "python" max_batch_size: 8
input [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ 10 ] } ]
output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "LABEL_NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
PIPELINE_CONFIG = """
name: "pipeline" platform: "ensemble" max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ 64 ] } ]
output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "LABEL_NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling {
  step { model_name: "pre" model_version: -1
         input_map { key: "RAW" value: "IMAGE" } output_map { key: "FEATURES" value: "features" } }
  step { model_name: "classifier" model_version: -1
         input_map { key: "INPUT0" value: "features" }
         output_map { key: "OUTPUT0" value: "logits" } }
  step { model_name: "post" model_version: -1
         input_map { key: "LOGITS" value: "logits" }
         output_map { key: "LABEL" value: "LABEL" } output_map { key: "SCORE" value: "SCORE" }
         output_map { key: "LABEL_NAME" value: "LABEL_NAME" } }
}
"""


def _python_model(repo: Path, name: str, code: str, config: str) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(code))
    (folder / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningAgent, Path]]:
    repo = tmp_path_factory.mktemp("pipeline") / "models"
    _python_model(repo, "pre", PRE_PY, PRE_CONFIG)
    _python_model(repo, "post", POST_PY, POST_CONFIG)
    write_model(repo, "classifier", mlp_model(), CLASSIFIER_CONFIG)
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(PIPELINE_CONFIG)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
    )
    with running_agent(config) as agent:
        yield agent, repo / "classifier" / "1" / "model.onnx"


def _by_hand(images: np.ndarray, onnx_path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    features = ((images.astype(np.float32) / 255.0) - 0.5) * 2.0
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    (logits,) = session.run(["OUTPUT0"], {"INPUT0": features})
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = shifted / shifted.sum(axis=1, keepdims=True)
    label = probs.argmax(axis=1).astype(np.int64).reshape(-1, 1)
    score = probs.max(axis=1).astype(np.float32).reshape(-1, 1)
    names = np.array([f"class_{i}".encode() for i in label[:, 0]], dtype=np.object_)
    return label, score, names.reshape(-1, 1)


def _images(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, 64), dtype=np.uint8)


def _success(client: httpclient.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    return int(stats["success"]["count"])


def test_pipeline_over_http_equals_the_steps_by_hand(
    pipeline: tuple[RunningAgent, Path],
) -> None:
    agent, onnx_path = pipeline
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    before = {m: _success(client, m) for m in ("pre", "classifier", "post")}
    for rows, seed in ((1, 0), (5, 1), (8, 2)):
        images = _images(rows, seed)
        inp = httpclient.InferInput("IMAGE", [rows, 64], "UINT8")
        inp.set_data_from_numpy(images, binary_data=True)
        result = client.infer("pipeline", [inp])
        label, score, names = _by_hand(images, onnx_path)
        np.testing.assert_array_equal(result.as_numpy("LABEL"), label)
        np.testing.assert_allclose(result.as_numpy("SCORE"), score, rtol=1e-6)
        np.testing.assert_array_equal(result.as_numpy("LABEL_NAME"), names)
    # Every step went through its own model: three requests each.
    for model, count in before.items():
        assert _success(client, model) == count + 3
    assert _success(client, "pipeline") >= 3


def test_pipeline_over_grpc_equals_the_steps_by_hand(
    pipeline: tuple[RunningAgent, Path],
) -> None:
    agent, onnx_path = pipeline
    assert agent.grpc_port is not None
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    images = _images(4, 7)
    inp = grpcclient.InferInput("IMAGE", [4, 64], "UINT8")
    inp.set_data_from_numpy(images)
    result = client.infer("pipeline", [inp])
    label, score, names = _by_hand(images, onnx_path)
    np.testing.assert_array_equal(result.as_numpy("LABEL"), label)
    np.testing.assert_allclose(result.as_numpy("SCORE"), score, rtol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("LABEL_NAME"), names)
