"""The engine builder's calls on a fake TensorRT module (no TensorRT here): which builder flags
each precision sets on TensorRT 10 (weak typing: FP16, INT8 + FP16 on a QDQ model), what
TensorRT 11 (strong typing only, no precision flags) builds and refuses, the explicit-batch flag
before 10, and the optimization profile of a dynamic batch dimension. The real builder runs in
tests/gpu/test_tensorrt.py."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from agent.backends.tensorrt.api import TensorRT
from agent.backends.tensorrt.build import EngineSpec, Precision, build_engine
from agent.errors import ModelLoadError


class FlagsV10(enum.Enum):
    FP16 = 0
    INT8 = 1
    REFIT = 4


class FlagsV11(enum.Enum):  # TensorRT 11 removed the weak-typing flags
    REFIT = 4


class NetworkFlags(enum.IntEnum):
    EXPLICIT_BATCH = 0


class Pools(enum.Enum):
    WORKSPACE = 0


@dataclass
class FakeInput:
    name: str
    shape: tuple[int, ...]


@dataclass
class FakeNetwork:
    inputs: list[FakeInput]

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int) -> FakeInput:
        return self.inputs[index]


@dataclass
class FakeProfile:
    shapes: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:
        self.shapes[input] = (min, opt, max)


@dataclass
class FakeConfig:
    flags: list[str] = field(default_factory=list)
    pools: dict[str, int] = field(default_factory=dict)
    profiles: list[FakeProfile] = field(default_factory=list)

    def set_memory_pool_limit(self, pool: Pools, pool_size: int) -> None:
        self.pools[pool.name] = pool_size

    def set_flag(self, flag: enum.Enum) -> None:
        self.flags.append(flag.name)

    def add_optimization_profile(self, profile: FakeProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class FakeParser:
    num_errors = 0

    def __init__(self, network: FakeNetwork, logger: object) -> None:
        self.network = network

    def parse(self, model: bytes) -> bool:
        return model == b"onnx"

    def get_error(self, index: int) -> str:
        return "bad model"


class FakeTensorRT:
    """The module-level names `build_engine` uses, recording what it asks for."""

    Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, severity: None})
    MemoryPoolType = Pools
    NetworkDefinitionCreationFlag = NetworkFlags
    TensorIOMode = None

    def __init__(self, version: str, flags: type[enum.Enum], inputs: list[FakeInput]) -> None:
        self.__version__ = version
        self.BuilderFlag = flags
        self.network = FakeNetwork(inputs)
        self.config = FakeConfig()
        self.network_flags: int | None = None

    def Builder(self, logger: object) -> FakeTensorRT:
        return self

    def OnnxParser(self, network: FakeNetwork, logger: object) -> FakeParser:
        return FakeParser(network, logger)

    def Runtime(self, logger: object) -> None:
        raise AssertionError("not used by the builder")

    def nptype(self, trt_type: object) -> type:
        raise AssertionError("not used by the builder")

    # builder methods
    def create_network(self, flags: int = 0) -> FakeNetwork:
        self.network_flags = flags
        return self.network

    def create_builder_config(self) -> FakeConfig:
        return self.config

    def create_optimization_profile(self) -> FakeProfile:
        return FakeProfile()

    def build_serialized_network(self, network: FakeNetwork, config: FakeConfig) -> bytes:
        return b"plan:" + ",".join(config.flags).encode()


def as_module(fake: FakeTensorRT) -> TensorRT:
    """The fake where the builder takes the `tensorrt` module (duck-typed, as at run time)."""
    return cast(TensorRT, fake)


@pytest.fixture
def onnx_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"onnx")
    return path


DYNAMIC = [FakeInput("INPUT0", (-1, 64))]


@pytest.mark.parametrize(
    ("precision", "flags"),
    [(Precision.FP32, []), (Precision.FP16, ["FP16"]), (Precision.INT8, ["INT8", "FP16"])],
)
def test_fake_tensorrt_10_weak_typing_flags(
    onnx_file: Path, precision: Precision, flags: list[str]
) -> None:
    trt = FakeTensorRT("10.3.0", FlagsV10, DYNAMIC)
    build_engine(onnx_file, EngineSpec(precision, 1 << 28, 8), as_module(trt))
    assert trt.config.flags == flags
    assert trt.network_flags == 0  # explicit batch is implied from TensorRT 10 on
    assert trt.config.pools == {"WORKSPACE": 1 << 28}
    assert [p.shapes for p in trt.config.profiles] == [{"INPUT0": ((1, 64), (8, 64), (8, 64))}]


def test_fake_tensorrt_11_builds_qdq_and_fp32_strongly_typed(onnx_file: Path) -> None:
    for precision in (Precision.INT8, Precision.FP32):
        trt = FakeTensorRT("11.4.0", FlagsV11, DYNAMIC)
        assert (
            build_engine(onnx_file, EngineSpec(precision, 1 << 28, 8), as_module(trt)) == b"plan:"
        )
        assert trt.config.flags == []


def test_fake_tensorrt_11_refuses_fp16_with_what_to_do(onnx_file: Path) -> None:
    trt = FakeTensorRT("11.4.0", FlagsV11, DYNAMIC)
    with pytest.raises(ModelLoadError, match=r"strongly typed networks only.*precision fp32"):
        build_engine(onnx_file, EngineSpec(Precision.FP16, 1 << 28, 8), as_module(trt))


def test_fake_tensorrt_8_asks_for_explicit_batch(onnx_file: Path) -> None:
    trt = FakeTensorRT("8.6.1", FlagsV10, [FakeInput("INPUT0", (1, 64))])
    build_engine(onnx_file, EngineSpec(Precision.FP16, 1 << 28, 1), as_module(trt))
    assert trt.network_flags == 1 << NetworkFlags.EXPLICIT_BATCH.value
    assert trt.config.profiles == []  # static shapes need no profile


def test_fake_tensorrt_refuses_dynamic_non_batch_dims(onnx_file: Path) -> None:
    trt = FakeTensorRT("10.3.0", FlagsV10, [FakeInput("INPUT0", (-1, -1))])
    with pytest.raises(ModelLoadError, match="dynamic non-batch dimension"):
        build_engine(onnx_file, EngineSpec(Precision.FP16, 1 << 28, 8), as_module(trt))


def test_fake_tensorrt_parser_errors_are_load_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"nope")
    trt = FakeTensorRT("10.3.0", FlagsV10, DYNAMIC)
    with pytest.raises(ModelLoadError, match="cannot parse"):
        build_engine(bad, EngineSpec(Precision.FP16, 1 << 28, 8), as_module(trt))
