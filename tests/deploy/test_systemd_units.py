"""`systemd-analyze verify` and `systemd-sysusers --dry-run` on the files in systemd/.

Both run offline against a throw-away root (`--root=`): the unit's ExecStart= binary, /bin/kill
and the stock system units are put there, so the check needs no running systemd (containers have
none) and nothing under /opt. Skips, saying why, when the tools are not installed (`make test`
installs Debian's `systemd` package when it can).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "edge-agent.service"
SYSUSERS = REPO / "systemd" / "edge-agent.sysusers.conf"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not found: install Debian's 'systemd' package (make test does)")
    if tool == "systemd-analyze" and not (SYSTEM_UNITS / "sysinit.target").is_file():
        pytest.skip(f"{SYSTEM_UNITS} has no stock units to verify against")
    return path


def prepare_root(root: Path) -> None:
    """Give `root` what verify resolves there: stock units and the commands the unit runs."""
    stock = root / "usr" / "lib" / "systemd" / "system"
    if not stock.exists():
        shutil.copytree(SYSTEM_UNITS, stock, symlinks=True)
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    kill = shutil.which("kill") or "/bin/kill"
    if not (bin_dir / "kill").exists():
        shutil.copy(kill, bin_dir / "kill")
    if not (root / "bin").exists():
        (root / "bin").symlink_to("usr/bin")


def systemd_analyze_verify(root: Path, unit: str) -> None:
    """Verify `unit` (under root/etc/systemd/system) with its drop-ins; any output fails."""
    analyze = need("systemd-analyze")
    prepare_root(root)
    result = subprocess.run(
        [analyze, "--man=no", f"--root={root}", "verify", unit],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify only fails on errors; unknown keys and bad values are warnings on stderr.
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == "", result.stdout + result.stderr


def install_unit(root: Path, text: str) -> None:
    system = root / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    (system / "edge-agent.service").write_text(text)
    binary = root / "opt" / "edge-agent" / "venv" / "bin" / "edge-agent"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    install_unit(tmp_path, UNIT.read_text())
    systemd_analyze_verify(tmp_path, "edge-agent.service")


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above is not vacuous: a misspelt key is reported."""
    install_unit(tmp_path, UNIT.read_text().replace("ProtectHome=", "ProtectHomes="))
    with pytest.raises(AssertionError, match="Unknown key 'ProtectHomes'"):
        systemd_analyze_verify(tmp_path, "edge-agent.service")


def test_unit_is_a_hardened_notify_service() -> None:
    text = UNIT.read_text()
    settings = {
        line.split("=", 1)[0]: line.split("=", 1)[1]
        for line in text.splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert settings["Type"] == "notify"
    assert settings["Restart"] == "on-failure"
    assert settings["ExecReload"] == "/bin/kill -HUP $MAINPID"
    for key in ("WatchdogSec", "MemoryMax", "TimeoutStopSec", "StateDirectory", "CacheDirectory"):
        assert settings.get(key), key
    assert settings["ProtectSystem"] == "strict"
    assert settings["NoNewPrivileges"] == "yes"
    assert settings["CapabilityBoundingSet"] == ""
    assert "DeviceAllow=/dev/nvmap rw" in text


def test_sysusers_file_is_valid(tmp_path: Path) -> None:
    sysusers = need("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group"):
        (tmp_path / "etc" / name).write_text("")
    result = subprocess.run(
        [sysusers, f"--root={tmp_path}", "--dry-run", str(SYSUSERS)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, SYSTEMD_LOG_LEVEL="info"),
    )
    assert result.returncode == 0, result.stderr
    assert "Creating user 'edge-agent'" in result.stderr
    assert not (tmp_path / "etc" / "passwd").read_text()  # dry run: nothing written
