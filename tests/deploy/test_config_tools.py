"""Environment overrides, `config check` and `config show` (agent/config/{environment,tools}.py)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from agent.config.environment import env_values
from agent.config.loader import load_config
from agent.config.render import MASK, is_secret_key, render_toml
from agent.config.tools import check_command, show_command
from agent.errors import AgentConfigError


def test_env_values_parse_by_the_key_type() -> None:
    overrides = env_values(
        {
            "EDGE_AGENT_SERVER_HTTP_PORT": "9000",
            "EDGE_AGENT_MODELS_EXIT_ON_ERROR": "no",
            "EDGE_AGENT_MODELS_LOAD_MODELS": "a, b",
            "EDGE_AGENT_SYNC_DESIRED": '["x=1", "y=latest"]',
            "EDGE_AGENT_CACHE_DIR": "/var/lib/edge-agent",
            "EDGE_AGENT_LOG_LEVEL": "debug",
            "EDGE_AGENT_STALL_ON_SIGUSR1": "2",  # not a section: not config
            "PATH": "/usr/bin",
        }
    )
    assert overrides == {
        "server.http_port": 9000,
        "models.exit_on_error": False,
        "models.load_models": ("a", "b"),
        "sync.desired": ("x=1", "y=latest"),
        "cache.dir": "/var/lib/edge-agent",  # the loader resolves paths
        "log.level": "debug",
    }


def test_env_override_errors_name_the_variable_and_key() -> None:
    with pytest.raises(AgentConfigError, match=r"EDGE_AGENT_SERVER_HTTP_PORT.*'server.http_port'"):
        env_values({"EDGE_AGENT_SERVER_HTTP_PORT": "eighty"})
    with pytest.raises(AgentConfigError, match=r"EDGE_AGENT_SERVER_HTTP_PROT.*'server.http_prot'"):
        env_values({"EDGE_AGENT_SERVER_HTTP_PROT": "1"})
    with pytest.raises(AgentConfigError, match="must be true or false"):
        env_values({"EDGE_AGENT_MODELS_DEMO": "maybe"})


def test_flags_win_over_env_and_env_over_file(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[server]\nhttp_port = 1\nmetrics_port = 2\n[models]\ndemo = true\n")
    env = {"EDGE_AGENT_SERVER_HTTP_PORT": "10", "EDGE_AGENT_SERVER_METRICS_PORT": "20"}
    loaded = load_config(config, {"server.http_port": 100, "server.host": None}, env)
    assert loaded.server.http_port == 100  # flag
    assert loaded.server.metrics_port == 20  # environment
    assert loaded.server.host == "127.0.0.1"  # default: a flag left unset does not override


def test_check_passes_a_valid_file_and_names_the_bad_key(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[models]\ndemo = true\n")
    out, err = io.StringIO(), io.StringIO()
    assert check_command(good, out=out, err=err) == 0
    assert out.getvalue() == f"{good}: ok\n"
    bad = tmp_path / "bad.toml"
    bad.write_text("[models]\ndemo = true\n[server]\nhttp_port = 70000\n")
    assert check_command(bad, out=out, err=err) == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1
    assert "server.http_port" in lines[0]


def test_show_masks_secrets_and_reads_back(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[models]\ndemo = true\n[sync]\nsource = "https://fleet:hunter2@models.example/prod"\n'
        'trusted_root = "root.json"\n'
    )
    (tmp_path / "root.json").write_text("{}")
    (tmp_path / "cache").mkdir()
    out, err = io.StringIO(), io.StringIO()
    env = {"EDGE_AGENT_CACHE_DIR": str(tmp_path / "cache"), "EDGE_AGENT_MODELS_DEMO": "false"}
    assert show_command(config, env, out=out, err=err) == 0, err.getvalue()
    text = out.getvalue()
    assert "hunter2" not in text
    assert f"https://fleet:{MASK}@models.example/prod" in text
    doc = tomllib.loads(text)
    assert doc["cache"]["dir"] == str(tmp_path / "cache")
    assert doc["models"]["demo"] is False
    assert doc["sync"]["trusted_root"] == str(tmp_path / "root.json")


def test_render_toml_round_trips_through_load_config(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[models]\ndemo = true\nload_models = []\n[log]\nlevel = "debug"\n')
    loaded = load_config(config)
    again = tmp_path / "again.toml"
    again.write_text(render_toml(loaded))
    assert load_config(again) == loaded


def test_canary_tables_round_trip_and_stay_out_of_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[models]\ndemo = true\n[canary."m.x"]\nversion = 2\nshare = 0.1\nmax_p95_ms = 20\n'
    )
    loaded = load_config(config)
    again = tmp_path / "again.toml"
    again.write_text(render_toml(loaded))
    assert load_config(again) == loaded
    assert loaded.canary[0][0] == "m.x"
    with pytest.raises(AgentConfigError, match="EDGE_AGENT_CANARY_M_SHARE"):
        env_values({"EDGE_AGENT_CANARY_M_SHARE": "0.5"})


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("mqtt_password", True),
        ("api_token", True),
        ("client_secret", True),
        ("private_key", True),
        ("access_key", True),
        ("http_port", False),
        ("keep_last", False),
        ("trusted_root", False),
    ],
)
def test_secret_key_names(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret
