"""In-memory stand-ins the tests share: for hardware this machine does not have (NVML, a GPU's
memory, CUDA IPC, TensorRT's builder and engines) and for the few probes the agent reads from the
host (the memory budget, CPU and RAM, the clock).

Each name says it is a fake and what it stands in for. They answer the calls the agent makes, in
the units and with the names of the real API (NVML's milliwatts, TensorRT's enum member names),
so a test drives the agent's real code on top of them. The real hardware runs in tests/gpu/ on a
machine that has it; everything else in the suite uses real parts (sockets, brokers, ONNX
Runtime, files).
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agent.backends.tensorrt.api import TensorRT
from agent.errors import MemoryPressureError
from agent.models.device_memory import DeviceMemory, MemoryKind
from agent.models.inflight import InflightBytes
from agent.serving.cuda_regions import IPC_HANDLE_SIZE, CudaCallError

# The clock and the host -----------------------------------------------------------------------


class FakeClock:
    """A clock the test drives: each read adds `step` to `now` and returns it (`step=0`: `now`
    moves only when the test sets it)."""

    def __init__(self, start: float = 1_000.0, step: float = 1.0) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class FakeMemoryBudget:
    """The memory budget `/metrics` reads: fixed figures; its pool for requests in flight is the
    real one, holding 300,000 of its 1,000,000 bytes after one refusal."""

    def __init__(self) -> None:
        self.inflight: InflightBytes | None = InflightBytes(1_000_000)
        self.held = self.inflight.hold(300_000, "a request")
        with contextlib.suppress(MemoryPressureError):
            self.inflight.hold(800_000, "a large request")

    def budget_bytes(self) -> int:
        return 4_000_000

    def used_bytes(self) -> int:
        return 1_500_000

    def models_bytes(self) -> int:
        return 200_000


class FakeHostProbe:
    """The host's CPU and RAM (psutil's figures in the agent): fixed figures."""

    def cpu_utilization(self) -> float:
        return 0.25

    def memory_bytes(self) -> tuple[int, int]:
        return 8_000, 3_000


# NVML (nvidia-ml-py) --------------------------------------------------------------------------


class FakeNvmlError(Exception):
    """`pynvml.NVMLError`."""


@dataclass
class FakeNvmlGpu:
    """One GPU as NVML reports it, in NVML's units (bytes, percent, mW, mJ)."""

    uuid: str
    busy_percent: int
    total: int
    used: int
    power_mw: int | None  # None: NVML_ERROR_NOT_SUPPORTED
    limit_mw: int | None
    energy_mj: int | None
    name: str | bytes | None = None  # bytes: nvidia-ml-py before 11.5; None: not supported


@dataclass
class FakeNvmlUtilization:
    """`nvmlDeviceGetUtilizationRates`' answer."""

    gpu: int
    memory: int = 0


@dataclass
class FakeNvmlMemoryInfo:
    """`nvmlDeviceGetMemoryInfo`'s answer."""

    total: int
    used: int
    free: int = 0


@dataclass
class FakeNvml:
    """The pynvml calls `NvmlReader` makes, over a list of fake GPUs (NVML's units)."""

    gpus: list[FakeNvmlGpu]
    start_fails: bool = False
    NVMLError: type[Exception] = FakeNvmlError
    calls: list[str] = field(default_factory=list)

    def nvmlInit(self) -> None:
        if self.start_fails:
            raise FakeNvmlError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("count")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeNvmlGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeNvmlGpu) -> str | bytes:
        if handle.name is None:
            raise FakeNvmlError("Not Supported")
        return handle.name

    def nvmlDeviceGetUtilizationRates(self, handle: FakeNvmlGpu) -> FakeNvmlUtilization:
        return FakeNvmlUtilization(handle.busy_percent)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeNvmlGpu) -> FakeNvmlMemoryInfo:
        return FakeNvmlMemoryInfo(handle.total, handle.used)

    def nvmlDeviceGetPowerUsage(self, handle: FakeNvmlGpu) -> int:
        return _nvml_supported(handle.power_mw)

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeNvmlGpu) -> int:
        return _nvml_supported(handle.limit_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeNvmlGpu) -> int:
        return _nvml_supported(handle.energy_mj)


def _nvml_supported(value: int | None) -> int:
    if value is None:
        raise FakeNvmlError("Not Supported")
    return value


# A GPU's memory, as the load-time fit check reads it -----------------------------------------


