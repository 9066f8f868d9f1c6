"""Device memory in the budget, on a fake device-memory probe (no GPU here): the fit check's
figures, which versions run on a GPU, and a GPU version refused at load when its GPU is full
while CPU versions load as before. The real probe runs in tests/gpu/test_nvml_metrics.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import MemoryBudgetError
from agent.models.device_memory import (
    DeviceMemory,
    MemoryKind,
    check_device_fit,
    device_need_bytes,
    gpu_device,
)
from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from agent.repository.model_config import parse_model_config
from tests.fakes import FakeGpuMemory
from tests.models import VERSIONED_CONFIG, scale_model, write_model

MIB = 1 << 20


def test_fits_within_free_memory_less_headroom() -> None:
    memory = DeviceMemory(0, 1000 * MIB, 300 * MIB)
    check_device_fit(200 * MIB, memory, model="m", version=1)  # 300 free - 100 kept
    with pytest.raises(MemoryBudgetError) as info:
        check_device_fit(201 * MIB, memory, model="m", version=1)
    assert info.value.message == (
        "model 'm' version 1 needs 201 MiB of GPU 0 memory, 200 MiB usable: 300 MiB free of "
        "1000 MiB, 100 MiB kept free"
    )
    check_device_fit(300 * MIB, memory, model="m", version=1, headroom=0.0)
    with pytest.raises(ValueError, match="headroom"):
        check_device_fit(1, memory, model="m", version=1, headroom=1.0)


def test_need_is_twice_the_weights() -> None:
    assert device_need_bytes(50 * MIB) == 100 * MIB
    assert device_need_bytes(-1) == 0


@pytest.mark.parametrize(
    ("config", "tensorrt", "device"),
    [
        ("", True, 0),
        ("instance_group [ { kind: KIND_GPU gpus: [ 1, 0 ] } ]", False, 1),
        ("instance_group [ { kind: KIND_GPU } ]", False, 0),
        ("instance_group [ { kind: KIND_CPU } ]", False, None),
        ("", False, None),
        (
            "optimization { execution_accelerators { gpu_execution_accelerator "
            '[ { name: "tensorrt" } ] } }',
            False,
            0,
        ),
    ],
)
def test_which_gpu_a_version_runs_on(config: str, tensorrt: bool, device: int | None) -> None:
    assert gpu_device(parse_model_config(config, "m"), tensorrt=tensorrt) == device


GPU_GROUP = "instance_group [ { kind: KIND_GPU } ]\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(
        root, "on_gpu", scale_model(2.0), VERSIONED_CONFIG.format(name="on_gpu") + GPU_GROUP
    )
    write_model(root, "on_cpu", scale_model(3.0), VERSIONED_CONFIG.format(name="on_cpu"))
    return root


@pytest.fixture
def registry(repo: Path) -> Iterator[ModelRegistry]:
    reg = ModelRegistry(repo, LoadSettings(intra_op_threads=1))
    yield reg
    reg.close()


def test_fake_gpu_full_refuses_the_gpu_version_with_the_figures(registry: ModelRegistry) -> None:
    probe = FakeGpuMemory(free=0, total=16_000 * MIB)
    registry.loader.device_memory = probe
    failed = registry.load_all()
    assert set(failed) == {"on_gpu"}  # the CPU model is not checked against the GPU
    assert "KiB of GPU 0 memory, 0 MiB usable: 0 MiB free of 16000 MiB" in failed["on_gpu"]
    assert probe.read_devices == [0]
    rows = {r["name"]: r for r in registry.index()}
    assert rows["on_cpu"]["state"] == "READY"
    assert "GPU 0 memory" in rows["on_gpu"]["reason"]


def test_fake_gpu_integrated_memory_is_not_checked_apart(registry: ModelRegistry) -> None:
    """Jetson: device memory is RAM, so the GPU version meets the host rules only."""
    probe = FakeGpuMemory(free=0, total=8_000 * MIB, kind=MemoryKind.UNIFIED)
    registry.loader.device_memory = probe
    failed = registry.load_all()
    assert probe.read_devices == []
    assert "GPU 0 memory" not in failed.get("on_gpu", "")
