"""The device's "birth certificate": the facts a fleet operator plans a rollout with.

`device_facts()` reads cheap facts once (no probing that takes time): the platform, Python, the
versions of the agent's runtimes from package metadata, the CPU model and memory from `/proc`,
the Jetson board and its L4T release (`/etc/nv_tegra_release`, which names the JetPack line)
where present. GPU figures come from the telemetry's GPU probe when it reports. The retained
status carries the facts under `inventory`, the device's `groups`, and under `served` every
served version with its content digest and the key ids that signed it (`served_versions`).

`targets_key_ids(metadata_dir)` reads which keys signed the device's trusted TUF `targets`
metadata: every version the sync installed was verified against it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import __version__

if TYPE_CHECKING:
    from model_cache import ModelCache

logger = logging.getLogger(__name__)

#: Distributions whose versions the inventory reports when installed.
PACKAGES = ("onnxruntime", "onnxruntime-gpu", "tensorrt", "numpy", "tritonclient")
_L4T = re.compile(r"R(\d+) \(release\), REVISION: ([0-9.]+)")

#: (model, version) -> content digest, as the model cache knows it.
Digests = Callable[[], Mapping[tuple[str, int], str]]


def _read(path: Path, limit: int = 1 << 16) -> str | None:
    try:
        with path.open("rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return None


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Installed versions of `names` (the ones not installed are left out)."""
    found: dict[str, str] = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def parse_meminfo(text: str) -> int | None:
    """`MemTotal` of /proc/meminfo in bytes."""
    match = re.search(r"^MemTotal:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def parse_cpu_model(text: str) -> str | None:
    """The CPU model from /proc/cpuinfo (`model name` on x86, `Model`/`Hardware` on ARM)."""
    for key in ("model name", "Model", "Hardware"):
        match = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if match:
            return match.group(1).strip()
    return None


def parse_l4t(text: str) -> str | None:
    """The L4T release from /etc/nv_tegra_release, e.g. "36.3.0" (JetPack 6.0)."""
    match = _L4T.search(text)
    if match is None:
        return None
    revision = match.group(2)
    return f"{match.group(1)}.{revision}"


def device_facts(root: Path = Path("/")) -> dict[str, Any]:
    """The device's facts (see module docstring); keys whose value is unknown are left out.

    Args:
        root: Where `/proc` and `/etc` are (tests pass a folder).
    """
    facts: dict[str, Any] = {
        "agent_version": __version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
    }
    cpu = parse_cpu_model(_read(root / "proc/cpuinfo") or "")
    if cpu:
        facts["cpu_model"] = cpu
    memory = parse_meminfo(_read(root / "proc/meminfo") or "")
    if memory:
        facts["memory_bytes"] = memory
    board = _read(root / "proc/device-tree/model", 256)
    if board:
        facts["board"] = board.strip("\0\n ")
    l4t = parse_l4t(_read(root / "etc/nv_tegra_release", 1024) or "")
    if l4t:
        facts["l4t"] = l4t
    return facts


def gpu_facts(gpus: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The GPU inventory from a reading (`GpuReading.to_json()` entries): index, uuid, name and
    total memory of each GPU."""
    keep = ("index", "uuid", "name", "memory_total_bytes")
    return [{k: gpu[k] for k in keep if k in gpu} for gpu in gpus]


def targets_key_ids(metadata_dir: Path) -> list[str]:
    """Key ids of the signatures on the trusted `targets.json` in `metadata_dir` ([] if none)."""
    text = _read(metadata_dir / "targets.json", 16 << 20)
    if text is None:
        return []
    try:
        doc = json.loads(text)
        return sorted({str(s["keyid"]) for s in doc.get("signatures", [])})
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.debug("targets.json key ids not readable: %s", exc)
        return []


def served_versions(
    served: Mapping[str, Iterable[int]],
    digests: Mapping[tuple[str, int], str],
    key_ids: list[str],
) -> list[dict[str, Any]]:
    """One entry per served version: model, version, digest (None: not from the cache) and
    `signed_by` (the targets key ids for a version the cache holds, else [])."""
    rows = []
    for model in sorted(served):
        for version in sorted(served[model]):
            digest = digests.get((model, version))
            rows.append(
                {
                    "model": model,
                    "version": version,
                    "digest": f"sha256:{digest}" if digest else None,
                    "signed_by": key_ids if digest else [],
                }
            )
    return rows


def cache_digests(cache: ModelCache) -> Digests:
    """Reads the content digest of every version the cache holds."""

    def read() -> dict[tuple[str, int], str]:
        return {
            (v.model, v.version): v.digest
            for model in cache.models()
            for v in cache.list_versions(model)
        }

    return read
