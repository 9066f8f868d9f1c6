"""The GPUs' figures: NVML where the NVIDIA driver is, else `tegrastats` (Jetson).

The one GPU reader of the agent: `/metrics`, MQTT telemetry and `edge-agent doctor` all read
through it (it sits in `agent.device`, the bottom layer, so the doctor needs no serving stack).

`GpuReading` carries what Triton's GPU metrics report, per GPU (and the GPU's name, for the
doctor and the fleet): utilisation (0.0 to 1.0), memory
total and used (bytes), power draw and power-management limit (watts) and the energy used since
the agent started (joules). A `GpuReader` returns one reading per GPU; `CachedGpuReader` reads at
most once per interval, so scrapes and telemetry ticks share one NVML pass (Triton collects on
an interval too, `--metrics-interval-ms`, 2000 by default).

* `NvmlReader` uses NVIDIA's `nvidia-ml-py` (import name `pynvml`, the `gpu` extra), injected as
  a module typed by `NvmlApi`, so a test can pass a fake one. NVML's units are milliwatts and
  millijoules; energy is counted from the first reading, as Triton counts it from its start.
* `TegrastatsReader` runs `tegrastats` for one line (Jetson has no NVML) and parses it with
  `agent.device.tegra`; its GPU shares the RAM, so memory is the board's.

`detect_gpu_reader` picks NVML, else tegrastats, else None (and logs why, once).
"""

from __future__ import annotations

import importlib
import logging
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from agent.device.tegra import parse_tegrastats

logger = logging.getLogger(__name__)

__all__ = [
    "CachedGpuReader",
    "GpuReader",
    "GpuReading",
    "NvmlApi",
    "NvmlReader",
    "TegrastatsReader",
    "detect_gpu_reader",
]


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's figures, in Triton's units; None where the source does not report one."""

    index: int
    uuid: str  # Triton's `gpu_uuid` label ("GPU-..."; "tegra-0" for a Jetson's GPU)
    utilization: float | None  # 0.0 to 1.0
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    power_w: float | None
    power_limit_w: float | None
    energy_j: float | None  # since the agent started
    name: str | None = None  # the product name NVML gives ("NVIDIA H200"); None from tegrastats

    def to_json(self) -> dict[str, Any]:
        """The MQTT telemetry and doctor entry: the reported figures only (None ones left out)."""
        body: dict[str, Any] = {"index": self.index, "uuid": self.uuid}
        if self.name is not None:
            body["name"] = self.name
        if self.utilization is not None:
            body["util_percent"] = round(self.utilization * 100)
        for key, value in (
            ("memory_used_bytes", self.memory_used_bytes),
            ("memory_total_bytes", self.memory_total_bytes),
            ("power_w", self.power_w),
            ("power_limit_w", self.power_limit_w),
            ("energy_j", self.energy_j),
        ):
            if value is not None:
                body[key] = round(value, 3) if isinstance(value, float) else value
        return body


class GpuReader(Protocol):
    """Reads every GPU once; an empty list when it cannot."""

    def read(self) -> list[GpuReading]: ...


class NvmlApi(Protocol):
    """The `pynvml` functions the reader calls (names as nvidia-ml-py spells them)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...  # bytes before nvidia-ml-py 11.5
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu: percent
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .total, .used: bytes
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # milliwatts
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int: ...  # milliwatts
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...  # millijoules


