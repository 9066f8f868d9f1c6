"""The Ansible role for a Jetson, run for real into a temporary root on this (x86) machine.

What JetPack would provide is simulated, and named so:
- `/etc/nv_tegra_release` under the temporary root (JetPack 6.2, then JetPack 5.1.2);
- JetPack's system Python packages (python3-libnvinfer's `tensorrt`, plus the agent's
  dependencies, which a real install takes from PyPI) in a "system" site directory that a venv
  sees only when it is created with system site packages (the user site: Python enables it in a
  venv exactly when include-system-site-packages is true);
- onnxruntime-gpu from NVIDIA's Jetson index: a stand-in wheel of the pinned version in a local
  folder (pip runs with --no-index).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.agent.device.test_tegra import JP62_ORIN_NANO, JP512_XAVIER_NX
from tests.deploy.test_ansible import ANSIBLE_DIR, ansible_env, build_wheel, tool

PINNED_ORT = "1.20.0"  # edge_agent_jetson_releases["36.4"].onnxruntime_gpu in the role
FAKE_TRT = "10.3.0"
SKIPPED = ("onnxruntime", "agent", "sync", "model_cache", "edge_agent", "__editable__")


def simulated_jetpack_system_site(base: Path) -> Path:
    """A user base whose site dir holds the simulated JetPack packages and the agent's deps."""
    site = base / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.startswith(SKIPPED) or entry.suffix == ".pth":
            continue  # no runtime of our own, no path hooks back into this checkout
        (site / entry.name).symlink_to(entry)
    trt = site / "tensorrt"
    trt.mkdir()
    (trt / "__init__.py").write_text(
        f'"""Simulated JetPack python3-libnvinfer."""\n__version__ = "{FAKE_TRT}"\n'
    )
    return base


def simulated_jetson_onnxruntime_gpu_wheel(folder: Path) -> Path:
    """A stand-in for NVIDIA's Jetson onnxruntime-gpu wheel (the pinned version)."""
    folder.mkdir()
    name = f"onnxruntime_gpu-{PINNED_ORT}"
    wheel = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr(
            "onnxruntime/__init__.py",
            '"""Simulated Jetson onnxruntime-gpu."""\n'
            f'__version__ = "{PINNED_ORT}"\n\n\ndef get_available_providers():\n'
            '    return ["TensorrtExecutionProvider", "CUDAExecutionProvider", '
            '"CPUExecutionProvider"]\n',
        )
        whl.writestr(
            f"{name}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: {PINNED_ORT}\n",
        )
        whl.writestr(
            f"{name}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        whl.writestr(f"{name}.dist-info/RECORD", "")
    return folder


def run_role(work: Path, root: Path, wheel: Path, links: Path, user_base: Path) -> str:
    playbook = tool("ansible-playbook")
    extra: dict[str, object] = {
        "edge_agent_root_prefix": str(root),
        "edge_agent_manage_service": False,
        "edge_agent_manage_user": False,
        "edge_agent_user": "root",
        "edge_agent_group": "root",
        "edge_agent_wheel": str(wheel),
        "edge_agent_python": sys.executable,
        "edge_agent_device_class": "jetson",
        "edge_agent_pip_extra_args": f"--no-deps --no-index --find-links {links}",
        "edge_agent_run_doctor": True,
    }
    (work / "vars.json").write_text(json.dumps(extra))
    inventory = work / "hosts.yml"
    inventory.write_text(
        "edge_agents:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    env = dict(ansible_env(), PYTHONUSERBASE=str(user_base))
    done = subprocess.run(
        [str(playbook), "-i", str(inventory), "site.yml", "-e", f"@{work / 'vars.json'}"],
        cwd=ANSIBLE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert "PLAY RECAP" in done.stdout, done.stdout + done.stderr
    return done.stdout if done.returncode == 0 else "FAILED\n" + done.stdout


@pytest.fixture(scope="module")
def jetson_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tool("ansible-playbook")
    if os.geteuid() != 0:
        pytest.skip("the role sets root ownership on the files it installs: run as root")
    work = tmp_path_factory.mktemp("jetson-parts")
    wheel = build_wheel(work)
    links = simulated_jetson_onnxruntime_gpu_wheel(work / "jetson-index")
    user_base = simulated_jetpack_system_site(work / "simulated-jetpack-system")
    return wheel, links, user_base


def test_role_on_simulated_jetpack_6_sees_system_tensorrt_and_pins_onnxruntime_gpu(
    jetson_parts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    wheel, links, user_base = jetson_parts
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_text(JP62_ORIN_NANO)
    out = run_role(tmp_path, root, wheel, links, user_base)
    assert not out.startswith("FAILED"), out

    venv = root / "opt" / "edge-agent" / "venv"
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    # The doctor ran after the install and judged the simulated Jetson.
    assert "L4T 36.4.3 (JetPack 6.2)" in out
    assert re.search(rf"OK +tensorrt +{re.escape(FAKE_TRT)} ", out), out
    assert re.search(rf"OK +onnxruntime +{re.escape(PINNED_ORT)} \(onnxruntime-gpu==", out), out
    assert "FAIL" not in out.split("Show what edge-agent doctor found")[-1].split("PLAY RECAP")[0]

    # Exactly one ONNX Runtime distribution, the pinned GPU build, and JetPack's TensorRT.
    probe = (
        "import importlib.metadata as md, json, onnxruntime, tensorrt\n"
        "names = sorted(d.metadata['Name'] for d in md.distributions()"
        " if d.metadata['Name'].startswith('onnxruntime'))\n"
        "print(json.dumps([names, onnxruntime.__version__, tensorrt.__version__]))\n"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        env=dict(os.environ, PYTHONUSERBASE=str(user_base), PYTHONPATH=""),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(done.stdout) == [["onnxruntime-gpu"], PINNED_ORT, FAKE_TRT]


def test_role_stops_on_simulated_jetpack_5_before_installing(
    jetson_parts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    wheel, links, user_base = jetson_parts
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_text(JP512_XAVIER_NX)
    out = run_role(tmp_path, root, wheel, links, user_base)
    assert out.startswith("FAILED"), out
    assert "L4T 35.4.1 is not supported" in out
    assert "Python 3.8" in out
    assert not (root / "opt" / "edge-agent" / "venv").exists()
