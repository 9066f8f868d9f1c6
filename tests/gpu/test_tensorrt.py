"""TensorRT on a real GPU: engine builds (FP16, INT8 from QDQ), cache reuse, KServe v2 serving."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from agent.backends.tensorrt import build as engine_build
from agent.backends.tensorrt.backend import TensorRTBackend
from agent.backends.tensorrt.build import EngineSpec, Precision, cached_engine
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.proto import model_config_pb2 as mc
from agent.quantize.command import main as quantize_main
from tests.agent.quantize.digits import Digits, train_digits, write_calibration
from tests.gpu.conftest import trt_module
from tests.server import running_agent

pytestmark = pytest.mark.needs_tensorrt


def half() -> Precision:
    """FP16 where this TensorRT has the flag; TensorRT 11 builds strongly typed (FP32 here)."""
    return Precision.FP16 if hasattr(trt_module().BuilderFlag, "FP16") else Precision.FP32


@pytest.fixture(scope="module")
def digits() -> Digits:
    return train_digits()


@pytest.fixture(scope="module")
def models(digits: Digits, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu")
    onnx.save(digits.model, str(root / "fp32.onnx"))
    write_calibration(root / "calib", digits.x_train)
    rc = quantize_main(
        [
            "quantize",
            str(root / "fp32.onnx"),
            "--calibration",
            str(root / "calib"),
            "--output",
            str(root / "int8" / "model.onnx"),
        ]
    )
    assert rc == 0
    return root


def cpu_reference(model: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["OUTPUT0"], {"INPUT0": x})[0])


def run_engine(plan: Path, x: np.ndarray) -> np.ndarray:
    backend = TensorRTBackend(plan, mc.ModelConfig(name="digits", max_batch_size=16))
    try:
        assert backend.device_memory_bytes > 0
        parts = [
            backend.run({"INPUT0": x[i : i + 16]}, ["OUTPUT0"])[0] for i in range(0, len(x), 16)
        ]
    finally:
        backend.close()
    return np.concatenate(parts)


@pytest.mark.parametrize(
    ("precision", "source", "tolerance"),
    [(None, "fp32.onnx", 0.01), (Precision.INT8, "int8/model.onnx", 0.05)],
)
def test_engine_build_matches_onnxruntime_cpu(
    digits: Digits,
    models: Path,
    tmp_path: Path,
    precision: Precision | None,
    source: str,
    tolerance: float,
) -> None:
    precision = precision or half()
    plan = cached_engine(models / source, tmp_path, EngineSpec(precision, 1 << 28, 16))
    got = run_engine(plan, digits.x_test)
    want = cpu_reference(models / source, digits.x_test)
    print(f"{precision.value}: max |err| {np.abs(got - want).max():.4g}")
    assert float(np.abs(got - want).mean()) < tolerance
    assert np.mean(got.argmax(1) == want.argmax(1)) > 0.97


def test_engine_cache_survives_a_restart(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = EngineSpec(half(), 1 << 28, 16)
    first = cached_engine(models / "fp32.onnx", tmp_path, spec)
    built = first.stat().st_mtime_ns

    def no_build(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("rebuilt an engine that was cached")

    monkeypatch.setattr(engine_build, "build_engine", no_build)  # a "restarted" process
    again = cached_engine(models / "fp32.onnx", tmp_path, spec)
    assert again == first
    assert again.stat().st_mtime_ns == built


PLAN_CONFIG = """
name: "digits_trt"
platform: "tensorrt_plan"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""


def test_engine_served_over_kserve_matches_cpu(
    digits: Digits, models: Path, tmp_path: Path
) -> None:
    plan = cached_engine(models / "fp32.onnx", tmp_path / "cache", EngineSpec(half(), 1 << 28, 16))
    version = tmp_path / "models" / "digits_trt" / "1"
    version.mkdir(parents=True)
    shutil.copy(plan, version / "model.plan")
    (version.parent / "config.pbtxt").write_text(PLAN_CONFIG)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=tmp_path / "models", intra_op_threads=1),
    )
    x = digits.x_test[:64]
    with running_agent(config) as agent:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
        assert client.is_model_ready("digits_trt"), "registry not wired to TensorRTBackend yet?"
        tensor = httpclient.InferInput("INPUT0", [16, 64], "FP32")
        outs = []
        for i in range(0, len(x), 16):
            tensor.set_data_from_numpy(x[i : i + 16], binary_data=True)
            outs.append(client.infer("digits_trt", [tensor]).as_numpy("OUTPUT0"))
        client.close()
    got = np.concatenate(outs)
    want = cpu_reference(models / "fp32.onnx", x)
    assert float(np.abs(got - want).max()) < 0.02
