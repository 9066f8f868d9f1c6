"""The doctor's judgements over device facts (pure): simulated Jetsons and GPU hosts, this host."""

from __future__ import annotations

from typing import Any

from agent.backends.onnx import ACCELERATORS
from agent.device.checks import (
    ACCELERATOR_PROVIDERS,
    Status,
    accelerator_checks,
    agent_checks,
    device_checks,
    worst,
)

GIB = 1 << 30


def facts(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "platform": {
            "machine": "aarch64",
            "system": "Linux",
            "python": "3.10.12",
            "executable": "/opt/edge-agent/venv/bin/python",
            "virtualenv": True,
        },
        "jetson": None,
        "cpu": {"count": 6, "model": "ARMv8 Processor rev 1 (v8l)"},
        "memory": {"total_bytes": 8 * GIB},
        "gpu": None,
        "cuda": {"toolkit": None, "driver": None},
        "tensorrt": {"version": None, "error": "ModuleNotFoundError: No module named 'tensorrt'"},
        "onnxruntime": {
            "version": "1.20.1",
            "providers": ["CPUExecutionProvider"],
            "distributions": ["onnxruntime==1.20.1"],
        },
    }
    base.update(changes)
    return base


ORIN_NANO_JP62 = {
    "release_file": "/etc/nv_tegra_release",
    "l4t": "36.4.3",
    "jetpack": "6.2",
    "board": "generic",
    "supported": True,
    "unsupported_reason": None,
}


def by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_a_cpu_host_with_the_cpu_runtime_is_all_ok() -> None:
    checks = device_checks(facts())
    assert worst(checks) is Status.OK, [c.to_json() for c in checks]


def test_no_onnxruntime_fails_and_names_the_extras() -> None:
    missing: dict[str, Any] = {"version": None, "error": "ModuleNotFoundError", "distributions": []}
    checks = by_name(device_checks(facts(onnxruntime=missing)))
    assert checks["onnxruntime"].status is Status.FAIL
    assert "edge-agent[cpu]" in checks["onnxruntime"].fix
    assert "Jetson index" in checks["onnxruntime"].fix


def test_two_onnxruntime_distributions_fail_with_the_uninstall_fix() -> None:
    both = {
        "version": "1.20.1",
        "providers": ["CPUExecutionProvider"],
        "distributions": ["onnxruntime==1.20.1", "onnxruntime-gpu==1.20.0"],
    }
    checks = by_name(device_checks(facts(onnxruntime=both)))
    assert checks["onnxruntime install"].status is Status.FAIL
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in checks["onnxruntime install"].fix


def test_simulated_jetson_with_jetpack_runtimes_is_ok() -> None:
    jetson = facts(
        jetson=ORIN_NANO_JP62,
        gpu=[{"index": 0, "util_percent": 3, "memory_used_bytes": GIB,
              "memory_total_bytes": 8 * GIB}],
        cuda={"toolkit": "12.6.68", "driver": "12.6"},
        tensorrt={"version": "10.3.0", "path": "/usr/lib/python3.10/dist-packages/tensorrt"},
        onnxruntime={
            "version": "1.20.0",
            "providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                          "CPUExecutionProvider"],
            "distributions": ["onnxruntime-gpu==1.20.0"],
        },
    )  # fmt: skip
    checks = device_checks(jetson)
    assert worst(checks) is Status.OK, [c.to_json() for c in checks]
    named = by_name(checks)
    assert "L4T 36.4.3 (JetPack 6.2)" in named["jetson"].detail
    assert "shared with the CPU" in named["gpu"].detail


def test_simulated_jetson_without_system_site_packages_warns_about_tensorrt() -> None:
    checks = by_name(device_checks(facts(jetson=ORIN_NANO_JP62)))
    assert checks["tensorrt"].status is Status.WARN
    assert "--system-site-packages" in checks["tensorrt"].fix
    assert checks["onnxruntime"].status is Status.WARN  # CPU-only runtime on a GPU board
    assert "Jetson index" in checks["onnxruntime"].fix


def test_simulated_jetpack_5_fails() -> None:
    jp5 = {
        "release_file": "/etc/nv_tegra_release",
        "l4t": "35.4.1",
        "jetpack": "5.1.2",
        "board": "t186ref",
        "supported": False,
        "unsupported_reason": "L4T 35.4.1 (JetPack 5.1.2) ships Python 3.8; ...: flash JetPack 6",
    }
    checks = by_name(device_checks(facts(jetson=jp5)))
    assert checks["jetson"].status is Status.FAIL
    assert "flash JetPack 6" in checks["jetson"].fix


def test_simulated_x86_gpu_host_with_cpu_runtime_warns_to_use_the_gpu_extra() -> None:
    gpu = [
        {"index": 0, "uuid": "GPU-0", "name": "Tesla T4", "util_percent": 0,
         "memory_used_bytes": GIB, "memory_total_bytes": 16 * GIB}
    ]  # fmt: skip
    checks = by_name(device_checks(facts(gpu=gpu, cuda={"toolkit": None, "driver": "12.4"})))
    assert checks["gpu"].detail == "GPU 0 (Tesla T4): 16384 MiB, 1024 MiB used"
    assert checks["onnxruntime"].status is Status.WARN
    assert "edge-agent[gpu]" in checks["onnxruntime"].fix
    assert checks["tensorrt"].status is Status.WARN


