"""The agent's TOML config file and command-line overrides."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent.backends.health import RestartPolicy
from agent.config.choices import GrpcEngine, LogLevel, ModelControlMode, Protocol, TraceMode
from agent.config.loader import load_config
from agent.config.render import render_toml
from agent.config.schema import (
    AgentConfig,
    LogConfig,
    ModelsConfig,
    ServerConfig,
    restart_policy,
)
from agent.errors import AgentConfigError
from agent.fleet.config import MqttConfig


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


def repo_toml(tmp_path: Path, extra: str = "") -> Path:
    """A config file serving tmp_path/models, with `extra` TOML after it."""
    return write_toml(tmp_path, f'[models]\nrepository = "models"\n{extra}')


def test_defaults(tmp_path: Path, repo: Path) -> None:
    config = load_config(repo_toml(tmp_path), {})

    assert config.server == ServerConfig()
    assert config.server.host == "127.0.0.1"
    assert config.server.http_port == 8000
    assert config.server.max_request_bytes == 64 * 1024 * 1024
    assert config.models == ModelsConfig(repository=repo)
    assert config.models.strict_model_config is False
    assert config.models.exit_on_error is True
    assert config.models.intra_op_threads == 0
    assert config.log == LogConfig(level=LogLevel.INFO)


def test_values_are_read(tmp_path: Path, repo: Path) -> None:
    path = write_toml(
        tmp_path,
        f"""
[server]
host = "0.0.0.0"
http_port = 9000
max_request_bytes = 2048

[models]
repository = "{repo}"
strict_model_config = true
exit_on_error = false
intra_op_threads = 3