class FakeGpuMemory:
    """A fake device-memory probe: fixed figures per device, as NVML or cudaMemGetInfo would give
    them; remembers which devices were read."""

    def __init__(self, free: int, total: int, kind: MemoryKind = MemoryKind.DISCRETE) -> None:
        self.kind = kind
        self._free, self._total = free, total
        self.read_devices: list[int] = []

    def read(self, device_id: int) -> DeviceMemory | None:
        self.read_devices.append(device_id)
        return DeviceMemory(device_id, self._total, self._free)


# CUDA IPC (cuda-python), for CUDA shared-memory regions ---------------------------------------


class FakeCudaDeviceMemory:
    """Host bytes standing in for one device allocation opened through IPC."""

    def __init__(self, memory: bytearray, log: list[str]) -> None:
        self.memory = memory
        self.log = log

    def read(self, offset: int, nbytes: int) -> bytes:
        self.log.append(f"read {offset} {nbytes}")
        return bytes(self.memory[offset : offset + nbytes])

    def write(self, offset: int, data: memoryview) -> None:
        self.log.append(f"write {offset} {data.nbytes}")
        self.memory[offset : offset + data.nbytes] = data

    def close(self) -> None:
        self.log.append("close")


class FakeCudaIpc:
    """Fake `IpcOpener`: allocations another process "exported", by handle; device 0 only."""

    def __init__(self) -> None:
        self.exported: dict[bytes, bytearray] = {}
        self.log: list[str] = []

    def export(self, size: int) -> tuple[bytes, bytearray]:
        handle = os.urandom(IPC_HANDLE_SIZE)
        self.exported[handle] = bytearray(size)
        return handle, self.exported[handle]

    def open(self, raw_handle: bytes, device_id: int, byte_size: int) -> FakeCudaDeviceMemory:
        if device_id != 0:
            raise CudaCallError("cudaSetDevice: cudaErrorInvalidDevice")
        memory = self.exported.get(raw_handle)
        if memory is None:
            raise CudaCallError("cudaIpcOpenMemHandle: cudaErrorInvalidValue")
        self.log.append(f"open {byte_size}")
        return FakeCudaDeviceMemory(memory, self.log)


# TensorRT's builder (the `tensorrt` module as `build_engine` uses it) ------------------------


class FakeTrtBuilderFlagsV10(enum.Enum):
    """`tensorrt.BuilderFlag` of TensorRT 10 (the members the builder sets)."""

    FP16 = 0
    INT8 = 1
    REFIT = 4


class FakeTrtBuilderFlagsV11(enum.Enum):
    """`tensorrt.BuilderFlag` of TensorRT 11, which removed the weak-typing flags."""

    REFIT = 4


class FakeTrtNetworkFlags(enum.IntEnum):
    """`tensorrt.NetworkDefinitionCreationFlag`."""

    EXPLICIT_BATCH = 0


class FakeTrtMemoryPools(enum.Enum):
    """`tensorrt.MemoryPoolType`."""

    WORKSPACE = 0


@dataclass
class FakeTrtInput:
    """A network input: its name and shape (-1 for a dynamic dimension)."""

    name: str
    shape: tuple[int, ...]


@dataclass
class FakeTrtNetwork:
    """`tensorrt.INetworkDefinition`: its inputs."""

    inputs: list[FakeTrtInput]

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int) -> FakeTrtInput:
        return self.inputs[index]


@dataclass
class FakeTrtProfile:
    """`tensorrt.IOptimizationProfile`: the (min, opt, max) shapes set per input."""

    shapes: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:
        self.shapes[input] = (min, opt, max)


