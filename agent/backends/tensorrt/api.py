"""The part of TensorRT's Python API the agent calls, as Protocols (TensorRT 10.x and 11.x).

`tensorrt` ships no type information and is absent where the agent is built and tested, so the
backend and the builder reach it only through these Protocols: a misspelt or removed name
(`execute_async_v2`, `get_binding_shape`, `max_workspace_size`, `int8_calibrator`) is a mypy
error here, not an AttributeError on a device. Every name below is in NVIDIA's published Python
API of TensorRT 10 (tensor-name I/O; the binding-index API was removed in 10.0) and is kept in
TensorRT 11, except the ones marked *10.x only*, which the code looks up with `getattr` and a
fallback (see `agent.backends.tensorrt.build` and docs/tensorrt.md).

Enum members (`BuilderFlag.FP16`, `TensorIOMode.INPUT`, ...) are typed `Any`: the Protocols name
the enums, and the code compares members by identity or `.name`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Logger(Protocol):
    """`tensorrt.ILogger` (the built-in `tensorrt.Logger`)."""


class ICudaEngine(Protocol):
    """A deserialized engine: I/O tensors by name, optimization profiles."""

    @property
    def num_io_tensors(self) -> int: ...

    @property
    def num_optimization_profiles(self) -> int: ...

    def get_tensor_name(self, index: int) -> str: ...
    def get_tensor_mode(self, name: str) -> Any: ...  # tensorrt.TensorIOMode
    def get_tensor_shape(self, name: str) -> Sequence[int]: ...  # -1 for a dynamic dim
    def get_tensor_dtype(self, name: str) -> Any: ...  # tensorrt.DataType
    def get_tensor_format(self, name: str) -> Any: ...  # tensorrt.TensorFormat
    def is_shape_inference_io(self, name: str) -> bool: ...
    def get_tensor_profile_shape(self, name: str, profile_index: int) -> Sequence[Any]: ...
    def get_tensor_profile_values(self, profile_index: int, name: str) -> Sequence[Any]: ...
    def create_execution_context(self) -> IExecutionContext | None: ...

    # Activation memory: `device_memory_size_v2` since 10.1; `device_memory_size` is 10.x only
    # (removed in 11), read through getattr in the backend.
    @property
    def device_memory_size_v2(self) -> int: ...


class IExecutionContext(Protocol):
    """One execution context (not thread-safe: one run at a time)."""

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool: ...
    def get_tensor_shape(self, name: str) -> Sequence[int]: ...
    def set_tensor_address(self, name: str, memory: int) -> bool: ...
    def execute_async_v3(self, stream_handle: int) -> bool: ...
    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool: ...


class Runtime(Protocol):
    def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None: ...


class ITensor(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Sequence[int]: ...


class INetworkDefinition(Protocol):
    @property
    def num_inputs(self) -> int: ...

    def get_input(self, index: int) -> ITensor: ...


class IOptimizationProfile(Protocol):
    def set_shape(
        self, input: str, min: Sequence[int], opt: Sequence[int], max: Sequence[int]
    ) -> None: ...


class IBuilderConfig(Protocol):
    def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None: ...
    def set_flag(self, flag: Any) -> None: ...  # weak-typing flags are 10.x only
    def add_optimization_profile(self, profile: IOptimizationProfile) -> int: ...


class Builder(Protocol):
    def create_network(self, flags: int = 0) -> INetworkDefinition: ...
    def create_builder_config(self) -> IBuilderConfig: ...
    def create_optimization_profile(self) -> IOptimizationProfile: ...
    def build_serialized_network(
        self, network: INetworkDefinition, config: IBuilderConfig
    ) -> Any: ...  # tensorrt.IHostMemory (buffer protocol), None on failure


class OnnxParser(Protocol):
    @property
    def num_errors(self) -> int: ...

    def parse(self, model: bytes) -> bool: ...
    def get_error(self, index: int) -> Any: ...


class TensorRT(Protocol):
    """The `tensorrt` module: the constructors, enums and helpers the agent uses."""

    __version__: str
    # Enums and the logger class (`Logger.WARNING`): typed Any; members are looked up by name.
    Logger: Any
    BuilderFlag: Any
    MemoryPoolType: Any
    NetworkDefinitionCreationFlag: Any
    TensorIOMode: Any

    def Runtime(self, logger: Logger) -> Runtime: ...
    def Builder(self, logger: Logger) -> Builder: ...
    def OnnxParser(self, network: INetworkDefinition, logger: Logger) -> OnnxParser: ...
    def nptype(self, trt_type: Any) -> type: ...
