"""NVML on a real GPU: Triton's `nv_gpu_*` metrics on a running agent's `/metrics` with plausible
values, the same reader in `edge-agent doctor` (GPU name and memory), and the device-memory probe
the load check uses."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from agent.device.checks import device_checks
from agent.device.facts import device_facts
from agent.device.gpu import NvmlReader, detect_gpu_reader
from agent.models.device_memory import MemoryKind, detect_device_memory
from agent.runtime.demo import write_demo_repository
from tests.prometheus_text import read_families
from tests.support import free_port, wait_listening

pytestmark = pytest.mark.needs_nvml


@pytest.fixture(scope="module")
def metrics_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    repo = write_demo_repository(tmp_path_factory.mktemp("nvml") / "models")
    port = free_port()
    command = [sys.executable, "-m", "agent", "serve", "--model-repository", str(repo)]
    command += ["--http-port", "0", "--grpc-port", "-1", "--metrics-port", str(port)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(proc)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()


def test_gpu_metrics_on_the_agents_metrics_endpoint(metrics_port: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values: dict[str, dict[str, float]] = {}
    for family in read_families(text):
        for s in family.samples:
            if s.name.startswith(("nv_gpu", "nv_energy")):
                values.setdefault(s.name, {})[s.labels["gpu_uuid"]] = s.value
    print("\n".join(line for line in text.splitlines() if "nv_gpu" in line or "nv_energy" in line))
    uuids = set(values["nv_gpu_memory_total_bytes"])
    assert uuids
    assert all(u.startswith(("GPU-", "MIG-")) for u in uuids)
    for uuid in uuids:
        total = values["nv_gpu_memory_total_bytes"][uuid]
        assert total >= 1 << 30
        assert 0 < values["nv_gpu_memory_used_bytes"][uuid] <= total
        assert 0.0 <= values["nv_gpu_utilization"][uuid] <= 1.0
        if uuid in values.get("nv_gpu_power_limit", {}):
            limit = values["nv_gpu_power_limit"][uuid]
            assert 10 <= limit <= 2000  # watts
            assert 0 < values["nv_gpu_power_usage"][uuid] <= limit * 1.5
        if uuid in values.get("nv_energy_consumption", {}):
            assert values["nv_energy_consumption"][uuid] >= 0


def test_reader_sees_the_gpus() -> None:
    reader, why = NvmlReader.open()
    assert reader is not None, why
    readings = reader.read()
    print(why, readings)
    assert readings
    assert all(r.memory_total_bytes for r in readings)
    assert all(r.name for r in readings)  # "NVIDIA H200" ...


def test_doctor_names_the_gpu_and_its_memory() -> None:
    reader = detect_gpu_reader()
    assert isinstance(reader, NvmlReader)
    facts = device_facts(gpu_reader=reader)
    (gpu,) = [c for c in device_checks(facts) if c.name == "gpu"]
    print(gpu.detail)
    first = facts["gpu"][0]
    assert f"GPU 0 ({first['name']}): " in gpu.detail
    assert "MiB used" in gpu.detail


def test_device_memory_probe_reads_free_memory() -> None:
    probe, why = detect_device_memory()
    assert probe is not None, why
    memory = probe.read(0)
    print(why, memory)
    assert memory is not None
    assert probe.kind is MemoryKind.DISCRETE
    assert 0 < memory.free_bytes <= memory.total_bytes
