"""The engine builder's calls on a fake TensorRT module (no TensorRT here): which builder flags
each precision sets on TensorRT 10 (weak typing: FP16, INT8 + FP16 on a QDQ model), what
TensorRT 11 (strong typing only, no precision flags) builds and refuses, the explicit-batch flag
before 10, and the optimization profile of a dynamic batch dimension. The real builder runs in
tests/gpu/test_tensorrt.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.backends.tensorrt.build import EngineSpec, Precision, build_engine
from agent.errors import ModelLoadError
from tests.fakes import (
    FakeTensorRT,
    FakeTrtBuilderFlagsV10,
    FakeTrtBuilderFlagsV11,
    FakeTrtInput,
    FakeTrtNetworkFlags,
    fake_tensorrt_module,
)


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"onnx")
    return path


DYNAMIC = [FakeTrtInput("INPUT0", (-1, 64))]


@pytest.mark.parametrize(
    ("precision", "flags"),
    [(Precision.FP32, []), (Precision.FP16, ["FP16"]), (Precision.INT8, ["INT8", "FP16"])],
)
def test_fake_tensorrt_10_weak_typing_flags(
    onnx_file: Path, precision: Precision, flags: list[str]
) -> None:
    trt = FakeTensorRT("10.3.0", FakeTrtBuilderFlagsV10, DYNAMIC)
    build_engine(onnx_file, EngineSpec(precision, 1 << 28, 8), fake_tensorrt_module(trt))
    assert trt.config.flags == flags
    assert trt.network_flags == 0  # explicit batch is implied from TensorRT 10 on
    assert trt.config.pools == {"WORKSPACE": 1 << 28}
    assert [p.shapes for p in trt.config.profiles] == [{"INPUT0": ((1, 64), (8, 64), (8, 64))}]


def test_fake_tensorrt_11_builds_qdq_and_fp32_strongly_typed(onnx_file: Path) -> None:
    for precision in (Precision.INT8, Precision.FP32):
        trt = FakeTensorRT("11.4.0", FakeTrtBuilderFlagsV11, DYNAMIC)
        assert (
            build_engine(onnx_file, EngineSpec(precision, 1 << 28, 8), fake_tensorrt_module(trt))
            == b"plan:"
        )
        assert trt.config.flags == []


def test_fake_tensorrt_11_refuses_fp16_with_what_to_do(onnx_file: Path) -> None:
    trt = FakeTensorRT("11.4.0", FakeTrtBuilderFlagsV11, DYNAMIC)
    with pytest.raises(ModelLoadError, match=r"strongly typed networks only.*precision fp32"):
        build_engine(onnx_file, EngineSpec(Precision.FP16, 1 << 28, 8), fake_tensorrt_module(trt))


def test_fake_tensorrt_8_asks_for_explicit_batch(onnx_file: Path) -> None:
    trt = FakeTensorRT("8.6.1", FakeTrtBuilderFlagsV10, [FakeTrtInput("INPUT0", (1, 64))])
    build_engine(onnx_file, EngineSpec(Precision.FP16, 1 << 28, 1), fake_tensorrt_module(trt))
    assert trt.network_flags == 1 << FakeTrtNetworkFlags.EXPLICIT_BATCH.value
    assert trt.config.profiles == []  # static shapes need no profile


def test_fake_tensorrt_refuses_dynamic_non_batch_dims(onnx_file: Path) -> None:
    trt = FakeTensorRT("10.3.0", FakeTrtBuilderFlagsV10, [FakeTrtInput("INPUT0", (-1, -1))])
    with pytest.raises(ModelLoadError, match="dynamic non-batch dimension"):
        build_engine(onnx_file, EngineSpec(Precision.FP16, 1 << 28, 8), fake_tensorrt_module(trt))


def test_fake_tensorrt_parser_errors_are_load_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"nope")
    trt = FakeTensorRT("10.3.0", FakeTrtBuilderFlagsV10, DYNAMIC)
    with pytest.raises(ModelLoadError, match="cannot parse"):
        build_engine(bad, EngineSpec(Precision.FP16, 1 << 28, 8), fake_tensorrt_module(trt))
