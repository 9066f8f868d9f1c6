"""ONNX Runtime backend: one InferenceSession per loaded model version.

Execution providers come from the model config (`optimization.execution_accelerators` and GPU
instance groups) filtered by what the installed onnxruntime offers; CPU always closes the list.

An accelerator the config asks for (`gpu_execution_accelerator: [ { name: "tensorrt" } ]`)
that this ONNX Runtime lacks is a decision, never a quiet fallback: the version is refused
(ModelLoadError naming the provider that is missing and what to install), unless the operator
opted into CPU fallback (`models.allow_cpu_fallback`): then it loads on the CPU, and
`missing_providers` says what it runs without (the index, the config response, the status page
and the fleet's status show it). An unknown accelerator name is refused either way.

Threads: a run that starts alone gets the whole device (a second, "lone" session with one
intra-op thread per core); a run that starts beside others, or while runs have lately overlapped
(`InFlight`), uses the per-instance session (`cores / instances` threads), so busy instances
never contend for cores. `thread_plan` decides; an explicit thread count (the config's
`intra_op_thread_count` parameter, `models.intra_op_threads`) pins every run to it and keeps one
session.

A session whose run raises is judged by a probe on zeros and rebuilt when that fails too
(`agent.backends.session_health`): the version is not ready meanwhile, and gives up past the
restart limit.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from agent.backends.base import (
    Backend,
    CountsExtraRuns,
    ReleasesMemory,
    ReportsHealth,
    ReportsProviders,
)
from agent.backends.health import HealthListener, HealthState, RestartPolicy
from agent.backends.intra_op import MAX_INTRA_OP_THREADS
from agent.backends.session_health import SessionGuard
from agent.backends.tensorrt.build import ort_tensorrt_options
from agent.errors import BackendError, ModelLoadError
from agent.proto import model_config_pb2 as mc
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor

logger = logging.getLogger(__name__)

_CPU = "CPUExecutionProvider"
# The config's accelerator names and their providers (agent.device.checks holds the same map).
ACCELERATORS = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
}


ProviderList = list[str | tuple[str, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    """Providers to create the session with, and what was asked for but is not installed.

    `requested`: the accelerators the config names (not the CUDA provider a GPU instance group
    implies), as (config name, provider); `requested_missing`: those this runtime lacks.
    """

    providers: ProviderList
    missing: tuple[str, ...]
    requested_missing: tuple[tuple[str, str], ...] = ()
    requested: tuple[tuple[str, str], ...] = ()


def choose_providers(
    config: mc.ModelConfig, available: Sequence[str], cache_root: Path | None = None
) -> ProviderChoice:
    """Map the config's accelerators onto installed ONNX Runtime providers, CPU last."""
    wanted: list[tuple[str, dict[str, Any]]] = []
    requested: dict[str, str] = {}  # provider -> the name the config gave it
    for acc in config.optimization.execution_accelerators.gpu_execution_accelerator:
        name = ACCELERATORS.get(acc.name.lower())
        if name is None:
            wanted.append((f"unknown accelerator '{acc.name}'", {}))
            requested[wanted[-1][0]] = acc.name
            continue
        requested.setdefault(name, acc.name)
        options: dict[str, Any] = {}
        if name == "TensorrtExecutionProvider":
            # Same fields as the native engine build; engine cache inside the model cache.
            options.update(ort_tensorrt_options(config, cache_root))
        wanted.append((name, options))
    gpu_group = any(g.kind == mc.ModelInstanceGroup.KIND_GPU for g in config.instance_group)
    if (gpu_group or wanted) and all(n != "CUDAExecutionProvider" for n, _ in wanted):
        wanted.append(("CUDAExecutionProvider", {}))
    providers: ProviderList = []
    missing: list[str] = []
    for name, options in wanted:
        if name in available:
            providers.append((name, options) if options else name)
        else:
            missing.append(name)
    providers.append(_CPU)
    asked = tuple((requested[n], n) for n in missing if n in requested)
    return ProviderChoice(
        providers, tuple(missing), asked, tuple((a, n) for n, a in requested.items())
    )