@dataclass
class FakeTrtBuilderConfig:
    """`tensorrt.IBuilderConfig`: records the flags, pool limits and profiles set on it."""

    flags: list[str] = field(default_factory=list)
    pools: dict[str, int] = field(default_factory=dict)
    profiles: list[FakeTrtProfile] = field(default_factory=list)

    def set_memory_pool_limit(self, pool: FakeTrtMemoryPools, pool_size: int) -> None:
        self.pools[pool.name] = pool_size

    def set_flag(self, flag: enum.Enum) -> None:
        self.flags.append(flag.name)

    def add_optimization_profile(self, profile: FakeTrtProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class FakeTrtOnnxParser:
    """`tensorrt.OnnxParser`: parses a model file whose bytes are b"onnx"."""

    num_errors = 0

    def __init__(self, network: FakeTrtNetwork, logger: object) -> None:
        self.network = network

    def parse(self, model: bytes) -> bool:
        return model == b"onnx"

    def get_error(self, index: int) -> str:
        return "bad model"


class FakeTensorRT:
    """The module-level names `build_engine` uses, recording what it asks for (also the builder:
    `Builder()` returns the module itself)."""

    Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, severity: None})
    MemoryPoolType = FakeTrtMemoryPools
    NetworkDefinitionCreationFlag = FakeTrtNetworkFlags
    TensorIOMode = None

    def __init__(self, version: str, flags: type[enum.Enum], inputs: list[FakeTrtInput]) -> None:
        self.__version__ = version
        self.BuilderFlag = flags
        self.network = FakeTrtNetwork(inputs)
        self.config = FakeTrtBuilderConfig()
        self.network_flags: int | None = None

    def Builder(self, logger: object) -> FakeTensorRT:
        return self

    def OnnxParser(self, network: FakeTrtNetwork, logger: object) -> FakeTrtOnnxParser:
        return FakeTrtOnnxParser(network, logger)

    def Runtime(self, logger: object) -> None:
        raise AssertionError("not used by the builder")

    def nptype(self, trt_type: object) -> type:
        raise AssertionError("not used by the builder")

    # builder methods
    def create_network(self, flags: int = 0) -> FakeTrtNetwork:
        self.network_flags = flags
        return self.network

    def create_builder_config(self) -> FakeTrtBuilderConfig:
        return self.config

    def create_optimization_profile(self) -> FakeTrtProfile:
        return FakeTrtProfile()

    def build_serialized_network(
        self, network: FakeTrtNetwork, config: FakeTrtBuilderConfig
    ) -> bytes:
        return b"plan:" + ",".join(config.flags).encode()


def fake_tensorrt_module(fake: FakeTensorRT) -> TensorRT:
    """The fake where the builder takes the `tensorrt` module (duck-typed, as at run time)."""
    return cast(TensorRT, fake)


# TensorRT engines (`tensorrt.ICudaEngine`, TensorRT 10), for auto-complete --------------------


class FakeTrtTensorIOMode(enum.Enum):
    """`tensorrt.TensorIOMode`."""

    NONE = 0
    INPUT = 1
    OUTPUT = 2


class FakeTrtDataType(enum.Enum):
    """`tensorrt.DataType` (the agent reads members by name)."""

    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8


class FakeTrtTensorFormat(enum.Enum):
    """`tensorrt.TensorFormat`."""

    LINEAR = 0
    CHW4 = 1


@dataclass
class FakeTrtTensor:
    """One I/O tensor of an engine."""

    name: str
    mode: FakeTrtTensorIOMode
    shape: tuple[int, ...]
    dtype: FakeTrtDataType = FakeTrtDataType.FLOAT
    # kMIN, kOPT, kMAX per profile: shapes for execution tensors, values for shape tensors.
    profiles: Sequence[Sequence[tuple[int, ...]]] = field(default_factory=list)
    shape_tensor: bool = False
    io_format: FakeTrtTensorFormat = FakeTrtTensorFormat.LINEAR


class FakeTrtEngine:
    """A deserialized engine as TensorRT's Python API shows it (no GPU, no TensorRT)."""

    def __init__(self, *tensors: FakeTrtTensor, profiles: int = 1) -> None:
        self._tensors = {t.name: t for t in tensors}
        self._order = [t.name for t in tensors]
        self.num_optimization_profiles = profiles

    @property
    def num_io_tensors(self) -> int:
        return len(self._order)

    def get_tensor_name(self, index: int) -> str:
        return self._order[index]

    def get_tensor_mode(self, name: str) -> FakeTrtTensorIOMode:
        return self._tensors[name].mode

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._tensors[name].shape

    def get_tensor_dtype(self, name: str) -> FakeTrtDataType:
        return self._tensors[name].dtype

    def get_tensor_format(self, name: str) -> FakeTrtTensorFormat:
        return self._tensors[name].io_format

    def is_shape_inference_io(self, name: str) -> bool:
        return self._tensors[name].shape_tensor

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> Sequence[tuple[int, ...]]:
        tensor = self._tensors[name]
        assert tensor.mode is FakeTrtTensorIOMode.INPUT
        assert not tensor.shape_tensor
        return tensor.profiles[profile_index]

    def get_tensor_profile_values(self, profile_index: int, name: str) -> Sequence[tuple[int, ...]]:
        tensor = self._tensors[name]
        assert tensor.shape_tensor
        return tensor.profiles[profile_index]


class FakeTrtImplicitBatchEngine(FakeTrtEngine):
    """A TensorRT 8 implicit-batch engine: shapes without the batch dimension."""

    has_implicit_batch_dimension = True

    def __init__(self, *tensors: FakeTrtTensor, max_batch_size: int) -> None:
        super().__init__(*tensors)
        self.max_batch_size = max_batch_size
