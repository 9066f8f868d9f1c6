"""The security posture of the listeners: TLS files, restricted API groups, and what an agent
bound beyond loopback is missing.

Fail safe: an agent bound beyond loopback (`server.host` not 127.0.0.0/8, ::1 or localhost)
should serve TLS and restrict the control groups (`agent.api.access.CONTROL_GROUPS`: model
repository, cache, canary, shared memory) on every open protocol. What it lacks is logged as a
warning at start (`exposure_problems`); with `server.strict_security` it refuses to start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.api.access import (
    CONTROL_GROUPS,
    GRPC_HEADER_PREFIX,
    SHARED_MEMORY,
    Restrictions,
    parse_restrictions,
)
from agent.api.tls import TlsFiles
from agent.errors import AgentConfigError
from agent.pages import is_loopback_host

if TYPE_CHECKING:
    from agent.config.schema import ServerConfig

__all__ = [
    "exposure_problems",
    "grpc_restrictions",
    "http_restrictions",
    "tls_files",
    "validate_security",
]


def http_restrictions(server: ServerConfig) -> Restrictions:
    """`server.http_restricted_api` parsed (validated at load: cannot fail afterwards)."""
    return _parse("server.http_restricted_api", server.http_restricted_api, "")


def grpc_restrictions(server: ServerConfig) -> Restrictions:
    """`server.grpc_restricted_protocol` parsed (metadata key `triton-grpc-protocol-<key>`)."""
    return _parse(
        "server.grpc_restricted_protocol", server.grpc_restricted_protocol, GRPC_HEADER_PREFIX
    )


def tls_files(server: ServerConfig) -> TlsFiles | None:
    """The TLS files, or None when TLS is off."""
    if server.tls_cert_file is None or server.tls_key_file is None:
        return None
    return TlsFiles(server.tls_cert_file, server.tls_key_file, server.tls_client_ca_file)


def exposure_problems(server: ServerConfig) -> list[str]:
    """What an agent bound beyond loopback lacks; empty on loopback or when protected.

    Returns:
        One sentence per problem, each naming the keys (and flags) that fix it.
    """
    if is_loopback_host(server.host):
        return []
    where = f"server.host = {server.host or '(every address)'} is beyond loopback"
    problems: list[str] = []
    if tls_files(server) is None:
        problems.append(
            f"{where} without TLS: set server.tls_cert_file and server.tls_key_file "
            "(--tls-cert-file, --tls-key-file)"
        )
    needed = [g for g in CONTROL_GROUPS if g != SHARED_MEMORY or server.shared_memory]
    listeners = [("HTTP", "http_restricted_api", http_restrictions(server))]
    if server.grpc_port >= 0:
        listeners.append(("gRPC", "grpc_restricted_protocol", grpc_restrictions(server)))
    for name, key, restrictions in listeners:
        open_groups = [g for g in needed if g not in restrictions.by_group]
        if open_groups:
            flag = "--" + key.replace("_", "-")
            problems.append(
                f"{where} with {name} control groups open ({', '.join(open_groups)}): set "
                f"server.{key} ({flag}={','.join(open_groups)}:<key>=<value>)"
            )
    return problems


def validate_security(server: ServerConfig) -> None:
    """Check the TLS and restriction keys; with `strict_security`, refuse an exposed agent.

    Raises:
        AgentConfigError: the first problem, naming the key (strict: every problem, one line).
    """
    if (server.tls_cert_file is None) != (server.tls_key_file is None):
        raise AgentConfigError("server.tls_cert_file and server.tls_key_file go together")
    if server.tls_client_ca_file is not None and server.tls_cert_file is None:
        raise AgentConfigError(
            "server.tls_client_ca_file (mutual TLS) needs server.tls_cert_file and "
            "server.tls_key_file"
        )
    http_restrictions(server)
    grpc_restrictions(server)
    if server.strict_security:
        problems = exposure_problems(server)
        if problems:
            raise AgentConfigError(
                "server.strict_security refuses to start: " + "; ".join(problems)
            )


def _parse(key: str, specs: tuple[str, ...], prefix: str) -> Restrictions:
    try:
        return parse_restrictions(specs, prefix)
    except ValueError as exc:
        raise AgentConfigError(f"{key}: {exc}") from None
