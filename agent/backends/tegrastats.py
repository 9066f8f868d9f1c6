"""Parse one line of Jetson's `tegrastats` (pure: no process, no clock).

NVML is absent on Jetson; `tegrastats` prints one line per interval with the RAM (which the
integrated GPU shares), the GPU load and the power rails. The format changed across JetPack
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

__all__ = ["TegraReading", "parse_tegrastats"]

_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_GPU = re.compile(r"\bGR3D_FREQ (\d+)%")
# "NAME 1234/1100" (JetPack 4) or "NAME 1234mW/1100mW" (JetPack 5 and 6)
_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?\b")
_GPU_RAILS = ("VDD_GPU_SOC", "POM_5V_GPU", "VDD_GPU", "VDD_CPU_GPU_CV")
_INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class TegraReading:
    """What one tegrastats line says about the GPU; None where the line does not say."""

    utilization: float  # GPU load, 0.0 to 1.0
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_w: float | None  # current draw of the GPU rail (else the board's input rail)


def parse_tegrastats(line: str) -> TegraReading | None:
    """The GPU figures of one tegrastats line; None when it has no GR3D_FREQ (not a stats line)."""
    gpu = _GPU.search(line)
    if gpu is None:
        return None
    ram = _RAM.search(line)
    rails = {m.group(1): int(m.group(2)) for m in _RAIL.finditer(line)}
    power = next((rails[r] for r in (*_GPU_RAILS, *_INPUT_RAILS) if r in rails), None)
    return TegraReading(
        utilization=min(100, int(gpu.group(1))) / 100,
        memory_used_bytes=int(ram.group(1)) * _MIB if ram else None,
        memory_total_bytes=int(ram.group(2)) * _MIB if ram else None,
        power_w=power / 1000 if power is not None else None,
    )
