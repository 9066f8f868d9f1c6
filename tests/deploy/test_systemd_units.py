"""`systemd-analyze verify` and `systemd-sysusers --dry-run` on the files in systemd/.

Both run offline against a throw-away root (`--root=`): the unit's ExecStart= binary, /bin/kill
and the stock system units are put there, so the check needs no running systemd (containers have
none) and nothing under /opt. Skips, saying why, when the tools are not installed (`make test`
installs Debian's `systemd` package when it can).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.support import need, systemd_analyze_verify

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "edge-agent.service"
SYSUSERS = REPO / "systemd" / "edge-agent.sysusers.conf"


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
