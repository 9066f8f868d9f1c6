"""The Ansible role, run for real: `ansible-playbook` (local connection) into a temporary root.

Service management and user creation are off, so nothing outside the temporary root changes.
Skips (saying why) when ansible-core or ansible-lint is not installed in the test's venv.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from tests.deploy.support import systemd_analyze_verify

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "deploy" / "ansible"
BIN = Path(sys.executable).parent


def tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in {BIN} (pip install ansible-core ansible-lint)")
    return path


def ansible_env() -> dict[str, str]:
    return dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCAL_TEMP=os.environ.get("TMPDIR", "/tmp"),
    )


def build_wheel(out: Path) -> Path:
    """Build edge-agent's wheel from a copy of the sources (the checkout stays untouched)."""
    src = out / "src"
    for name in ("agent", "sync", "model_cache"):
        shutil.copytree(
            REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out / "dist"),
            str(src),
        ],
        check=True,
        timeout=120,
    )
    (wheel,) = (out / "dist").glob("edge_agent-*.whl")
    return wheel


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object], str]:
    """Run the playbook once into a temporary root; returns (root, extra vars, output)."""
    playbook = tool("ansible-playbook")
    if os.geteuid() != 0:
        pytest.skip("the role sets root ownership on the files it installs: run as root")
    work = tmp_path_factory.mktemp("ansible")
    wheel = build_wheel(work)
    keys = work / "keys"
    keys.mkdir()
    (keys / "root.json").write_text('{"signed": {"_type": "root"}}')
    (keys / "ca.pem").write_text("CA\n")
    (keys / "client.pem").write_text("CERT\n")
    (keys / "client.key").write_text("PRIVATE KEY\n")
    root = work / "root"
    group = grp.getgrgid(os.getgid()).gr_name
    extra: dict[str, object] = {
        "edge_agent_root_prefix": str(root),
        "edge_agent_manage_service": False,
        "edge_agent_manage_user": False,
        "edge_agent_user": "root",
        "edge_agent_group": group,
        "edge_agent_wheel": str(wheel),
        "edge_agent_python": sys.executable,
        "edge_agent_pip_extra_args": "--no-deps --no-index",
        "edge_agent_trusted_root_src": str(keys / "root.json"),
        "edge_agent_tls_ca_src": str(keys / "ca.pem"),
        "edge_agent_tls_cert_src": str(keys / "client.pem"),
        "edge_agent_tls_key_src": str(keys / "client.key"),
        "edge_agent_memory_max": "3G",
        "edge_agent_environment": {"AWS_SECRET_ACCESS_KEY": "s3cr3t value"},
        "edge_agent_config": {
            "sync": {"source": "s3://fleet/prod", "desired": ["*=latest"], "interval_s": 60}
        },
        "edge_agent_config_host": {"log": {"level": "debug"}, "server": {"http_port": 9000}},
    }
    (work / "vars.json").write_text(json.dumps(extra))
    inventory = work / "hosts.yml"
    inventory.write_text(
        "edge_agents:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    command = [str(playbook), "-i", str(inventory), "site.yml", "-e", f"@{work / 'vars.json'}"]
    first = subprocess.run(
        command, cwd=ANSIBLE_DIR, env=ansible_env(), capture_output=True, text=True, timeout=180
    )
    assert first.returncode == 0, first.stdout + first.stderr
    second = subprocess.run(
        command, cwd=ANSIBLE_DIR, env=ansible_env(), capture_output=True, text=True, timeout=180
    )
    assert second.returncode == 0, second.stdout + second.stderr
    return root, extra, second.stdout


def test_playbook_installs_files_with_restrictive_modes(
    installed: tuple[Path, dict[str, object], str],
) -> None:
    root, _, _ = installed
    etc = root / "etc" / "edge-agent"
    assert mode(etc) == 0o750
    assert mode(etc / "tls") == 0o750
    for name in ("agent.toml", "agent.env", "root.json", "tls/ca.pem", "tls/client.pem"):
        assert mode(etc / name) == 0o640, name
    assert mode(etc / "tls" / "client.key") == 0o640
    assert (etc / "tls" / "client.key").read_text() == "PRIVATE KEY\n"
    assert (etc / "root.json").read_text() == '{"signed": {"_type": "root"}}'
    assert "AWS_SECRET_ACCESS_KEY='s3cr3t value'" in (etc / "agent.env").read_text()

    unit = root / "etc" / "systemd" / "system" / "edge-agent.service"
    assert unit.read_bytes() == (REPO / "systemd" / "edge-agent.service").read_bytes()
    assert mode(unit) == 0o644
    dropin = (unit.parent / "edge-agent.service.d" / "50-ansible.conf").read_text()
    assert "MemoryMax=3G" in dropin
    assert (
        "ExecStart=/opt/edge-agent/venv/bin/edge-agent serve --config /etc/edge-agent/agent.toml"
        in dropin
    )
    sysusers = root / "etc" / "sysusers.d" / "edge-agent.conf"
    assert sysusers.read_bytes() == (REPO / "systemd" / "edge-agent.sysusers.conf").read_bytes()

    agent = root / "opt" / "edge-agent" / "venv" / "bin" / "edge-agent"
    assert os.access(agent, os.X_OK)
    assert list(
        (root / "opt/edge-agent/venv/lib").glob("python3*/site-packages/agent/runtime/daemon.py")
    )


def test_playbook_renders_the_config_from_variables(
    installed: tuple[Path, dict[str, object], str],
) -> None:
    root, _, _ = installed
    config = tomllib.loads((root / "etc" / "edge-agent" / "agent.toml").read_text())
    assert config["server"] == {"host": "127.0.0.1", "http_port": 9000, "metrics_port": 8002}
    assert config["log"] == {"level": "debug"}
    assert config["cache"] == {"dir": "/var/lib/edge-agent", "keep_last": 2}
    assert config["sync"] == {
        "source": "s3://fleet/prod",
        "desired": ["*=latest"],
        "interval_s": 60,
        "trusted_root": "/etc/edge-agent/root.json",
    }
    assert config["mqtt"] == {
        "tls_ca": "/etc/edge-agent/tls/ca.pem",
        "tls_cert": "/etc/edge-agent/tls/client.pem",
        "tls_key": "/etc/edge-agent/tls/client.key",
    }


def test_playbook_is_idempotent(installed: tuple[Path, dict[str, object], str]) -> None:
    _, _, second_run = installed
    recap = [line for line in second_run.splitlines() if line.startswith("localhost")]
    assert recap, second_run
    assert "changed=0" in recap[-1], second_run


def test_installed_unit_with_dropin_passes_systemd_analyze(
    installed: tuple[Path, dict[str, object], str],
) -> None:
    root, _, _ = installed
    systemd_analyze_verify(root, "edge-agent.service")


def test_ansible_lint_production_profile_is_clean() -> None:
    lint = tool("ansible-lint")
    result = subprocess.run(
        [str(lint), "--offline", "--profile", "production", "--nocolor"],
        cwd=ANSIBLE_DIR,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