def refusal(model: str, missing: Sequence[tuple[str, str]], has: Sequence[str]) -> str | None:
    """Why a version is refused whose config asks for accelerators (config name, provider)
    that are `missing`; `has`: the providers there are. None: nothing is missing."""
    if not missing:
        return None
    unknown = [asked for asked, provider in missing if is_unknown(provider)]
    if unknown:
        names = ", ".join(f"'{n}'" for n in unknown)
        return (
            f"model '{model}': unknown execution accelerator {names} in "
            "optimization.execution_accelerators (known: tensorrt, cuda)"
        )
    needs = ", ".join(f"'{asked}' ({provider})" for asked, provider in missing)
    return (
        f"model '{model}': the config asks for execution accelerator {needs}, which this "
        f"onnxruntime {ort.__version__} does not provide (it has {', '.join(has) or 'none'}); "
        "install an onnxruntime with it and its libraries (onnxruntime-gpu, docs/jetson.md), "
        "or set models.allow_cpu_fallback = true to run the model without it"
    )


def is_unknown(provider: str) -> bool:
    """An accelerator name the config gives that no provider has (refused even with the
    fallback: a typo must not run on the CPU unnoticed)."""
    return provider.startswith("unknown accelerator")


def _decide(
    model: str, missing: Sequence[tuple[str, str]], has: Sequence[str], allow_cpu_fallback: bool
) -> None:
    """Refuse a version that would run without accelerators its config asks for, unless the
    fallback is allowed (an unknown accelerator is refused anyway).

    Raises:
        ModelLoadError: the reason (`refusal`).
    """
    refused = refusal(model, missing, has)
    if refused is not None and (
        not allow_cpu_fallback or any(is_unknown(provider) for _, provider in missing)
    ):
        raise ModelLoadError(refused)


# Triton's ONNX Runtime backend's config parameter for a session's intra-op threads.
INTRA_OP_PARAMETER = "intra_op_thread_count"


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """ONNX Runtime intra-op threads for a version's runs.

    `busy`: a run that starts while other runs of the version are in flight (each instance's
    share of the cores); `alone`: a run that starts with none in flight. Equal: one session.
    """

    busy: int
    alone: int

    @property
    def lone_session(self) -> bool:
        """Whether lone runs get a session of their own (more threads than a busy run)."""
        return self.alone > self.busy


