"""Each install path gets exactly one ONNX Runtime, and the Jetson install resolves from wheels.

The extras are read from pyproject.toml and their markers evaluated for each target (offline).
Then pip resolves the runtime dependency set for a Jetson (linux/aarch64, CPython 3.10, binary
wheels only, dry run: metadata only, nothing installed), so a dependency without an aarch64
wheel fails here rather than on a device; skipped, saying why, when the index cannot be reached.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
ORT_DISTRIBUTIONS = {"onnxruntime", "onnxruntime-gpu"}
GPU_PYPI_ONLY = {"tensorrt", "cuda-python"}  # on a Jetson these come from JetPack


def target(machine: str) -> dict[str, str]:
    return {
        "python_version": "3.10",
        "python_full_version": "3.10.12",
        "platform_machine": machine,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_version": "",
        "implementation_version": "3.10.12",
    }


JETSON = target("aarch64")  # JetPack 6: Ubuntu 22.04, Python 3.10
X86_64 = target("x86_64")


def requirements(extra: str | None, env: dict[str, str]) -> list[Requirement]:
    """What `pip install edge-agent[extra]` asks for on the target, markers evaluated."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    if extra is not None:
        lines += project["optional-dependencies"][extra]
    chosen = []
    for line in lines:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
            req.marker = None
            chosen.append(req)
    return chosen


def names(reqs: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in reqs}


@pytest.mark.parametrize(
    ("extra", "env", "runtime"),
    [
        ("cpu", X86_64, {"onnxruntime"}),
        ("cpu", JETSON, {"onnxruntime"}),
        ("gpu", X86_64, {"onnxruntime-gpu"}),
        ("dev", X86_64, {"onnxruntime"}),
        ("jetson", JETSON, set()),  # onnxruntime-gpu from NVIDIA's Jetson index
        (None, X86_64, set()),  # plain `pip install edge-agent`: the start-up error names the fix
    ],
)
def test_each_install_path_asks_for_at_most_one_onnxruntime(
    extra: str | None, env: dict[str, str], runtime: set[str]
) -> None:
    assert names(requirements(extra, env)) & ORT_DISTRIBUTIONS == runtime


def test_nothing_from_pypi_shadows_jetpack_on_a_jetson() -> None:
    for extra in ("jetson", "gpu"):
        asked = names(requirements(extra, JETSON))
        assert not asked & (ORT_DISTRIBUTIONS | GPU_PYPI_ONLY), (extra, asked)


def pip_resolve(reqs: list[Requirement], platforms: list[str], tmp_path: Path) -> dict[str, Any]:
    """Dry-run resolution for CPython 3.10 on the platforms, binary wheels only."""
    report = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        "--only-binary=:all:", "--python-version", "3.10", "--implementation", "cp",
        "--abi", "cp310", "--abi", "abi3", "--abi", "none", "--timeout", "15", "--retries", "1",
        "--report", str(report),
    ]  # fmt: skip
    for platform in platforms:
        command += ["--platform", platform]
    done = subprocess.run(
        command + [str(r) for r in reqs], capture_output=True, text=True, timeout=240
    )
    if done.returncode != 0:
        unreachable = (
            "NewConnectionError",
            "Max retries exceeded",
            "Temporary failure in name resolution",
            "Network is unreachable",
            "Could not fetch URL",
            "ConnectTimeoutError",
        )
        if any(text in done.stderr for text in unreachable):
            pytest.skip(f"the package index cannot be reached: {done.stderr.strip()[-300:]}")
        pytest.fail(f"pip cannot resolve {[str(r) for r in reqs]}:\n{done.stderr}")
    return dict(json.loads(report.read_text()))


def test_the_jetson_install_resolves_from_aarch64_wheels(tmp_path: Path) -> None:
    reqs = requirements("jetson", JETSON)
    report = pip_resolve(
        reqs,
        [
            "manylinux2014_aarch64",
            "manylinux_2_17_aarch64",
            "manylinux_2_28_aarch64",
            "linux_aarch64",
        ],
        tmp_path,
    )
    resolved = {canonicalize_name(item["metadata"]["name"]) for item in report["install"]}
    assert {canonicalize_name(r.name) for r in reqs} <= resolved, sorted(resolved)
    assert not resolved & (ORT_DISTRIBUTIONS | GPU_PYPI_ONLY), sorted(resolved)


@pytest.mark.parametrize("extra", ["cpu", "gpu"])
def test_the_x86_64_runtime_extras_resolve_to_one_onnxruntime(extra: str, tmp_path: Path) -> None:
    # The extra's ONNX Runtime line with everything it pulls in (TensorRT is left out: its old
    # wheels carry no separate metadata, so resolving it would download hundreds of MB).
    reqs = [
        r for r in requirements(extra, X86_64) if canonicalize_name(r.name) in ORT_DISTRIBUTIONS
    ]
    report = pip_resolve(
        reqs, ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"], tmp_path
    )
    resolved = {canonicalize_name(item["metadata"]["name"]) for item in report["install"]}
    assert len(resolved & ORT_DISTRIBUTIONS) == 1, sorted(resolved)


FEATURE_EXTRAS = ("s3", "otel", "grpcio", "signing", "quantize")  # `all` (pyproject.toml)


def test_the_dev_and_all_extras_name_every_feature_extra() -> None:
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in ("all", "dev"):
        nested = [Requirement(line) for line in optional[extra] if line.startswith("edge-agent")]
        assert len(nested) == 1, (extra, nested)
        assert nested[0].extras == set(FEATURE_EXTRAS), (extra, nested[0])


def test_the_jetson_install_with_every_feature_extra_resolves(tmp_path: Path) -> None:
    # A Jetson that syncs from S3, checks model signatures... resolves from aarch64 wheels too.
    reqs = requirements("jetson", JETSON)
    for extra in FEATURE_EXTRAS:
        reqs += [r for r in requirements(extra, JETSON) if r.name != "edge-agent"]
    aarch64 = ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64"]
    report = pip_resolve(reqs, [*aarch64, "linux_aarch64"], tmp_path)
    resolved = {canonicalize_name(item["metadata"]["name"]) for item in report["install"]}
    assert {"boto3", "grpcio", "model-signing", "onnx", "opentelemetry-sdk"} <= resolved
    assert not resolved & (ORT_DISTRIBUTIONS | GPU_PYPI_ONLY), sorted(resolved)
