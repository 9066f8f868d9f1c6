"""TensorRT backend: a serialized engine (`platform: "tensorrt_plan"`, `backend: "tensorrt"`).

CUDA memory and streams come from NVIDIA's `cuda-python` runtime bindings rather than pycuda:
they ship as wheels for aarch64 and x86 (pycuda compiles against the CUDA toolkit at install time,
which a Jetson image often lacks), they are maintained with CUDA itself, and the runtime API works
in the device's primary context, which TensorRT and ONNX Runtime's CUDA provider also use. pycuda's
`autoinit` instead makes a context bound to the importing thread, while the scheduler runs a model
on its own executor threads.

Both libraries are imported only when an engine is loaded; without them the load raises
`ModelLoadError("TensorRT is not installed on this device: ...")`, so the model is UNAVAILABLE
with that reason and the rest of the repository serves as usual.

With auto-complete on, the config is completed from the engine as Triton's tensorrt_backend
completes it (`agent.backends.tensorrt.config`) before the buffers are sized; the loader takes the
result from `declared_config`.

Each backend owns one execution context, one CUDA stream and device buffers sized for the
optimization profile's largest batch (max_batch_size), allocated once at load: `run` only copies
in, enqueues and copies out. `run` is blocking (the scheduler calls it off the event loop) and
serialized by a lock, since an execution context is not thread-safe. `device_memory_bytes` is the
engine's activation memory plus the I/O buffers (on a Jetson, GPU memory is the same RAM the
memory budget covers).

A run that fails in TensorRT or CUDA (not one whose input the profile refuses) is judged by a
probe on zeros, and the execution context rebuilt when that fails too
(`agent.backends.session_health`); a sticky CUDA error fails the rebuilds until the version
gives up, with the reason.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.backends.base import Backend, DeclaresConfig, ReportsHealth, ReportsProviders
from agent.backends.cuda import cuda_check, cuda_runtime
from agent.backends.health import HealthListener, HealthState, RestartPolicy
from agent.backends.session_health import SessionGuard
from agent.backends.tensorrt.api import ICudaEngine, IExecutionContext, TensorRT
from agent.backends.tensorrt.build import import_tensorrt
from agent.backends.tensorrt.config import complete_from_engine
from agent.errors import BackendError, InvalidInputError, ModelConfigError, ModelLoadError
from agent.proto import model_config_pb2 as mc
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor


def _numpy_dtype(trt: TensorRT, dtype: Any) -> np.dtype[Any]:
    result: np.dtype[Any] = np.dtype(trt.nptype(dtype))
    return result


def _activation_bytes(engine: ICudaEngine) -> int:
    """The engine's activation memory: `device_memory_size_v2` (TensorRT 10.1 and later),
    else `device_memory_size` (8.6 and 10.0; removed in 11)."""
    size: int | None = getattr(engine, "device_memory_size_v2", None)
    if size is None:
        size = getattr(engine, "device_memory_size", 0)
    return int(size or 0)


class TensorRTBackend(Backend, DeclaresConfig, ReportsProviders, ReportsHealth):
    """A model version running a serialized TensorRT engine on one CUDA device."""

    def __init__(
        self,
        path: Path,
        config: mc.ModelConfig,
        *,
        device: int = 0,
        model_name: str = "",
        auto_complete: bool = False,
        restart_policy: RestartPolicy | None = None,
        health_listener: HealthListener | None = None,
    ) -> None:
        """Deserialize the engine, complete the config from it (auto-complete on), allocate
        buffers for max_batch_size and a stream.

        Raises:
            ModelLoadError: TensorRT/cuda-python missing, no engine file, or the engine was built
                for another GPU or TensorRT version.
            ModelConfigError: auto-complete refused the config (Triton's words).
        """
        trt: TensorRT = import_tensorrt()
        self._cudart = cudart = cuda_runtime()
        if not path.is_file():
            raise ModelLoadError(f"engine file {path} not found")
        self._trt = trt
        self._guard = SessionGuard(
            f"model '{model_name or config.name}' (tensorrt)",
            restart_policy or RestartPolicy(),
            probe=self._probe,
            rebuild=self._rebuild,
            listener=health_listener,
            probe_ok=False,  # until the first probe passes, below
        )
        self._lock = threading.Lock()
        self._buffers: dict[str, int] = {}
        self._stream: Any = None
        try:
            cuda_check(cudart.cudaSetDevice(device), "cudaSetDevice")
            self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is None:
                raise ModelLoadError(
                    f"TensorRT {trt.__version__} cannot load {path}: built for another GPU or "
                    "TensorRT version, or not an engine; rebuild it (edge-agent build-engine)"
                )
            self._engine: ICudaEngine = engine
            if auto_complete:
                config = complete_from_engine(config, engine, model_name or config.name)
            self.declared_config = config
            context = engine.create_execution_context()
            if context is None:  # TensorRT could not allocate its activation memory
                raise ModelLoadError(f"TensorRT cannot create an execution context for {path}")
            self._context: IExecutionContext = context
            self._stream = cuda_check(cudart.cudaStreamCreate(), "cudaStreamCreate")
            self.max_batch = max(1, config.max_batch_size)
            self._inputs, self._outputs = self._io_tensors()
            self._dtypes = {
                name: _numpy_dtype(trt, self._engine.get_tensor_dtype(name))
                for name in self._names()
            }
            io_bytes = 0
            for name in self._names():
                size = self._max_bytes(name)
                self._buffers[name] = cuda_check(cudart.cudaMalloc(size), "cudaMalloc")
                self._context.set_tensor_address(name, self._buffers[name])
                io_bytes += size
        except BackendError as exc:
            self.close()
            raise ModelLoadError(f"cannot load {path}: {exc.message}") from None
        except (ModelLoadError, ModelConfigError):
            self.close()
            raise
        self.device_memory_bytes = _activation_bytes(self._engine) + io_bytes
        self.providers: tuple[str, ...] = ("TensorRT",)
        self.missing_providers: tuple[str, ...] = ()
        self._guard.baseline(self._probe_passes())

    @property
    def health(self) -> HealthState:
        """Whether the execution context serves (`agent.backends.session_health`)."""
        return self._guard.state

    def _probe(self) -> None:
        """One run on zeros of the smallest shape, straight on the context."""
        feeds = {
            t.name: np.zeros(
                tuple(1 if d is None else d for d in t.shape), dtype=self._dtypes[t.name]
            )
            for t in self._inputs
        }
        self._execute(feeds, [t.name for t in self._outputs])

    def _probe_passes(self) -> bool:
        try:
            self._probe()
        except (BackendError, InvalidInputError):  # its profile refuses ones: no probe
            return False
        return True

    def _rebuild(self) -> None:
        """A new execution context on the same engine and buffers, in place of the old one."""
        with self._lock:
            context = self._engine.create_execution_context()
            if context is None:
                raise ModelLoadError("TensorRT cannot create an execution context")
            for name, pointer in self._buffers.items():
                context.set_tensor_address(name, pointer)
            self._context = context

    def _names(self) -> list[str]:
        return [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]

    def _io_tensors(self) -> tuple[tuple[ModelTensor, ...], tuple[ModelTensor, ...]]:
        trt = self._trt
        inputs, outputs = [], []
        for name in self._names():
            dtype = np.dtype(trt.nptype(self._engine.get_tensor_dtype(name)))
            datatype = next((t for t in datatypes.BY_KSERVE.values() if t.numpy == dtype), None)
            shape = tuple(None if d < 0 else int(d) for d in self._engine.get_tensor_shape(name))
            tensor = ModelTensor(name, datatype, str(dtype), shape)
            if self._engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                inputs.append(tensor)
            else:
                outputs.append(tensor)
        return tuple(inputs), tuple(outputs)

    def _max_shape(self, name: str) -> tuple[int, ...]:
        shape = tuple(int(d) for d in self._engine.get_tensor_shape(name))
        return tuple(self.max_batch if d < 0 else d for d in shape)

    def _max_bytes(self, name: str) -> int:
        count = int(np.prod(self._max_shape(name), dtype=np.int64))
        return max(1, count) * self._dtypes[name].itemsize

    @property
    def inputs(self) -> Sequence[ModelTensor]:
        return self._inputs

    @property
    def outputs(self) -> Sequence[ModelTensor]:
        return self._outputs

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        shrink_memory: bool = False,
    ) -> list[np.ndarray]:
        """Copy in, enqueue on the stream, copy out, wait (blocking; off the event loop).

        Raises:
            InvalidInputError: a batch larger than the profile allows.
            BackendError: TensorRT or CUDA failed (the context is probed, and rebuilt if it
                fails that too).
            ModelNotReadyError: the context is being rebuilt and is not back in time, or the
                version gave up.
        """
        self._guard.wait_ready()
        try:
            return self._execute(feeds, output_names)
        except BackendError as exc:
            error = exc
        self._guard.failed(error)
        raise error

    def _execute(
        self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> list[np.ndarray]:
        cudart = self._cudart
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        with self._lock:
            for tensor in self._inputs:
                array = np.ascontiguousarray(feeds[tensor.name], dtype=self._dtypes[tensor.name])
                if array.nbytes > self._max_bytes(tensor.name):
                    raise InvalidInputError(
                        f"input '{tensor.name}' shape {array.shape} is over the engine's profile"
                    )
                if not self._context.set_input_shape(tensor.name, array.shape):
                    raise InvalidInputError(
                        f"input '{tensor.name}' shape {array.shape} does not fit the engine"
                    )
                cuda_check(
                    cudart.cudaMemcpyAsync(
                        self._buffers[tensor.name],
                        array.ctypes.data,
                        array.nbytes,
                        h2d,
                        self._stream,
                    ),
                    "cudaMemcpyAsync",
                )
            # TensorRT takes the stream as an integer handle (cuda-python's cudaStream_t wraps it).
            if not self._context.execute_async_v3(int(self._stream)):
                raise BackendError("TensorRT execute_async_v3 failed")
            results = []
            for name in output_names:
                shape = tuple(int(d) for d in self._context.get_tensor_shape(name))
                out = np.empty(shape, dtype=self._dtypes[name])
                cuda_check(
                    cudart.cudaMemcpyAsync(
                        out.ctypes.data, self._buffers[name], out.nbytes, d2h, self._stream
                    ),
                    "cudaMemcpyAsync",
                )
                results.append(out)
            cuda_check(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        return results

    def close(self) -> None:
        """Free the buffers and the stream, then drop the context and engine."""
        self._guard.close()
        cudart = self._cudart
        for pointer in self._buffers.values():
            cudart.cudaFree(pointer)
        self._buffers.clear()
        if self._stream is not None:
            cudart.cudaStreamDestroy(self._stream)
            self._stream = None
        for attr in ("_context", "_engine", "_runtime"):
            if hasattr(self, attr):
                delattr(self, attr)
