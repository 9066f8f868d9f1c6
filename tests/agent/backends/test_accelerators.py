"""ONNX Runtime and the accelerators a config asks for: refused when missing, unless the operator
allowed the CPU fallback (then flagged); never a quiet fallback. Real sessions on this machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from agent.backends.onnx import OnnxBackend
from agent.errors import ModelLoadError
from agent.repository.model_config import parse_model_config
from agent.runtime.demo import mlp_model

pytestmark = pytest.mark.skipif(
    "TensorrtExecutionProvider" in ort.get_available_providers(),
    reason="this onnxruntime has the TensorRT provider: nothing is missing here",
)

TENSORRT = (
    "optimization { execution_accelerators { gpu_execution_accelerator : "
    '[ { name : "tensorrt" } ] } }'
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    file = tmp_path / "model.onnx"
    Path(file).write_bytes(mlp_model().SerializeToString())
    return file


def test_a_missing_accelerator_is_refused_with_what_is_missing(path: Path) -> None:
    with pytest.raises(ModelLoadError) as refused:
        OnnxBackend(path, parse_model_config(f'name: "m"\n{TENSORRT}', "m"), 1)
    text = refused.value.message
    assert "model 'm': the config asks for execution accelerator 'tensorrt'" in text
    assert "(TensorrtExecutionProvider)" in text
    assert f"onnxruntime {ort.__version__} does not provide" in text
    assert "models.allow_cpu_fallback = true" in text


def test_with_the_fallback_allowed_it_runs_and_says_what_it_runs_without(path: Path) -> None:
    config = parse_model_config(f'name: "m"\n{TENSORRT}', "m")
    backend = OnnxBackend(path, config, 1, allow_cpu_fallback=True)
    try:
        assert backend.missing_providers == ("TensorrtExecutionProvider",)
        assert backend.providers[-1] == "CPUExecutionProvider"
        (out,) = backend.run({"INPUT0": np.zeros((1, 64), dtype=np.float32)}, ["OUTPUT0"])
        assert out.shape == (1, 10)
    finally:
        backend.close()


def test_an_unknown_accelerator_is_refused_even_with_the_fallback(path: Path) -> None:
    config = parse_model_config(f'name: "m"\n{TENSORRT.replace("tensorrt", "tensorrtt")}', "m")
    with pytest.raises(ModelLoadError, match="unknown execution accelerator 'tensorrtt'"):
        OnnxBackend(path, config, 1, allow_cpu_fallback=True)


def test_a_config_without_accelerators_misses_nothing(path: Path) -> None:
    backend = OnnxBackend(path, parse_model_config('name: "m"', "m"), 1)
    try:
        assert backend.missing_providers == ()
    finally:
        backend.close()
