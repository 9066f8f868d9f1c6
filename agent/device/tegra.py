"""Jetson's own reports, parsed: `/etc/nv_tegra_release` and `tegrastats` lines (pure).

`/etc/nv_tegra_release` names the L4T (Linux for Tegra) release a board was flashed with, e.g.
``# R36 (release), REVISION: 4.3, ...`` is L4T 36.4.3, which JetPack 6.2 ships. The agent needs
Python 3.10 or later, so only JetPack 6 (L4T R36, Ubuntu 22.04) is supported: JetPack 5 (R35)
ships Python 3.8 and JetPack 4 (R32, the original Jetson Nano) Python 3.6.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RELEASE = re.compile(r"#\s*R(\d+)\s*\(([^)]*)\),\s*REVISION:\s*([\d.]+)")
_FIELD = re.compile(r"\b([A-Z]+):\s*([^,]+)")
_TEGRA_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_TEGRA_GPU = re.compile(r"\bGR3D_FREQ (\d+)%")

# L4T release (major.minor) -> JetPack, as NVIDIA's release notes pair them.
JETPACK_BY_L4T: dict[str, str] = {
    "32.7": "4.6",
    "35.1": "5.0.2",
    "35.2": "5.1",
    "35.3": "5.1.1",
    "35.4": "5.1.2",
    "35.5": "5.1.3",
    "35.6": "5.1.4",
    "36.2": "6.0 DP",
    "36.3": "6.0",
    "36.4": "6.1 / 6.2",
    "38.2": "7.0",
}
# JetPack 6 production releases: what the agent is built and tested for.
SUPPORTED_L4T: tuple[str, ...] = ("36.3", "36.4")
_PYTHON_BY_MAJOR = {32: "3.6", 35: "3.8"}


@dataclass(frozen=True, slots=True)
class TegraRelease:
    """One `/etc/nv_tegra_release`: L4T major release and revision, board and build date."""

    major: int
    revision: str  # "4.3" in R36 REVISION 4.3
    kind: str = "release"
    board: str = ""
    date: str = ""

    @property
    def l4t(self) -> str:
        """The full L4T version, e.g. "36.4.3"."""
        return f"{self.major}.{self.revision}"

    @property
    def series(self) -> str:
        """major.minor, the key of `JETPACK_BY_L4T`, e.g. "36.4"."""
        return f"{self.major}.{self.revision.split('.')[0]}"

    @property
    def jetpack(self) -> str | None:
        """The JetPack that ships this L4T, None when it is not in the table."""
        if self.l4t.startswith("36.4."):  # 36.4.0: JetPack 6.1; 36.4.3 and later: 6.2
            return "6.1" if self.l4t in ("36.4.0", "36.4") else "6.2"
        return JETPACK_BY_L4T.get(self.series)

    @property
    def supported(self) -> bool:
        """Whether the agent supports this release (JetPack 6)."""
        return self.series in SUPPORTED_L4T

    def unsupported_reason(self) -> str | None:
        """Why this release cannot run the agent, with the fix; None when it is supported."""
        if self.supported:
            return None
        jetpack = f"JetPack {self.jetpack}" if self.jetpack else "this JetPack"
        python = _PYTHON_BY_MAJOR.get(self.major)
        if python is not None:
            return (
                f"L4T {self.l4t} ({jetpack}) ships Python {python}; edge-agent needs Python 3.10 "
                "or later: flash JetPack 6 (L4T R36.3 or later)"
            )
        return (
            f"L4T {self.l4t} ({jetpack}) is not a supported release "
            f"(supported: L4T {', '.join(SUPPORTED_L4T)}, JetPack 6): flash JetPack 6"
        )


def parse_nv_tegra_release(text: str) -> TegraRelease | None:
    """The release in an `/etc/nv_tegra_release` text; None when its first line is not one."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    found = _RELEASE.match(first)
    if found is None:
        return None
    fields = {key: value.strip() for key, value in _FIELD.findall(first[found.end() :])}
    return TegraRelease(
        major=int(found.group(1)),
        revision=found.group(3).rstrip("."),
        kind=found.group(2).strip(),
        board=fields.get("BOARD", ""),
        date=fields.get("DATE", ""),
    )


def parse_tegrastats(line: str) -> dict[str, int] | None:
    """GPU load and the RAM it shares from a tegrastats line; None if it has no GR3D_FREQ.

    Returns {"index": 0, "util_percent": ..., "memory_used_bytes": ..., "memory_total_bytes":
    ...} (the memory keys only where the line has `RAM used/totalMB`).
    """
    gpu = _TEGRA_GPU.search(line)
    if gpu is None:
        return None
    entry = {"index": 0, "util_percent": int(gpu.group(1))}
    ram = _TEGRA_RAM.search(line)
    if ram is not None:
        entry["memory_used_bytes"] = int(ram.group(1)) << 20
        entry["memory_total_bytes"] = int(ram.group(2)) << 20
    return entry