def thread_plan(
    config: mc.ModelConfig, instances: int, setting: int = 0, cores: int | None = None
) -> ThreadPlan:
    """The threads of a version's runs: the config's `intra_op_thread_count` parameter, else
    `setting` (models.intra_op_threads), each pinning every run; 0 or neither: every core for a
    run that starts alone, the cores shared between the instances for the others.

    Raises:
        ModelLoadError: the parameter is not an integer >= 0.
    """
    cores = cores or os.cpu_count() or 1
    parameter = config.parameters.get(INTRA_OP_PARAMETER)
    if parameter is not None:
        text = parameter.string_value.strip()
        try:
            pinned = int(text)
        except ValueError:
            pinned = -1
        if not 0 <= pinned <= MAX_INTRA_OP_THREADS:
            raise ModelLoadError(
                f"model '{config.name}': parameter '{INTRA_OP_PARAMETER}' must be an integer "
                f"from 0 to {MAX_INTRA_OP_THREADS}, got '{parameter.string_value}'"
            )
        setting = pinned or setting
    if setting > 0:
        return ThreadPlan(setting, setting)
    return ThreadPlan(max(1, cores // max(1, instances)), cores)


# A run goes to the lone session only when no two runs have overlapped for this long: under
# load, batches often start together (their clients answered together), and one of them taking
# every core beside the other's instance share would make the cores contend (measured: CNN at
# c=16 lost throughput), while a lone client's requests never overlap.
QUIET_BEFORE_LONE_S = 0.5


class InFlight:
    """Counts a version's runs in flight and says whether a run starts alone: none in flight,
    and none overlapped another for `quiet_s` (thread-safe; the caller passes monotonic `now`).
    """

    def __init__(self, quiet_s: float = QUIET_BEFORE_LONE_S) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._quiet_s = quiet_s
        self._overlapped_at: float | None = None  # when a run last started beside another

    def start(self, now: float) -> bool:
        """Count a run in; True when it starts alone."""
        with self._lock:
            self._count += 1
            if self._count > 1:
                self._overlapped_at = now
                return False
            last = self._overlapped_at
            return last is None or now - last >= self._quiet_s

    def end(self) -> None:
        """Count a run out (once per `start`)."""
        with self._lock:
            self._count -= 1


class OnnxBackend(Backend, ReleasesMemory, ReportsProviders, ReportsHealth, CountsExtraRuns):
    """A model version running in ONNX Runtime (thread-safe: instances share its sessions)."""

    def __init__(
        self,
        path: Path,
        config: mc.ModelConfig,
        intra_op_threads: int,
        cache_root: Path | None = None,
        *,
        lone_intra_op_threads: int = 0,
        allow_cpu_fallback: bool = False,
        restart_policy: RestartPolicy | None = None,
        health_listener: HealthListener | None = None,
    ) -> None:
        """Create the session, and probe it once on zeros (the health probe's baseline).

        `intra_op_threads`: each run's threads; `lone_intra_op_threads` above it: a second
        session with that many for runs that start while no other is in flight (`ThreadPlan`;
        on the CPU only).

        Raises:
            ModelLoadError: the file is missing or ONNX Runtime refuses it; the config asks for
                an accelerator this onnxruntime lacks, without `allow_cpu_fallback` (module
                docstring).
        """
        if not path.is_file():
            raise ModelLoadError(f"model file {path} not found")
        available = ort.get_available_providers()
        choice = choose_providers(config, available, cache_root)
        model = config.name or path.parent.parent.name
        _decide(model, choice.requested_missing, available, allow_cpu_fallback)
        # With the fallback allowed, it runs without them; the index and the status say so.
        self.missing_providers: tuple[str, ...] = tuple(p for _, p in choice.requested_missing)
        for name in choice.missing:
            logger.warning(
                "model %s: execution provider %s requested but not available; using %s%s",
                config.name,
                name,
                [p if isinstance(p, str) else p[0] for p in choice.providers],
                " (models.allow_cpu_fallback)" if name in self.missing_providers else "",
            )

        def new_session(threads: int, *, lone: bool = False) -> ort.InferenceSession:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if lone:
                # A lone run has the device: its threads spin between operators instead of
                # sleeping and waking on each one, and stop when the run returns. Measured
                # (CNN, batch 1, 2 threads): p50 4.3 -> 3.0-3.3 ms and less CPU per run (7.4 ->
                # 6.1-6.6 ms), the futex hand-offs gone.
                options.add_session_config_entry("session.intra_op.allow_spinning", "1")
                options.add_session_config_entry("session.force_spinning_stop", "1")
            else:
                # Idle intra-op threads would otherwise spin, taking a core from the event loop
                # that parses the next requests (measured: 1.9 cores for 1,600 inferences/s on
                # 2 cores).
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            try:
                return ort.InferenceSession(str(path), options, providers=choice.providers)
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises untyped errors
                raise ModelLoadError(f"onnxruntime cannot load {path}: {exc}") from None

        # CPU threads only speed up CPU runs: a GPU model keeps one session (one engine, one
        # copy in device memory).
        cpu_only = choice.providers == [_CPU]
        lone = lone_intra_op_threads if cpu_only and lone_intra_op_threads > intra_op_threads else 0
        self._new_session = functools.partial(new_session, intra_op_threads)
        self._new_lone = functools.partial(new_session, lone, lone=True) if lone else None
        self._session = self._new_session()
        self._lone: ort.InferenceSession | None = None
        self._in_flight = InFlight()  # ORT's run is thread-safe: instances share the sessions
        self.threads = ThreadPlan(intra_op_threads, lone or intra_op_threads)
        # The lone session's arena holds one more run's activations beside the instances'.
        self.extra_runs = 1 if lone else 0
        self.providers: tuple[str, ...] = tuple(self._session.get_providers())
        # ONNX Runtime lists a provider whose libraries are missing (TensorRT on some JetPack
        # releases) and drops it from the session with a warning: that is missing too.
        dropped = [
            (asked, name)
            for asked, name in choice.requested
            if name in available and name not in self.providers
        ]
        if dropped:
            try:
                _decide(model, dropped, self.providers, allow_cpu_fallback)
            except ModelLoadError:
                del self._session
                raise
            self.missing_providers += tuple(name for _, name in dropped)
        if self._new_lone is not None:
            self._lone = self._new_lone()
        self._inputs = tuple(_tensor(t) for t in self._session.get_inputs())
        self._outputs = tuple(_tensor(t) for t in self._session.get_outputs())
        self._string_inputs = frozenset(
            t.name for t in self._inputs if t.type_name == "tensor(string)"
        )
        self._string_outputs = frozenset(
            t.name for t in self._outputs if t.type_name == "tensor(string)"
        )
        # Rank-0 inputs: the config gives them dims of ones (Triton writes [1]); like Triton's
        # ONNX Runtime backend, feed the one element as a scalar.
        self._scalar_inputs = frozenset(t.name for t in self._inputs if t.shape == ())
        self._model = model
        self._guard = SessionGuard(
            f"model '{model}' (onnxruntime)",
            restart_policy or RestartPolicy(),
            probe=self._probe,
            rebuild=self._rebuild,
            listener=health_listener,
            probe_ok=self._probe_passes(),
        )

    @property
    def health(self) -> HealthState:
        """Whether the session serves (`agent.backends.session_health`)."""
        return self._guard.state

    def _probe(self) -> None:
        """One batch-1 run on zeros, straight on the session (raises what it raises)."""
        feeds = {t.name: _zeros(t) for t in self._inputs}
        self._session_run(self._session, feeds, [t.name for t in self._outputs], None)

    def _probe_passes(self) -> bool:
        try:
            self._probe()
        except Exception:  # noqa: BLE001 - a model that fails on zeros: no probe to judge by
            logger.info(
                "model %s: fails on zeros; its run failures are its requests' own", self._model
            )
            return False
        return True

    def _rebuild(self) -> None:
        """New sessions in place of ones that failed the probe (runs after it use the new)."""
        self._session = self._new_session()
        if self._new_lone is not None:
            self._lone = self._new_lone()

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
        """Run one batch. Raises BackendError when ONNX Runtime fails on valid-looking input.

        `shrink_memory` hands the arena's unused chunks back to the system after the run (used
        once after measuring the footprint at max batch, so idle memory does not stay at peak).
        """
        self._guard.wait_ready()
        options = None
        if shrink_memory:
            options = ort.RunOptions()
            options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        alone = self._in_flight.start(time.monotonic())
        session = self._lone if alone and self._lone is not None else self._session
        try:
            return self._session_run(session, feeds, output_names, options)
        except Exception as exc:  # noqa: BLE001 - onnxruntime has no public error types
            error = BackendError(f"onnxruntime failed: {exc}")
        finally:
            self._in_flight.end()
        self._guard.failed(error)  # the session's fault, or this request's? (its probe says)
        raise error

    def _session_run(
        self,
        session: ort.InferenceSession,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        options: ort.RunOptions | None,
    ) -> list[np.ndarray]:
        if self._scalar_inputs:
            feeds = {
                k: (v.reshape(()) if k in self._scalar_inputs and v.size == 1 else v)
                for k, v in feeds.items()
            }
        if self._string_inputs:
            feeds = {
                k: (_bytes_to_str(v) if k in self._string_inputs else v) for k, v in feeds.items()
            }
        results = session.run(list(output_names), dict(feeds), options)
        out = [np.asarray(r) for r in results]
        if self._string_outputs:
            out = [
                _str_to_bytes(a) if n in self._string_outputs else a
                for n, a in zip(output_names, out, strict=True)
            ]
        return out

    def release_memory(self) -> None:
        """Hand the arena's unused chunks back: one batch-1 run on zeros with arena shrinkage
        (ONNX Runtime shrinks only at the end of a run), then the C heap trimmed.

        Raises:
            BackendError: the model does not run on zeros of its smallest shape.
        """
        feeds = {t.name: _zeros(t) for t in self._inputs}
        names = [t.name for t in self._outputs]
        self.run(feeds, names, shrink_memory=True)
        if self._lone is not None:  # the run above took one of the two (idle: the lone one)
            options = ort.RunOptions()
            options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
            try:
                self._session_run(self._session, feeds, names, options)
            except Exception as exc:  # noqa: BLE001 - onnxruntime has no public error types
                raise BackendError(f"onnxruntime failed: {exc}") from None
        trim_c_heap()

    def close(self) -> None:
        self._guard.close()
        del self._session
        self._lone = None


def _zeros(tensor: ModelTensor) -> np.ndarray:
    shape = tuple(1 if d is None else d for d in tensor.shape)
    if tensor.datatype is None or tensor.datatype.kserve == "BYTES":
        return np.full(shape, b"", dtype=np.object_)
    return np.zeros(shape, tensor.datatype.numpy)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def trim_c_heap() -> None:
    """glibc keeps freed heap pages mapped; malloc_trim gives them back (no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _tensor(arg: Any) -> ModelTensor:
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in (arg.shape or ()))
    return ModelTensor(arg.name, datatypes.from_onnx(arg.type), arg.type, shape)


def _bytes_to_str(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=np.object_)
    out.ravel()[:] = [
        b.decode("utf-8", "surrogateescape") if isinstance(b, bytes) else b for b in arr.ravel()
    ]
    return out


def _str_to_bytes(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=np.object_)
    out.ravel()[:] = [
        s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s for s in arr.ravel()
    ]
    return out
