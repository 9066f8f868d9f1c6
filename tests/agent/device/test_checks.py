"""The doctor's judgements over device facts (pure): simulated Jetsons and GPU hosts, this host."""

from __future__ import annotations

from typing import Any

from agent.device.checks import Status, agent_checks, device_checks, worst

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