[log]
level = "debug"
""",
    )

    config = load_config(path, {})

    assert config == AgentConfig(
        server=ServerConfig(host="0.0.0.0", http_port=9000, max_request_bytes=2048),
        models=ModelsConfig(
            repository=repo, strict_model_config=True, exit_on_error=False, intra_op_threads=3
        ),
        log=LogConfig(level=LogLevel.DEBUG),
    )


def test_no_file_with_overrides_only(repo: Path) -> None:
    config = load_config(None, {"models.repository": repo, "server.http_port": 0})

    assert config.models.repository == repo
    assert config.server.http_port == 0


def test_relative_repository_is_resolved_against_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc"
    (conf_dir / "models").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = conf_dir / "agent.toml"
    path.write_text('[models]\nrepository = "models"\n', encoding="utf-8")

    config = load_config(path, {})

    assert config.models.repository == conf_dir / "models"


def test_parent_relative_repository(tmp_path: Path, repo: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    path = conf_dir / "agent.toml"
    path.write_text('[models]\nrepository = "../models"\n', encoding="utf-8")

    config = load_config(path, {})

    assert config.models.repository is not None
    assert config.models.repository.resolve() == repo.resolve()


def test_absolute_repository_is_kept(tmp_path: Path, repo: Path) -> None:
    other = tmp_path / "sub"
    other.mkdir()
    path = other / "agent.toml"
    path.write_text(f'[models]\nrepository = "{repo}"\n', encoding="utf-8")

    assert load_config(path, {}).models.repository == repo


def test_overrides_win_over_the_file(tmp_path: Path, repo: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    path = repo_toml(
        tmp_path, '[server]\nhttp_port = 9000\nhost = "0.0.0.0"\n[log]\nlevel = "error"\n'
    )
    overrides: dict[str, Any] = {
        "server.http_port": 1234,
        "models.repository": other,
        "log.level": "debug",
        "models.strict_model_config": True,
    }

    config = load_config(path, overrides)

    assert config.server.http_port == 1234
    assert config.server.host == "0.0.0.0"
    assert config.models.repository == other
    assert config.models.strict_model_config is True
    assert config.log.level is LogLevel.DEBUG


def test_none_overrides_leave_the_file_value(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, "[server]\nhttp_port = 9000\n")

    config = load_config(path, {"server.http_port": None, "models.repository": None})

    assert config.server.http_port == 9000
    assert config.models.repository == repo


def test_false_override_wins(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, "exit_on_error = true\n")

    config = load_config(path, {"models.exit_on_error": False})

    assert config.models.exit_on_error is False


def test_unknown_section(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, "[grpc]\nport = 8001\n")

    with pytest.raises(AgentConfigError, match=r"unknown config section \[grpc\]"):
        load_config(path, {})


def test_unknown_key_is_named(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, "[server]\nhttp_prot = 8001\n")

    with pytest.raises(AgentConfigError) as info:
        load_config(path, {})

    message = str(info.value)
    assert "unknown config key 'server.http_prot'" in message
    assert "http_port" in message


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[server]\nhttp_port = "8001"\n', "server.http_port"),
        ("[server]\nhttp_port = 80.5\n", "server.http_port"),
        ("[server]\nhttp_port = true\n", "server.http_port"),
        ("[server]\nhost = 127\n", "server.host"),
        ("[server]\nmax_request_bytes = [1]\n", "server.max_request_bytes"),
        ('strict_model_config = "yes"\n', "models.strict_model_config"),
        ("exit_on_error = 1\n", "models.exit_on_error"),
        ("intra_op_threads = 1.0\n", "models.intra_op_threads"),
        ("[log]\nlevel = 10\n", "log.level"),
    ],
)
def test_wrong_type_names_the_key(tmp_path: Path, repo: Path, toml: str, key: str) -> None:
    path = repo_toml(tmp_path, toml)

    with pytest.raises(AgentConfigError, match=rf"config key '{key}' must be"):
        load_config(path, {})


@pytest.mark.parametrize("value", ["5", '""', "[]"])
def test_repository_must_be_a_path_string(tmp_path: Path, value: str) -> None:
    path = write_toml(tmp_path, f"[models]\nrepository = {value}\n")

    with pytest.raises(AgentConfigError, match=r"config key 'models\.repository' must be a path"):
        load_config(path, {})


def test_section_must_be_a_table(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "server = 5\n")

    with pytest.raises(AgentConfigError, match=r"config key 'server' must be a table \[server\]"):
        load_config(path, {})


@pytest.mark.parametrize("port", [-1, 65536, 70000])
def test_invalid_port(tmp_path: Path, repo: Path, port: int) -> None:
    path = repo_toml(tmp_path, f"[server]\nhttp_port = {port}\n")

    with pytest.raises(AgentConfigError, match=f"server.http_port must be 0..65535, got {port}"):
        load_config(path, {})


def test_invalid_port_from_override(repo: Path) -> None:
    with pytest.raises(AgentConfigError, match=r"server\.http_port must be 0\.\.65535"):
        load_config(None, {"models.repository": repo, "server.http_port": 100000})


@pytest.mark.parametrize("port", [0, 65535])
def test_port_bounds_are_valid(tmp_path: Path, repo: Path, port: int) -> None:
    path = repo_toml(tmp_path, f"[server]\nhttp_port = {port}\n")

    assert load_config(path, {}).server.http_port == port


def test_max_request_bytes_too_small(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, "[server]\nmax_request_bytes = 1023\n")

    with pytest.raises(AgentConfigError, match="max_request_bytes must be at least 1024, got 1023"):
        load_config(path, {})


def test_invalid_log_level(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, '[log]\nlevel = "verbose"\n')

    with pytest.raises(
        AgentConfigError,
        match=r"'log\.level' must be one of debug, info, warning, error, critical, got 'verbose'",
    ):
        load_config(path, {})


def test_grpc_engine_is_checked_and_read_from_the_environment(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, '[server]\ngrpc_engine = "h2"\n')
    with pytest.raises(
        AgentConfigError, match=r"'server\.grpc_engine' must be one of loop, grpcio, got 'h2'"
    ):
        load_config(path, {})
    path = repo_toml(tmp_path, "")
    assert load_config(path, {}).server.grpc_engine is GrpcEngine.LOOP
    environ = {"EDGE_AGENT_SERVER_GRPC_ENGINE": "grpcio"}
    assert load_config(path, {}, environ).server.grpc_engine is GrpcEngine.GRPCIO


def test_the_http_infer_lane_is_on_unless_turned_off(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, "")
    assert load_config(path, {}).server.http_infer_lane is True
    environ = {"EDGE_AGENT_SERVER_HTTP_INFER_LANE": "false"}
    assert load_config(path, {}, environ).server.http_infer_lane is False
    path = repo_toml(tmp_path, "[server]\nhttp_infer_lane = false\n")
    assert load_config(path, {}).server.http_infer_lane is False
    with pytest.raises(AgentConfigError, match=r"server\.http_infer_lane"):
        load_config(repo_toml(tmp_path, '[server]\nhttp_infer_lane = "yes"\n'), {})


def test_log_level_is_case_insensitive(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, '[log]\nlevel = "WARNING"\n')

    assert load_config(path, {}).log.level is LogLevel.WARNING


@pytest.mark.parametrize("threads", [-1, 257, 100_000])
def test_intra_op_threads_out_of_range(tmp_path: Path, repo: Path, threads: int) -> None:
    path = repo_toml(tmp_path, f"intra_op_threads = {threads}\n")

    with pytest.raises(
        AgentConfigError,
        match=rf"models\.intra_op_threads must be from 0 to 256 .*, got {threads}",
    ):
        load_config(path, {})


def test_missing_repository_without_demo(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[server]\nhttp_port = 8000\n")

    with pytest.raises(AgentConfigError, match=r"no model repository.*--demo"):
        load_config(path, {})


def test_no_file_and_no_overrides() -> None:
    with pytest.raises(AgentConfigError, match="no model repository"):
        load_config(None, {})


def test_demo_without_repository() -> None:
    config = load_config(None, {"models.demo": True})

    assert config.models.demo is True
    assert config.models.repository is None


def test_demo_and_repository_are_exclusive(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, "demo = true\n")

    with pytest.raises(
        AgentConfigError, match=r"models\.repository and models\.demo are exclusive"
    ):
        load_config(path, {})


def test_demo_flag_with_repository_in_file_is_exclusive(tmp_path: Path, repo: Path) -> None:
    with pytest.raises(AgentConfigError, match="exclusive"):
        load_config(repo_toml(tmp_path), {"models.demo": True})


def test_repository_that_is_not_a_directory(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[models]\nrepository = "nowhere"\n')

    expected = f"models.repository: {tmp_path / 'nowhere'} is not a directory"

    with pytest.raises(AgentConfigError, match=re.escape(expected)):
        load_config(path, {})


def test_bad_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[server\nhttp_port = 1\n")

    with pytest.raises(AgentConfigError) as info:
        load_config(path, {})

    message = str(info.value)
    assert message.startswith(f"{path}: invalid TOML: ")
    assert "line 1" in message


def test_toml_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(b'[log]\nlevel = "\xff"\n')

    with pytest.raises(AgentConfigError, match="invalid TOML"):
        load_config(path, {})


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"

    with pytest.raises(AgentConfigError, match=re.escape(f"cannot read config file {path}")):
        load_config(path, {})


def test_canary_tables_are_read(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(
        tmp_path,
        "[canary.b]\nversion = 3\nshare = 0.2\nmax_p95_ms = 12.5\n"
        "[canary.a]\nversion = 2\nshare = 0.1\nwindow = 10\npromote_after = 20\n",
    )
    config = load_config(path, {})
    assert [(name, p.candidate, p.share) for name, p in config.canary] == [
        ("a", 2, 0.1),
        ("b", 3, 0.2),
    ]
    assert config.canary[0][1].window == 10
    assert config.canary[1][1].max_p95_us == 12_500


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("version = 2\nshare = 0.0\n", "canary.m.share"),
        ("version = 2\nshare = 1.5\n", "canary.m.share"),
        ('version = "2"\nshare = 0.1\n', "canary.m.version"),
        ("share = 0.1\n", "canary.m.version"),
        ("version = 2\nshare = 0.1\nmax_p95_ms = -1\n", "canary.m.max_p95_ms"),
        ("version = 2\nshare = 0.1\nwindow = 1.5\n", "canary.m.window"),
        ("version = 2\nshare = 0.1\nspeed = 3\n", "canary.m.speed"),
    ],
)
def test_bad_canary_value_names_the_key(tmp_path: Path, repo: Path, table: str, key: str) -> None:
    path = repo_toml(tmp_path, f"[canary.m]\n{table}")
    with pytest.raises(AgentConfigError, match=re.escape(f"config key '{key}'")):
        load_config(path, {})


def test_canary_must_hold_tables(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(tmp_path, "[canary]\nm = 3\n")
    with pytest.raises(AgentConfigError, match=r"config key 'canary\.m' must be a table"):
        load_config(path, {})


def test_server_name_is_read_and_must_not_be_empty(tmp_path: Path, repo: Path) -> None:
    assert load_config(repo_toml(tmp_path), {}).server.name == "edge-agent"
    named = load_config(repo_toml(tmp_path, '[server]\nname = "triton"\n'), {})
    assert named.server.name == "triton"
    with pytest.raises(AgentConfigError, match=r"server\.name must not be empty"):
        load_config(repo_toml(tmp_path, '[server]\nname = " "\n'), {})


CHOICES = [
    ("server", "grpc_engine", GrpcEngine, "grpcio", "loop, grpcio"),
    ("log", "level", LogLevel, "error", "debug, info, warning, error, critical"),
    ("log", "trace_mode", TraceMode, "opentelemetry", "triton, opentelemetry"),
    ("models", "control_mode", ModelControlMode, "explicit", "none, poll, explicit"),
    ("mqtt", "protocol", Protocol, "3.1.1", "auto, 5, 3.1.1"),
]


def toml_file(path: Path, sections: dict[str, dict[str, str]]) -> Path:
    """A config file serving `models` beside it, with these string keys."""
    tables = {"models": {"repository": "models"}}
    for section, keys in sections.items():
        tables[section] = {**tables.get(section, {}), **keys}
    text = "".join(
        f"[{name}]\n" + "".join(f'{k} = "{v}"\n' for k, v in keys.items())
        for name, keys in tables.items()
    )
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("section", "key", "choice", "spelling", "values"), CHOICES)
def test_a_closed_choice_is_its_enum_from_every_layer(
    tmp_path: Path,
    repo: Path,
    section: str,
    key: str,
    choice: type[Any],
    spelling: str,
    values: str,
) -> None:
    member = choice(spelling)
    broker = {"mqtt": {"host": "broker", "device_id": "d"}}  # an [mqtt] section is checked on
    plain = toml_file(tmp_path / "plain.toml", broker)
    in_file = toml_file(tmp_path / "set.toml", {**broker, section: {key: spelling}})
    env = {f"EDGE_AGENT_{section.upper()}_{key.upper()}": spelling}
    for config in (
        load_config(in_file, {}),
        load_config(plain, {}, env),
        load_config(plain, {f"{section}.{key}": spelling}),
    ):
        assert getattr(getattr(config, section), key) is member
        # `config show` writes the TOML spelling, which reads back as the same member
        shown = tmp_path / "shown.toml"
        shown.write_text(render_toml(config), encoding="utf-8")
        assert getattr(getattr(load_config(shown, {}), section), key) is member
    refused = rf"config key '{section}\.{key}' must be one of {re.escape(values)}, got 'nope'"
    with pytest.raises(AgentConfigError, match=refused):
        load_config(plain, {f"{section}.{key}": "nope"})
    with pytest.raises(AgentConfigError, match=refused):
        load_config(toml_file(tmp_path / "bad.toml", {**broker, section: {key: "nope"}}), {})


def test_a_spelling_given_in_code_becomes_its_member() -> None:
    """A config built in code (a test, a tool) holds members too, so `is` comparisons hold."""
    spelled: dict[str, Any] = {"grpc": "grpcio", "level": "WARNING", "mode": "poll", "v": "5"}
    assert ServerConfig(grpc_engine=spelled["grpc"]).grpc_engine is GrpcEngine.GRPCIO
    assert LogConfig(level=spelled["level"]).level is LogLevel.WARNING
    assert ModelsConfig(control_mode=spelled["mode"]).control_mode is ModelControlMode.POLL
    assert MqttConfig(protocol=spelled["v"]).protocol is Protocol.V5
    bad: Any = "zipkin"
    with pytest.raises(AgentConfigError, match=r"'log\.trace_mode' must be one of triton, opentel"):
        LogConfig(trace_mode=bad)
    with pytest.raises(AgentConfigError, match=r"'mqtt\.protocol' must be one of auto, 5, 3\.1\.1"):
        MqttConfig(protocol=bad)


def test_the_health_keys_are_read_and_become_the_restart_policy(tmp_path: Path, repo: Path) -> None:
    path = repo_toml(
        tmp_path,
        "restart_backoff_ms = 250\nrestart_backoff_max_ms = 4000\nrestart_limit = 2\n"
        "restart_reset_ms = 0\nheartbeat_interval_ms = 500\nheartbeat_timeout_ms = 3000\n"
        "allow_cpu_fallback = true\n[server]\nstrict_readiness = false\n",
    )
    config = load_config(path, {})
    assert config.server.strict_readiness is False
    assert config.models.allow_cpu_fallback is True
    assert restart_policy(config.models) == RestartPolicy(
        backoff_s=0.25,
        backoff_max_s=4.0,
        restart_limit=2,
        reset_after_s=0.0,
        heartbeat_interval_s=0.5,
        heartbeat_timeout_s=3.0,
    )
    defaults = load_config(repo_toml(tmp_path), {})
    assert defaults.server.strict_readiness is True  # Triton's default
    assert defaults.models.allow_cpu_fallback is False
    assert restart_policy(defaults.models) == RestartPolicy()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("restart_limit = -1", r"models\.restart_limit must be >= 0 \(0: no restarts\)"),
        ("restart_backoff_ms = 5", r"models\.restart_backoff_ms must be >= 10"),
        ("restart_backoff_max_ms = 100", r"restart_backoff_max_ms \(100\) must be at least"),
        ("heartbeat_timeout_ms = 1000", r"heartbeat_timeout_ms \(1000\) must be at least"),
        ("restart_reset_ms = -1", r"models\.restart_reset_ms must be >= 0"),
    ],
)
def test_bad_health_keys_name_the_key(tmp_path: Path, repo: Path, extra: str, message: str) -> None:
    with pytest.raises(AgentConfigError, match=message):
        load_config(repo_toml(tmp_path, extra + "\n"), {})
