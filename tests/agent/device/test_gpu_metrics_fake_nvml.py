"""GPU telemetry end to end on a fake NVML module (no GPU here): `/metrics` over HTTP with Triton's
`nv_gpu_*` families and `gpu_uuid` labels, the same figures in MQTT telemetry and in the doctor's
report, and the reader's units, unsupported figures and failures. The real NVML runs in
tests/gpu/test_nvml_metrics.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from agent.api.metrics import build_registry, create_metrics_app, render
from agent.device.checks import device_checks
from agent.device.facts import device_facts
from agent.device.gpu import CachedGpuReader, GpuReading, NvmlReader
from agent.fleet.telemetry import TelemetrySampler
from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from agent.scheduling.statistics import StatisticsRegistry
from tests.fakes import FakeClock, FakeNvml, FakeNvmlGpu
from tests.prometheus_text import read_families

H200 = "GPU-6f1c0a2e-0000-4000-8000-000000000001"
OLD = "GPU-6f1c0a2e-0000-4000-8000-000000000002"


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeNvmlGpu(
                H200, 37, 150_000 << 20, 2_000 << 20, 123_456, 700_000, 5_000_000, "NVIDIA H200"
            ),
            FakeNvmlGpu(OLD, 0, 16_000 << 20, 300 << 20, None, None, None, b"Tesla T4"),
        ]
    )


def open_reader(nvml: FakeNvml) -> NvmlReader:
    reader, why = NvmlReader.open(nvml)
    assert reader is not None, why
    return reader


def samples(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("gpu_uuid", "")): s.value
        for family in read_families(text)
        for s in family.samples
        if s.name.startswith(("nv_gpu", "nv_energy"))
    }


def test_fake_nvml_readings_in_triton_units() -> None:
    first, second = open_reader(two_gpus()).read()
    assert first == GpuReading(
        0, H200, 0.37, 150_000 << 20, 2_000 << 20, 123.456, 700.0, 0.0, "NVIDIA H200"
    )
    assert second.name == "Tesla T4"  # older nvidia-ml-py gives the name as bytes
    # A GPU without power figures (NVML_ERROR_NOT_SUPPORTED) reads None there, not 0.
    assert (second.power_w, second.power_limit_w, second.energy_j) == (None, None, None)
    assert second.utilization == 0.0


def test_fake_nvml_energy_counts_from_the_first_reading() -> None:
    nvml = two_gpus()
    reader = open_reader(nvml)
    assert reader.read()[0].energy_j == 0.0
    nvml.gpus[0].energy_mj = 5_002_500
    assert reader.read()[0].energy_j == 2.5


def test_fake_nvml_metrics_scraped_over_http() -> None:
    nvml = two_gpus()
    clock = FakeClock(start=0.0, step=0.0)
    gpu = CachedGpuReader(open_reader(nvml), clock, 2.0)
    registry = build_registry(StatisticsRegistry(), None, gpu=gpu)

    async def scrape() -> str:
        async with TestClient(TestServer(create_metrics_app(registry))) as client:
            resp = await client.get("/metrics")
            assert resp.status == 200
            return await resp.text()

    text = asyncio.run(scrape())
    found = samples(text)
    assert found == {
        ("nv_gpu_utilization", H200): 0.37,
        ("nv_gpu_utilization", OLD): 0.0,
        ("nv_gpu_memory_total_bytes", H200): float(150_000 << 20),
        ("nv_gpu_memory_total_bytes", OLD): float(16_000 << 20),
        ("nv_gpu_memory_used_bytes", H200): float(2_000 << 20),
        ("nv_gpu_memory_used_bytes", OLD): float(300 << 20),
        ("nv_gpu_power_usage", H200): 123.456,
        ("nv_gpu_power_limit", H200): 700.0,
        ("nv_energy_consumption", H200): 0.0,
    }
    # Triton's names exactly: energy is a counter without a `_total` suffix.
    assert "# TYPE nv_energy_consumption counter" in text
    assert "# TYPE nv_gpu_utilization gauge" in text
    # Within the interval a scrape reuses the reading; after it, NVML is read again.
    nvml.gpus[0].busy_percent = 90
    assert samples(render(registry)[0].decode())["nv_gpu_utilization", H200] == 0.37
    clock.now = 2.0
    assert samples(render(registry)[0].decode())["nv_gpu_utilization", H200] == 0.9


def test_fake_nvml_figures_in_mqtt_telemetry(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path, LoadSettings(intra_op_threads=1))
    sampler = TelemetrySampler(registry, None, started=0.0, gpu=open_reader(two_gpus()))
    body, _ = sampler.sample(10.0)
    assert body["gpu"] == [
        {
            "index": 0,
            "uuid": H200,
            "name": "NVIDIA H200",
            "util_percent": 37,
            "memory_used_bytes": 2_000 << 20,
            "memory_total_bytes": 150_000 << 20,
            "power_w": 123.456,
            "power_limit_w": 700.0,
            "energy_j": 0.0,
        },
        {
            "index": 1,
            "uuid": OLD,
            "name": "Tesla T4",
            "util_percent": 0,
            "memory_used_bytes": 300 << 20,
            "memory_total_bytes": 16_000 << 20,
        },
    ]


def test_fake_nvml_in_the_doctors_report(tmp_path: Path) -> None:
    """The doctor reads the GPUs through the same reader: names and memory per GPU."""
    facts = device_facts(tegra_release=tmp_path / "absent", gpu_reader=open_reader(two_gpus()))
    assert [(g["name"], g["memory_total_bytes"]) for g in facts["gpu"]] == [
        ("NVIDIA H200", 150_000 << 20),
        ("Tesla T4", 16_000 << 20),
    ]
    (gpu,) = [c for c in device_checks(facts) if c.name == "gpu"]
    assert gpu.detail == (
        "GPU 0 (NVIDIA H200): 150000 MiB, 2000 MiB used; GPU 1 (Tesla T4): 16000 MiB, 300 MiB used"
    )


def test_fake_nvml_that_cannot_start_gives_no_reader_and_says_why() -> None:
    reader, why = NvmlReader.open(FakeNvml([], start_fails=True))
    assert reader is None
    assert "Driver Not Loaded" in why
    reader, why = NvmlReader.open(FakeNvml([]))
    assert (reader, why) == (None, "NVML sees no GPU")


def test_without_gpu_reader_no_gpu_families_or_key(tmp_path: Path) -> None:
    text = render(build_registry(StatisticsRegistry(), None))[0].decode()
    assert "nv_gpu" not in text
    assert "nv_energy" not in text
    registry = ModelRegistry(tmp_path, LoadSettings(intra_op_threads=1))
    body, _ = TelemetrySampler(registry, None, started=0.0).sample(1.0)
    assert "gpu" not in body
