"""Parsing what Jetson boards print: `/etc/nv_tegra_release` and `tegrastats` lines (recorded on
JetPack 4.6, 5.1 and 6.x boards; no Jetson here), and the reader that runs `tegrastats`."""

from __future__ import annotations

import sys

import pytest

from agent.device.gpu import TegrastatsReader
from agent.device.tegra import TegraReading, parse_nv_tegra_release, parse_tegrastats

MIB = 1 << 20

# /etc/nv_tegra_release as boards on each release carry it (first line; later lines are hashes).
JP62_ORIN_NANO = (
    "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
    "DATE: Wed Jan  8 01:49:37 UTC 2025\n"
    "# KERNEL_VARIANT: oot\n"
    "TARGET_USERSPACE_LIB_DIR=nvidia\n"
    "TARGET_USERSPACE_LIB_DIR_PATH=usr/lib/aarch64-linux-gnu/nvidia\n"
)
JP61_AGX_ORIN = (
    "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, "
    "DATE: Fri Sep 13 04:36:44 UTC 2024\n# KERNEL_VARIANT: oot\n"
)
JP60_ORIN_NX = (
    "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, "
    "DATE: Mon May  6 17:34:21 UTC 2024\n"
)
JP512_XAVIER_NX = (
    "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, "
    "DATE: Tue Aug  1 19:57:35 UTC 2023\n"
    "# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n"
)
JP46_NANO = (
    "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64, "
    "DATE: Sat Feb 19 17:05:08 UTC 2022\n"
)

# One tegrastats line each: JetPack 6.2 Orin Nano (with a timestamp), JetPack 5.1 AGX Orin (two
# GPCs in GR3D_FREQ), JetPack 5.1 Xavier NX.
TEGRASTATS_JP6_ORIN_NANO = (
    "12-01-2026 10:11:12 RAM 2356/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) "
    "CPU [1%@729,0%@729,0%@729,1%@729,0%@729,0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 12%@[305] "
    "NVDEC off NVJPG off NVJPG1 off VIC off OFA off APE 200 cpu@46.968C soc2@45.718C "
    "soc0@46.312C gpu@46.5C tj@47.375C soc1@46.062C VDD_IN 4541mW/4541mW "
    "VDD_CPU_GPU_CV 481mW/481mW VDD_SOC 1443mW/1443mW"
)
TEGRASTATS_JP5_AGX_ORIN = (
    "RAM 2480/30536MB (lfb 6502x4MB) SWAP 0/15268MB (cached 0MB) "
    "CPU [0%@729,0%@729,0%@729,0%@729,off,off,off,off] EMC_FREQ 0%@204 GR3D_FREQ 0%@[0,0] "
    "VIC_FREQ 729 APE 174 CV0@-256C CPU@47.593C Tboard@35C SOC2@43.593C Tdiode@36.25C "
    "SOC0@44.281C CV1@-256C GPU@-256C tj@47.593C SOC1@44.062C CV2@-256C "
    "VDD_GPU_SOC 2400mW/2400mW VDD_CPU_CV 400mW/400mW VIN_SYS_5V0 2513mW/2513mW"
)
TEGRASTATS_JP5_XAVIER_NX = (
    "RAM 3421/7773MB (lfb 218x4MB) SWAP 0/3886MB (cached 0MB) CPU [3%@1190,1%@1190,off,off,"
    "off,off] EMC_FREQ 0% GR3D_FREQ 99% AUX@38C CPU@40C thermal@39.15C AO@38.5C GPU@39C "
    "PMIC@50C VDD_IN 5080/5080 VDD_CPU_GPU_CV 1107/1107 VDD_SOC 1386/1386"
)

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
    ("text", "l4t", "jetpack", "board", "supported"),
    [
        (JP62_ORIN_NANO, "36.4.3", "6.2", "generic", True),
        (JP61_AGX_ORIN, "36.4.0", "6.1", "generic", True),
        (JP60_ORIN_NX, "36.3.0", "6.0", "generic", True),
        (JP512_XAVIER_NX, "35.4.1", "5.1.2", "t186ref", False),
        (JP46_NANO, "32.7.1", "4.6", "t210ref", False),
    ],
)
def test_nv_tegra_release_is_parsed(
    text: str, l4t: str, jetpack: str, board: str, supported: bool
) -> None:
    release = parse_nv_tegra_release(text)
    assert release is not None
    assert (release.l4t, release.jetpack, release.board) == (l4t, jetpack, board)
    assert release.supported is supported
    assert (release.unsupported_reason() is None) is supported


