"""Restricted API groups (agent.api.access) and the security keys of the config."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.api.access import (
    CONTROL_GROUPS,
    ENDPOINT_GROUPS,
    GROUPS,
    grpc_endpoint,
    http_endpoint,
    is_loopback_peer,
    parse_restrictions,
)
from agent.api.http.app import create_app
from agent.config.choices import ModelControlMode
from agent.config.loader import load_config
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.config.security import exposure_problems
from agent.config.tools import show_command
from agent.errors import AgentConfigError
from agent.pages import is_loopback_host
from agent.proto import grpc_service_pb2 as pb
from agent.runtime.daemon import RunningAgent
from agent.runtime.reload import restart_keys
from tests.server import running_agent


@pytest.fixture(scope="module")
def empty_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("empty")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=repo, control_mode=ModelControlMode.EXPLICIT),
    )
    with running_agent(config) as agent:
        yield agent


def test_every_http_route_and_grpc_method_is_in_ENDPOINT_GROUPS(
    empty_agent: RunningAgent,
) -> None:
    """A new route or RPC must be given its API group in agent/api/access.py ENDPOINT_GROUPS."""
    app = create_app(empty_agent.dataplane, max_request_bytes=1 << 20)
    http = {
        http_endpoint(route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    grpc = {
        grpc_endpoint(method.name)
        for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    }
    missing = sorted((http | grpc) - ENDPOINT_GROUPS.keys())
    assert not missing, f"add these to agent.api.access.ENDPOINT_GROUPS: {missing}"
    stale = sorted(ENDPOINT_GROUPS.keys() - http - grpc)
    assert not stale, f"ENDPOINT_GROUPS names endpoints that do not exist: {stale}"
    assert set(ENDPOINT_GROUPS.values()) == set(GROUPS)


def test_triton_syntax_and_grpc_header_prefix() -> None:
    http = parse_restrictions(["model-repository,cache:Admin-Key=s3cret", "trace:t=1"])
    assert http.by_group["cache"].header == "admin-key"
    assert http.by_group["cache"].value == "s3cret"
    assert sorted(http.by_group) == ["cache", "model-repository", "trace"]
    grpc = parse_restrictions(["statistics:admin-key=s3cret"], "triton-grpc-protocol-")
    assert grpc.by_group["statistics"].header == "triton-grpc-protocol-admin-key"


def test_a_comma_split_spec_from_the_environment_is_joined_again() -> None:
    split = ["model-repository", "cache", "canary:admin-key=s3cret"]
    assert sorted(parse_restrictions(split).by_group) == ["cache", "canary", "model-repository"]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["bogus:k=v"], "unknown restricted group 'bogus'"),
        (["trace:k=v", "trace:j=w"], "restricted group 'trace' can not be specified in multiple"),
        (["trace:novalue"], "must be <group>,...:<key>=<value>"),
        (["trace"], "must be <group>,...:<key>=<value>"),
    ],
)
def test_bad_specs_are_refused_with_triton_wording(specs: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_restrictions(specs)


def test_refusal_uses_triton_messages_and_compares_the_value() -> None:
    http = parse_restrictions(["model-repository:admin-key=s3cret"])
    load = "POST /v2/repository/models/{model}/load"
    assert http.refusal(load, {}) == "This API is restricted, expecting header 'admin-key'"
    assert http.refusal(load, {"admin-key": "wrong"}) is not None
    assert http.refusal(load, {"admin-key": "s3cret"}) is None
    assert http.refusal("POST /v2/models/{model}/infer", {}) is None  # inference stays open
    grpc = parse_restrictions(["model-repository:admin-key=s3cret"], "triton-grpc-protocol-")
    assert grpc.refusal(grpc_endpoint("/inference.GRPCInferenceService/RepositoryIndex"), {}) == (
        "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    )


def test_an_endpoint_missing_from_the_table_is_closed_once_anything_is_restricted() -> None:
    assert parse_restrictions([]).refusal("GET /v2/new", {}) is None
    refusal = parse_restrictions(["trace:k=v"]).refusal("GET /v2/new", {"k": "v"})
    assert refusal is not None
    assert "ENDPOINT_GROUPS" in refusal


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("ipv4:127.0.0.1:5000", True),
        ("ipv6:[::1]:5000", True),
        ("ipv6:%5B::1%5D:5000", True),
        ("unix:/run/agent.sock", True),
        ("::ffff:127.0.0.1", True),
        ("192.0.2.7", False),
        ("ipv4:10.1.2.3:5000", False),
        ("ipv6:[fd00::2]:5000", False),
        (None, False),
        ("garbage", False),
    ],
)
def test_loopback_peers(peer: str | None, local: bool) -> None:
    assert is_loopback_peer(peer) is local


def test_loopback_hosts() -> None:
    assert all(map(is_loopback_host, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert not any(map(is_loopback_host, ["0.0.0.0", "::", "", "192.0.2.7", "device.local"]))


def test_exposed_without_protection_names_what_to_fix() -> None:
    problems = exposure_problems(ServerConfig(host="0.0.0.0"))
    assert len(problems) == 3  # TLS, HTTP groups, gRPC groups
    assert "server.tls_cert_file" in problems[0]
    assert "model-repository, cache, canary, shared-memory" in problems[1]
    assert "--http-restricted-api=" in problems[1]
    assert "--grpc-restricted-protocol=" in problems[2]
    assert exposure_problems(ServerConfig()) == []  # loopback: nothing to say


def test_protected_exposure_has_no_problem(tmp_path: Path) -> None:
    control = ",".join(CONTROL_GROUPS) + ":admin-key=s3cret"
    server = ServerConfig(
        host="0.0.0.0",
        tls_cert_file=tmp_path / "c.pem",
        tls_key_file=tmp_path / "k.pem",
        http_restricted_api=(control,),
        grpc_restricted_protocol=(control,),
    )
    assert exposure_problems(server) == []
    # Without shared memory served, its group needs no restriction.
    no_shm = ",".join(g for g in CONTROL_GROUPS if g != "shared-memory") + ":a=b"
    server = ServerConfig(
        host="0.0.0.0",
        grpc_port=-1,
        shared_memory=False,
        tls_cert_file=tmp_path / "c.pem",
        tls_key_file=tmp_path / "k.pem",
        http_restricted_api=(no_shm,),
    )
    assert exposure_problems(server) == []


def test_strict_security_refuses_at_load_in_one_line(tmp_path: Path) -> None:
    flags = {"server.host": "0.0.0.0", "server.strict_security": True}
    with pytest.raises(AgentConfigError) as caught:
        load_config(None, {**flags, "models.repository": str(tmp_path)})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("server.strict_security refuses to start")
    assert "server.tls_cert_file" in message
    assert "server.http_restricted_api" in message


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"server.tls_cert_file": "c.pem"}, "go together"),
        ({"server.tls_client_ca_file": "ca.pem"}, "needs server.tls_cert_file"),
        ({"server.http_restricted_api": ("nope:k=v",)}, "server.http_restricted_api: unknown"),
        ({"server.grpc_restricted_protocol": ("trace",)}, "server.grpc_restricted_protocol: "),
    ],
)
def test_bad_security_keys_name_the_key(flags: dict[str, object], message: str) -> None:
    with pytest.raises(AgentConfigError, match=message):
        load_config(None, flags, serving=False)


def test_environment_carries_restrictions_and_config_show_masks_the_value(
    tmp_path: Path,
) -> None:
    environ = {
        "EDGE_AGENT_SERVER_HTTP_RESTRICTED_API": "model-repository,cache:admin-key=s3cret",
        "EDGE_AGENT_SERVER_GRPC_RESTRICTED_PROTOCOL": '["model-repository,cache:admin-key=s3cret"]',
        "EDGE_AGENT_SERVER_TLS_CERT_FILE": str(tmp_path / "server.crt"),
        "EDGE_AGENT_SERVER_TLS_KEY_FILE": str(tmp_path / "server.key"),
        "EDGE_AGENT_SERVER_STRICT_SECURITY": "false",
        "EDGE_AGENT_MODELS_REPOSITORY": str(tmp_path),
    }
    config = load_config(None, None, environ, serving=False)
    assert config.server.tls_key_file == tmp_path / "server.key"
    out, err = io.StringIO(), io.StringIO()
    assert show_command(None, environ, out=out, err=err) == 0, err.getvalue()
    shown = out.getvalue()
    assert "s3cret" not in shown
    assert 'grpc_restricted_protocol = ["model-repository,cache:admin-key=********"]' in shown
    assert f'tls_key_file = "{tmp_path / "server.key"}"' in shown  # a path is not a secret


def test_restricted_groups_change_live_on_reload_but_tls_paths_need_a_restart() -> None:
    old = AgentConfig(server=ServerConfig(http_restricted_api=("trace:k=one",)))
    new = AgentConfig(
        server=ServerConfig(
            http_restricted_api=("trace:k=two",),
            grpc_restricted_protocol=("trace:k=two",),
            tls_cert_file=Path("/etc/edge-agent/tls/new.crt"),
            tls_key_file=Path("/etc/edge-agent/tls/new.key"),
        )
    )
    assert restart_keys(old, new) == ["server.tls_cert_file", "server.tls_key_file"]