def agent(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "config": {"file": "/etc/edge-agent/agent.toml", "error": None},
        "models_source": "the model cache's repository view (/var/lib/edge-agent)",
        "cgroup_memory_max": 2 * GIB,
        "memory_budget": {"bytes": 2 * GIB, "source": "cgroup memory.max"},
        "ports": [{"name": "http", "host": "0.0.0.0", "port": 8000, "in_use": False}],
        "paths": [{"name": "cache.dir", "path": "/var/lib/edge-agent", "exists": True,
                   "writable": True}],
        "endpoints": [{"name": "broker", "target": "mqtt.example:8883", "reachable": True}],
    }  # fmt: skip
    base.update(changes)
    return base


def test_agent_side_all_ok() -> None:
    checks = agent_checks(agent())
    assert worst(checks) is Status.OK, [c.to_json() for c in checks]
    assert by_name(checks)["memory budget"].detail == "2048 MiB (cgroup memory.max)"


def test_a_config_that_does_not_load_fails_alone() -> None:
    checks = agent_checks(agent(config={"file": "/x.toml", "error": "unknown key [server] foo"}))
    assert [(c.name, c.status) for c in checks] == [("config", Status.FAIL)]


def test_a_tiny_budget_fails_and_an_unreachable_broker_warns() -> None:
    checks = by_name(
        agent_checks(
            agent(
                memory_budget={"bytes": 64 << 20, "source": "config"},
                endpoints=[
                    {"name": "broker", "target": "b:1883", "reachable": False, "error": "refused"}
                ],
                ports=[{"name": "http", "host": "0.0.0.0", "port": 8000, "in_use": True}],
            )
        )
    )
    assert checks["memory budget"].status is Status.FAIL
    assert checks["broker"].status is Status.WARN
    assert "refused" in checks["broker"].detail
    assert checks["port http"].status is Status.WARN


def test_no_model_source_warns() -> None:
    checks = by_name(agent_checks(agent(models_source=None)))
    assert checks["models"].status is Status.WARN


def accelerators(**agent: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "accelerators": [{"model": "det", "names": ["tensorrt"]}],
        "allow_cpu_fallback": False,
        "exit_on_error": True,
    }
    return {**base, **agent}


def test_a_model_asking_for_a_missing_accelerator_is_refused_and_stops_start_up() -> None:
    (line,) = accelerator_checks(accelerators(), facts())
    assert line.name == "model det"
    assert line.status is Status.FAIL
    assert (
        "will be refused: its config asks for tensorrt (TensorrtExecutionProvider)" in line.detail
    )
    assert "models.allow_cpu_fallback = true" in line.fix


def test_without_exit_on_error_a_refused_model_only_warns() -> None:
    (line,) = accelerator_checks(accelerators(exit_on_error=False), facts())
    assert line.status is Status.WARN
    assert "start-up stops" not in line.detail


def test_the_cpu_fallback_is_shown_as_a_warning() -> None:
    (line,) = accelerator_checks(accelerators(allow_cpu_fallback=True), facts())
    assert line.status is Status.WARN
    assert line.detail.startswith("CPU fallback: tensorrt (TensorrtExecutionProvider)")


def test_an_accelerator_the_runtime_has_is_ok() -> None:
    gpu = {
        "version": "1.20.1",
        "providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
        "distributions": ["onnxruntime-gpu==1.20.1"],
    }
    (line,) = accelerator_checks(accelerators(), facts(onnxruntime=gpu))
    assert line.status is Status.OK


def test_an_unknown_accelerator_is_refused_even_with_the_fallback() -> None:
    agent = accelerators(accelerators=[{"model": "det", "names": ["tensorrtt"]}])
    (line,) = accelerator_checks({**agent, "allow_cpu_fallback": True}, facts())
    assert line.status is Status.FAIL
    assert "tensorrtt (unknown accelerator)" in line.detail


def test_no_model_asking_for_accelerators_adds_no_line() -> None:
    assert accelerator_checks(accelerators(accelerators=[]), facts()) == []


def test_the_doctor_maps_accelerators_as_the_onnx_backend_does() -> None:
    assert ACCELERATOR_PROVIDERS == ACCELERATORS


def test_the_footprint_is_reported_as_ok_lines() -> None:
    from agent.device.checks import footprint_checks

    checks = by_name(
        footprint_checks(
            {
                "install": {
                    "beyond_runtime_bytes": 61_000_000,
                    "distributions": 30,
                    "largest": [["cryptography", 15_600_000], ["uvloop", 14_100_000]],
                },
                "extras": {"s3": True, "otel": False},
                "imports": {
                    "seconds": 0.4,
                    "rss_bytes": 84 << 20,
                    "packages": ["agent", "aiohttp"],
                },
                "running": [
                    {
                        "pid": 42,
                        "rss_bytes": 98 << 20,
                        "uss_bytes": 53 << 20,
                        "threads": 10,
                        "native_packages": ["numpy", "onnxruntime"],
                    }
                ],
            }
        )
    )
    assert {c.status for c in checks.values()} == {Status.OK}
    assert (
        "61 MB beyond onnxruntime and numpy in 30 distributions"
        in checks["footprint install"].detail
    )
    assert "extras: s3" in checks["footprint install"].detail
    assert "serve imports 2 packages in 0.40 s" in checks["footprint imports"].detail
    assert checks["footprint agent 42"].detail.startswith("RSS 98 MiB, USS 53 MiB, 10 threads")


def test_no_running_agent_and_failing_imports() -> None:
    from agent.device.checks import footprint_checks

    checks = by_name(
        footprint_checks(
            {
                "install": {"error": "not installed"},
                "extras": {},
                "imports": {"error": "ModuleNotFoundError: onnxruntime"},
                "running": [],
            }
        )
    )
    assert checks["footprint agent"].detail == "no running agent found"
    assert checks["footprint imports"].status is Status.WARN
    assert checks["footprint install"].detail == "not installed; extras: none"