def test_jetpack_5_is_refused_with_its_python_and_the_fix() -> None:
    release = parse_nv_tegra_release(JP512_XAVIER_NX)
    assert release is not None
    reason = release.unsupported_reason()
    assert reason is not None
    assert "Python 3.8" in reason
    assert "JetPack 5.1.2" in reason
    assert "flash JetPack 6" in reason


def test_the_original_nano_release_names_python_3_6() -> None:
    release = parse_nv_tegra_release(JP46_NANO)
    assert release is not None
    assert "Python 3.6" in (release.unsupported_reason() or "")


def test_an_unknown_future_release_is_not_supported_but_named() -> None:
    release = parse_nv_tegra_release("# R40 (release), REVISION: 1.0, BOARD: generic\n")
    assert release is not None
    assert release.l4t == "40.1.0"
    assert release.jetpack is None
    assert "not a supported release" in (release.unsupported_reason() or "")


@pytest.mark.parametrize("text", ["", "garbage\n", "R36 REVISION 4.3\n"])
def test_text_that_is_not_a_release_file_gives_none(text: str) -> None:
    assert parse_nv_tegra_release(text) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (JETPACK_4_6_NANO, TegraReading(0.46, 1656 * MIB, 3964 * MIB, 0.411)),
        (JETPACK_4_6_XAVIER_NX, TegraReading(0.0, 2530 * MIB, 7764 * MIB, 0.532)),
        (JETPACK_5_1_AGX_ORIN, TegraReading(0.63, 3345 * MIB, 30536 * MIB, 2.385)),
        (TEGRASTATS_JP5_AGX_ORIN, TegraReading(0.0, 2480 * MIB, 30536 * MIB, 2.4)),
        (TEGRASTATS_JP5_XAVIER_NX, TegraReading(0.99, 3421 * MIB, 7773 * MIB, 1.107)),
        (JETPACK_6_ORIN_NANO, TegraReading(0.12, 2140 * MIB, 7620 * MIB, 0.484)),
        (TEGRASTATS_JP6_ORIN_NANO, TegraReading(0.12, 2356 * MIB, 7620 * MIB, 0.481)),
    ],
    ids=[
        "jetpack-4.6-nano",
        "jetpack-4.6-xavier-nx",
        "jetpack-5.1-agx-orin",
        "jetpack-5.1-agx-orin-idle",
        "jetpack-5.1-xavier-nx",
        "jetpack-6-orin-nano",
        "jetpack-6.2-orin-nano",
    ],
)
def test_recorded_tegrastats_lines(line: str, expected: TegraReading) -> None:
    assert parse_tegrastats(line) == expected


def test_tegrastats_input_rail_when_no_gpu_rail_is_printed() -> None:
    line = "RAM 900/1980MB GR3D_FREQ 5% VDD_IN 3100mW/3000mW VDD_SOC 800mW/800mW"
    reading = parse_tegrastats(line)
    assert reading is not None
    assert reading.power_w == 3.1


def test_tegrastats_line_without_ram_or_power_keeps_the_load() -> None:
    assert parse_tegrastats("GR3D_FREQ 99%@1300") == TegraReading(0.99, None, None, None)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "no gpu here",
        "RAM 2345/7620MB SWAP 0/3810MB",
        "RAM 2356/7620MB (lfb 2x4MB) SWAP 0/3810MB",
    ],
)
def test_not_a_tegrastats_line(line: str) -> None:
    assert parse_tegrastats(line) is None


def test_fake_tegrastats_command_gives_one_gpu_reading() -> None:
    """The reader runs the command for one line; a Python one-liner stands in for tegrastats."""
    reader = TegrastatsReader([sys.executable, "-c", f"print({JETPACK_6_ORIN_NANO!r})"])
    (reading,) = reader.read()
    assert (reading.uuid, reading.utilization, reading.power_w) == ("tegra-0", 0.12, 0.484)
    assert reading.memory_total_bytes == 7620 * MIB
    assert (reading.power_limit_w, reading.energy_j, reading.name) == (None, None, None)
    assert TegrastatsReader([sys.executable, "-c", "pass"]).read() == []
    assert TegrastatsReader(["/nonexistent/tegrastats"]).read() == []