class NvmlReader:
    """Every GPU NVML sees (see the module docstring). Call `read` from one thread at a time."""

    def __init__(self, nvml: NvmlApi) -> None:
        self._nvml = nvml
        self._energy_start: dict[str, int] = {}

    @classmethod
    def open(cls, nvml: NvmlApi | ModuleType | None = None) -> tuple[NvmlReader | None, str]:
        """Initialise NVML; (None, why) where `pynvml` or the driver is missing."""
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")  # optional: the `gpu` extra
            except ImportError as exc:
                return None, f"nvidia-ml-py is not installed ({exc})"
        api: NvmlApi = nvml  # a module (Any) or a fake with these calls
        try:
            api.nvmlInit()
            count = api.nvmlDeviceGetCount()
        except api.NVMLError as exc:
            return None, f"NVML cannot start: {exc}"
        if count == 0:
            return None, "NVML sees no GPU"
        return cls(api), f"NVML, {count} GPU(s)"

    def read(self) -> list[GpuReading]:
        """One reading per GPU; figures a GPU does not support are None."""
        api = self._nvml
        try:
            count = api.nvmlDeviceGetCount()
        except api.NVMLError as exc:
            logger.debug("NVML device count failed: %s", exc)
            return []
        readings = []
        for index in range(count):
            try:
                handle = api.nvmlDeviceGetHandleByIndex(index)
                uuid = str(api.nvmlDeviceGetUUID(handle))
                memory = api.nvmlDeviceGetMemoryInfo(handle)
            except api.NVMLError as exc:
                logger.debug("NVML GPU %d failed: %s", index, exc)
                continue
            name = self._optional(api.nvmlDeviceGetName, handle)
            busy = self._optional(api.nvmlDeviceGetUtilizationRates, handle)
            power = self._optional(api.nvmlDeviceGetPowerUsage, handle)
            limit = self._optional(api.nvmlDeviceGetPowerManagementLimit, handle)
            energy = self._optional(api.nvmlDeviceGetTotalEnergyConsumption, handle)
            if energy is not None:
                energy = int(energy) - self._energy_start.setdefault(uuid, int(energy))
            readings.append(
                GpuReading(
                    index=index,
                    uuid=uuid,
                    utilization=int(busy.gpu) / 100 if busy is not None else None,
                    memory_total_bytes=int(memory.total),
                    memory_used_bytes=int(memory.used),
                    power_w=int(power) / 1000 if power is not None else None,
                    power_limit_w=int(limit) / 1000 if limit is not None else None,
                    energy_j=energy / 1000 if energy is not None else None,
                    name=_text(name) if name is not None else None,
                )
            )
        return readings

    def _optional(self, call: Callable[[Any], Any], handle: Any) -> Any:
        """A figure some GPUs do not report (NVML_ERROR_NOT_SUPPORTED): None then."""
        try:
            return call(handle)
        except self._nvml.NVMLError:
            return None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class TegrastatsReader:
    """Jetson: one line of `tegrastats`, parsed (at most 5 s)."""

    def __init__(self, command: Sequence[str]) -> None:
        self._command = list(command)

    @classmethod
    def open(cls) -> tuple[TegrastatsReader | None, str]:
        """(None, why) where `tegrastats` is not on the PATH."""
        found = shutil.which("tegrastats")
        if found is None:
            return None, "tegrastats is not on the PATH"
        return cls([found, "--interval", "500"]), "tegrastats"

    def read(self) -> list[GpuReading]:
        """The GPU's reading from the first line tegrastats prints; [] when it prints none."""
        try:
            with subprocess.Popen(self._command, stdout=subprocess.PIPE, text=True) as proc:
                timer = threading.Timer(5.0, proc.kill)
                timer.start()
                try:
                    line = proc.stdout.readline() if proc.stdout else ""
                finally:
                    timer.cancel()
                    proc.kill()
        except OSError as exc:
            logger.debug("tegrastats failed: %s", exc)
            return []
        parsed = parse_tegrastats(line)
        if parsed is None:
            return []
        return [
            GpuReading(
                index=0,
                uuid="tegra-0",
                utilization=parsed.utilization,
                memory_total_bytes=parsed.memory_total_bytes,
                memory_used_bytes=parsed.memory_used_bytes,
                power_w=parsed.power_w,
                power_limit_w=None,
                energy_j=None,
            )
        ]


class CachedGpuReader:
    """Reads through `reader` at most once per `interval_s`; thread-safe.

    Args:
        reader: the real reader.
        clock: monotonic seconds.
        interval_s: how old a reading may be before the next call reads again.
    """

    def __init__(self, reader: GpuReader, clock: Callable[[], float], interval_s: float) -> None:
        self._reader = reader
        self._clock = clock
        self._interval = interval_s
        self._lock = threading.Lock()
        self._at: float | None = None
        self._last: list[GpuReading] = []

    def read(self) -> list[GpuReading]:
        """The last reading when younger than the interval, else a fresh one."""
        with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= self._interval:
                self._last = self._reader.read()
                self._at = now
            return list(self._last)


def detect_gpu_reader() -> GpuReader | None:
    """NVML, else tegrastats, else None; logs which (or why none)."""
    nvml, why_not_nvml = NvmlReader.open()
    if nvml is not None:
        logger.info("GPU metrics from %s", why_not_nvml)
        return nvml
    tegra, why_not_tegra = TegrastatsReader.open()
    if tegra is not None:
        logger.info("GPU metrics from tegrastats (%s)", why_not_nvml)
        return tegra
    logger.info("no GPU metrics: %s; %s", why_not_nvml, why_not_tegra)
    return None
