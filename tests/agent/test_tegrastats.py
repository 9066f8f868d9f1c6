"""tegrastats lines as JetPack 4.6, 5.1 and 6.x print them (recorded on boards; no Jetson here)."""

from __future__ import annotations

import sys

import pytest

from agent.backends.gpu_telemetry import TegrastatsReader
from agent.backends.tegrastats import TegraReading, parse_tegrastats

MIB = 1 << 20

# Jetson Nano, JetPack 4.6 (L4T 32.6): POM_ rails, no units on the power figures.
JETPACK_4_6_NANO = (
    "RAM 1656/3964MB (lfb 109x4MB) SWAP 0/1982MB (cached 0MB) IRAM 0/252kB(lfb 252kB) "
    "CPU [12%@1479,8%@1479,10%@1479,7%@1479] EMC_FREQ 3%@1600 GR3D_FREQ 46%@921 APE 25 "
    "PLL@34C CPU@37C PMIC@50C GPU@35.5C AO@44C thermal@36.25C "
    "POM_5V_IN 2989/2989 POM_5V_GPU 411/411 POM_5V_CPU 743/743"
)
# Xavier NX, JetPack 4.6: the GPU shares a rail with the CPU and the CV engines.
JETPACK_4_6_XAVIER_NX = (
    "RAM 2530/7764MB (lfb 1085x4MB) SWAP 0/3882MB (cached 0MB) CPU [3%@1190,1%@1190,off,off,"
    "off,off] EMC_FREQ 0%@1600 GR3D_FREQ 0%@114 APE 150 MTS fg 0% bg 0% AO@38C GPU@37.5C "
    "PMIC@50C AUX@37C CPU@38.5C thermal@37.8C VDD_IN 4209/4209 VDD_CPU_GPU_CV 532/532 "
    "VDD_SOC 1350/1350"
)
# AGX Orin, JetPack 5.1 (L4T 35.2): mW units, two GPCs in GR3D_FREQ, no VDD_IN rail.
JETPACK_5_1_AGX_ORIN = (
    "RAM 3345/30536MB (lfb 6394x4MB) SWAP 0/15268MB (cached 0MB) CPU [2%@729,0%@729,1%@729,"
    "0%@729,off,off,off,off,off,off,off,off] EMC_FREQ 0%@2133 GR3D_FREQ 63%@[305,305] "
    "VIC_FREQ 729 APE 174 CV0@-256C CPU@47.937C Tboard@36C SOC2@44.093C Tdiode@37.75C "
    "SOC0@44.781C CV1@-256C GPU@-256C tj@47.937C SOC1@43.843C CV2@-256C "
    "VDD_GPU_SOC 2385mW/2385mW VDD_CPU_CV 397mW/397mW VIN_SYS_5V0 2520mW/2520mW "
    "VDDQ_VDD2_1V8AO 301mW/301mW"
)
# Orin Nano, JetPack 6.0 (L4T 36.3): a timestamp first, GR3D_FREQ without a frequency.
JETPACK_6_ORIN_NANO = (
    "11-28-2024 10:02:03 RAM 2140/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) "
    "CPU [1%@729,2%@729,0%@729,0%@729,off,off] GR3D_FREQ 12% cpu@47.25C soc2@46.375C "
    "soc0@47.125C gpu@47.031C tj@47.25C soc1@46.718C VDD_IN 4416mW/4416mW "
    "VDD_CPU_GPU_CV 484mW/484mW VDD_SOC 1452mW/1452mW"
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (JETPACK_4_6_NANO, TegraReading(0.46, 1656 * MIB, 3964 * MIB, 0.411)),
        (JETPACK_4_6_XAVIER_NX, TegraReading(0.0, 2530 * MIB, 7764 * MIB, 0.532)),
        (JETPACK_5_1_AGX_ORIN, TegraReading(0.63, 3345 * MIB, 30536 * MIB, 2.385)),
        (JETPACK_6_ORIN_NANO, TegraReading(0.12, 2140 * MIB, 7620 * MIB, 0.484)),
    ],
    ids=[
        "jetpack-4.6-nano",
        "jetpack-4.6-xavier-nx",
        "jetpack-5.1-agx-orin",
        "jetpack-6-orin-nano",
    ],
)
def test_recorded_lines(line: str, expected: TegraReading) -> None:
    assert parse_tegrastats(line) == expected


def test_the_input_rail_when_no_gpu_rail_is_printed() -> None:
    line = "RAM 900/1980MB GR3D_FREQ 5% VDD_IN 3100mW/3000mW VDD_SOC 800mW/800mW"
    reading = parse_tegrastats(line)
    assert reading is not None
    assert reading.power_w == 3.1


def test_a_line_without_ram_or_power_keeps_the_load() -> None:
    assert parse_tegrastats("GR3D_FREQ 99%@1300") == TegraReading(0.99, None, None, None)


@pytest.mark.parametrize("line", ["", "no gpu here", "RAM 2345/7620MB SWAP 0/3810MB"])
def test_not_a_stats_line(line: str) -> None:
    assert parse_tegrastats(line) is None


def test_fake_tegrastats_command_gives_one_gpu_reading() -> None:
    """The reader runs the command for one line; a Python one-liner stands in for tegrastats."""
    reader = TegrastatsReader([sys.executable, "-c", f"print({JETPACK_6_ORIN_NANO!r})"])
    (reading,) = reader.read()
    assert (reading.uuid, reading.utilization, reading.power_w) == ("tegra-0", 0.12, 0.484)
    assert reading.memory_total_bytes == 7620 * MIB
    assert (reading.power_limit_w, reading.energy_j) == (None, None)
    assert TegrastatsReader([sys.executable, "-c", "pass"]).read() == []
    assert TegrastatsReader(["/nonexistent/tegrastats"]).read() == []
