"""Engine cache keys and backend selection (no GPU needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.protobuf import text_format

from agent.backends.select import BackendKind, backend_kind, create_backend
from agent.backends.tensorrt import build as engine_build
from agent.backends.tensorrt.build import (
    EngineSpec,
    Precision,
    cached_engine,
    engine_cache_key,
    ort_tensorrt_options,
)
from agent.errors import ModelLoadError
from agent.proto import model_config_pb2 as mc

HAS_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    path = tmp_path / "a.onnx"
    path.write_bytes(b"model-a")
    return path


def test_same_inputs_same_key(onnx_file: Path, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere.onnx"
    copy.write_bytes(onnx_file.read_bytes())
    key = engine_cache_key(onnx_file, "10.3.0", "8.7", "fp16")
    assert key == engine_cache_key(copy, "10.3.0", "8.7", Precision.FP16)  # bytes, not path
    assert len(key) == 64


def test_anything_that_changes_the_engine_changes_the_key(onnx_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "b.onnx"
    other.write_bytes(b"model-b")
    base = engine_cache_key(onnx_file, "10.3.0", "8.7", "fp16")
    variants = {
        "model": engine_cache_key(other, "10.3.0", "8.7", "fp16"),
        "trt": engine_cache_key(onnx_file, "8.6.2", "8.7", "fp16"),
        "gpu": engine_cache_key(onnx_file, "10.3.0", "9.0", "fp16"),
        "precision": engine_cache_key(onnx_file, "10.3.0", "8.7", "int8"),
        "batch": engine_cache_key(onnx_file, "10.3.0", "8.7", "fp16", max_batch_size=8),
        "workspace": engine_cache_key(onnx_file, "10.3.0", "8.7", "fp16", workspace_bytes=1),
    }
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants)


def test_cached_engine_builds_once_per_key(
    onnx_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Precision] = []

    def fake_build(onnx_path: Path, spec: EngineSpec, trt: object = None) -> bytes:
        builds.append(spec.precision)
        return b"engine-" + spec.precision.value.encode()

    monkeypatch.setattr(engine_build, "build_engine", fake_build)
    trt = SimpleNamespace(__version__="10.3.0")
    spec = EngineSpec(Precision.FP16, 1 << 20, 4)
    first = cached_engine(onnx_file, tmp_path / "cache", spec, trt=trt, capability="8.7")
    again = cached_engine(onnx_file, tmp_path / "cache", spec, trt=trt, capability="8.7")
    assert first == again
    assert first.parent == tmp_path / "cache" / "engines"
    assert builds == [Precision.FP16]
    other_gpu = cached_engine(onnx_file, tmp_path / "cache", spec, trt=trt, capability="9.0")
    assert other_gpu != first
    assert builds == [Precision.FP16, Precision.FP16]
    assert first.read_bytes() == b"engine-fp16"


TRT_CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
optimization { execution_accelerators { gpu_execution_accelerator : [ {
  name : "tensorrt"
  parameters { key: "precision_mode" value: "INT8" }
  parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }
"""


def test_config_fields_drive_engine_spec_and_ort_options(tmp_path: Path) -> None:
    config = text_format.Parse(TRT_CONFIG, mc.ModelConfig())
    assert engine_build.spec_from_config(config) == EngineSpec(Precision.INT8, 1 << 30, 8)
    options = ort_tensorrt_options(config, tmp_path)
    assert options["trt_int8_enable"] is True
    assert options["trt_max_workspace_size"] == 1 << 30
    assert options["trt_engine_cache_enable"] is True
    assert Path(options["trt_engine_cache_path"]) == tmp_path / "engines" / "ort" / "m"
    assert backend_kind(config) is BackendKind.ONNXRUNTIME
    config.platform = "tensorrt_plan"
    assert backend_kind(config) is BackendKind.TENSORRT


@pytest.mark.skipif(HAS_TRT, reason="TensorRT is installed here; this checks hosts without it")
def test_tensorrt_model_without_tensorrt_reports_why(tmp_path: Path) -> None:
    (tmp_path / "model.plan").write_bytes(b"not really an engine")
    config = mc.ModelConfig(name="m", platform="tensorrt_plan", max_batch_size=4)
    with pytest.raises(ModelLoadError, match="TensorRT is not installed on this device"):
        create_backend(tmp_path, config, 1)
