"""Jetson's own reports, parsed: `/etc/nv_tegra_release` and `tegrastats` lines (pure).

`/etc/nv_tegra_release` names the L4T (Linux for Tegra) release a board was flashed with, e.g.
``# R36 (release), REVISION: 4.3, ...`` is L4T 36.4.3, which JetPack 6.2 ships. The agent needs
Python 3.10 or later, so only JetPack 6 (L4T R36, Ubuntu 22.04) is supported: JetPack 5 (R35)
ships Python 3.8 and JetPack 4 (R32, the original Jetson Nano) Python 3.6.

`tegrastats` stands in for NVML on Jetson: one line per interval with the RAM (which the
integrated GPU shares), the GPU load and the power rails. Its format changed across JetPack
releases, so every field is optional and found by its own pattern:

* RAM: `RAM 2345/7772MB` (all releases; `(lfb ...)` may follow).
* GPU load: `GR3D_FREQ 37%` (JetPack 4.x/5.x; 5.x may add `@[1300]` or `@1300`), or
  `GR3D_FREQ 37%@[1300,0]` on boards with two GPCs, or `GPC_FREQ ...` beside it.
* Power, in milliwatts, `NAME cur/avg`: `POM_5V_GPU 1234/1100` and `POM_5V_IN 4567/4000`
  (JetPack 4.x), `VDD_GPU_SOC 2345mW/2300mW` and `VDD_IN 5678mW/5000mW` (JetPack 5.x and 6.x;
  Orin Nano names them `VDD_CPU_GPU_CV`). The GPU rail is preferred; the board's input rail is
  the fallback, as it is all some boards report.

Power limit and energy are not in the output; the reading leaves them out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RELEASE = re.compile(r"#\s*R(\d+)\s*\(([^)]*)\),\s*REVISION:\s*([\d.]+)")
_FIELD = re.compile(r"\b([A-Z]+):\s*([^,]+)")
_TEGRA_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_TEGRA_GPU = re.compile(r"\bGR3D_FREQ (\d+)%")
# "NAME 1234/1100" (JetPack 4) or "NAME 1234mW/1100mW" (JetPack 5 and 6)
_TEGRA_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?\b")
_GPU_RAILS = ("VDD_GPU_SOC", "POM_5V_GPU", "VDD_GPU", "VDD_CPU_GPU_CV")
_INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
_MIB = 1 << 20

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


@dataclass(frozen=True, slots=True)
class TegraReading:
    """What one tegrastats line says about the GPU; None where the line does not say."""

    utilization: float  # GPU load, 0.0 to 1.0
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_w: float | None  # current draw of the GPU rail (else the board's input rail)


def parse_tegrastats(line: str) -> TegraReading | None:
    """The GPU figures of one tegrastats line; None when it has no GR3D_FREQ (not a stats line)."""
    gpu = _TEGRA_GPU.search(line)
    if gpu is None:
        return None
    ram = _TEGRA_RAM.search(line)
    rails = {m.group(1): int(m.group(2)) for m in _TEGRA_RAIL.finditer(line)}
    power = next((rails[r] for r in (*_GPU_RAILS, *_INPUT_RAILS) if r in rails), None)
    return TegraReading(
        utilization=min(100, int(gpu.group(1))) / 100,
        memory_used_bytes=int(ram.group(1)) * _MIB if ram else None,
        memory_total_bytes=int(ram.group(2)) * _MIB if ram else None,
        power_w=power / 1000 if power is not None else None,
    )
