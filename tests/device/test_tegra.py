"""Parsing what Jetson boards print: `/etc/nv_tegra_release` and `tegrastats` (JetPack 5 and 6)."""

from __future__ import annotations

import pytest

from agent.device.tegra import parse_nv_tegra_release, parse_tegrastats

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
    ("line", "util", "used_mb", "total_mb"),
    [
        (TEGRASTATS_JP6_ORIN_NANO, 12, 2356, 7620),
        (TEGRASTATS_JP5_AGX_ORIN, 0, 2480, 30536),
        (TEGRASTATS_JP5_XAVIER_NX, 99, 3421, 7773),
    ],
)
def test_tegrastats_lines_give_gpu_load_and_shared_memory(
    line: str, util: int, used_mb: int, total_mb: int
) -> None:
    assert parse_tegrastats(line) == {
        "index": 0,
        "util_percent": util,
        "memory_used_bytes": used_mb << 20,
        "memory_total_bytes": total_mb << 20,
    }


def test_a_tegrastats_line_without_gpu_gives_none() -> None:
    assert parse_tegrastats("RAM 2356/7620MB (lfb 2x4MB) SWAP 0/3810MB") is None
