"""Restricted API groups (Triton's `--http-restricted-api` / `--grpc-restricted-protocol`).

Every HTTP route and gRPC method belongs to exactly one API group, listed in `ENDPOINT_GROUPS`
(a test walks the HTTP router and the gRPC service and fails on any endpoint missing here, so a
new route must be added to this table). A restricted group answers only requests carrying its
header with its value; the others are refused with Triton's message:

* HTTP: 403 `{"error": "This API is restricted, expecting header '<key>'"}`;
* gRPC: UNAVAILABLE "This protocol is restricted, expecting header 'triton-grpc-protocol-<key>'".

A spec is Triton's `<group>,<group>...:<key>=<value>`; a group may be in one spec only. The
groups are Triton's, plus the agent's own `cache` (activate, rollback, versions, clear-rejected),
`canary` and `status` (the status page and its JSON). Pure: no sockets; the HTTP middleware
and gRPC interceptor call `refusal`.
"""

from __future__ import annotations

import hmac
import ipaddress
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agent.errors import AccessDeniedError, AgentError

__all__ = [
    "CONTROL_GROUPS",
    "ENDPOINT_GROUPS",
    "GROUPS",
    "GRPC_HEADER_PREFIX",
    "ApiAccess",
    "Headers",
    "RestrictedApiError",
    "Restrictions",
    "grpc_endpoint",
    "http_endpoint",
    "is_loopback_peer",
    "require_local_registrant",
    "parse_restrictions",
]

HEALTH = "health"
METADATA = "metadata"
INFERENCE = "inference"
SHARED_MEMORY = "shared-memory"
MODEL_CONFIG = "model-config"
MODEL_REPOSITORY = "model-repository"
STATISTICS = "statistics"
TRACE = "trace"
LOGGING = "logging"
CACHE = "cache"
CANARY = "canary"
STATUS = "status"

GROUPS = (
    HEALTH,
    METADATA,
    INFERENCE,
    SHARED_MEMORY,
    MODEL_CONFIG,
    MODEL_REPOSITORY,
    STATISTICS,
    TRACE,
    LOGGING,
    CACHE,
    CANARY,
    STATUS,
)
# The groups that change what the device serves or reads: open to the network, they hand a
# stranger the device (see `agent.config.security`).
CONTROL_GROUPS = (MODEL_REPOSITORY, CACHE, CANARY, SHARED_MEMORY)

GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # Triton prefixes the gRPC key with this

_MODEL = "/v2/models/{model}"
_VERSION = "/v2/models/{model}/versions/{version}"
_REPO = "/v2/repository/models/{model}"
_SHM = "/v2/systemsharedmemory"
_CUDA_SHM = "/v2/cudasharedmemory"

# THE table: every endpoint -> its group. HTTP keys are "<METHOD> <route>" (HEAD is answered as
# GET), gRPC keys "grpc <Method>". Add each new route or RPC here (a test checks).
ENDPOINT_GROUPS: dict[str, str] = {
    # health
    "GET /v2/health/live": HEALTH,
    "GET /v2/health/ready": HEALTH,
    f"GET {_MODEL}/ready": HEALTH,
    f"GET {_VERSION}/ready": HEALTH,
    "grpc ServerLive": HEALTH,
    "grpc ServerReady": HEALTH,
    "grpc ModelReady": HEALTH,
    # metadata
    "GET /v2": METADATA,
    "GET /v2/openapi.json": METADATA,  # the API's OpenAPI description
    f"GET {_MODEL}": METADATA,
    f"GET {_VERSION}": METADATA,
    "grpc ServerMetadata": METADATA,
    "grpc ModelMetadata": METADATA,
    # inference
    f"POST {_MODEL}/infer": INFERENCE,
    f"POST {_VERSION}/infer": INFERENCE,
    f"POST {_MODEL}/generate": INFERENCE,
    f"POST {_VERSION}/generate": INFERENCE,
    f"POST {_MODEL}/generate_stream": INFERENCE,
    f"POST {_VERSION}/generate_stream": INFERENCE,
    "grpc ModelInfer": INFERENCE,
    "grpc ModelStreamInfer": INFERENCE,
    # model-config
    f"GET {_MODEL}/config": MODEL_CONFIG,
    f"GET {_VERSION}/config": MODEL_CONFIG,
    "grpc ModelConfig": MODEL_CONFIG,
    # statistics
    "GET /v2/models/stats": STATISTICS,
    f"GET {_MODEL}/stats": STATISTICS,
    f"GET {_VERSION}/stats": STATISTICS,
    "grpc ModelStatistics": STATISTICS,
    # model-repository
    "POST /v2/repository/index": MODEL_REPOSITORY,
    f"POST {_REPO}/load": MODEL_REPOSITORY,
    f"POST {_REPO}/unload": MODEL_REPOSITORY,
    "grpc RepositoryIndex": MODEL_REPOSITORY,
    "grpc RepositoryModelLoad": MODEL_REPOSITORY,
    "grpc RepositoryModelUnload": MODEL_REPOSITORY,
    # cache (the agent's own: versions in the model cache)
    f"GET {_REPO}/versions": CACHE,
    f"POST {_REPO}/versions/{{version}}/activate": CACHE,
    f"POST {_REPO}/rollback": CACHE,
    f"POST {_REPO}/clear-rejected": CACHE,
    # canary (the agent's own)
    f"POST {_MODEL}/canary": CANARY,
    f"GET {_MODEL}/canary": CANARY,
    f"DELETE {_MODEL}/canary": CANARY,
    # trace
    "GET /v2/trace/setting": TRACE,
    "POST /v2/trace/setting": TRACE,
    f"GET {_MODEL}/trace/setting": TRACE,
    f"POST {_MODEL}/trace/setting": TRACE,
    "grpc TraceSetting": TRACE,
    # logging
    "GET /v2/logging": LOGGING,
    "POST /v2/logging": LOGGING,
    "grpc LogSettings": LOGGING,
    # shared-memory
    f"GET {_SHM}/status": SHARED_MEMORY,
    f"GET {_SHM}/region/{{region}}/status": SHARED_MEMORY,
    f"POST {_SHM}/region/{{region}}/register": SHARED_MEMORY,
    f"POST {_SHM}/unregister": SHARED_MEMORY,
    f"POST {_SHM}/region/{{region}}/unregister": SHARED_MEMORY,
    "grpc SystemSharedMemoryStatus": SHARED_MEMORY,
    "grpc SystemSharedMemoryRegister": SHARED_MEMORY,
    "grpc SystemSharedMemoryUnregister": SHARED_MEMORY,
    f"GET {_CUDA_SHM}/status": SHARED_MEMORY,
    f"GET {_CUDA_SHM}/region/{{region}}/status": SHARED_MEMORY,
    f"POST {_CUDA_SHM}/region/{{region}}/register": SHARED_MEMORY,
    f"POST {_CUDA_SHM}/unregister": SHARED_MEMORY,
    f"POST {_CUDA_SHM}/region/{{region}}/unregister": SHARED_MEMORY,
    "grpc CudaSharedMemoryStatus": SHARED_MEMORY,
    "grpc CudaSharedMemoryRegister": SHARED_MEMORY,
    "grpc CudaSharedMemoryUnregister": SHARED_MEMORY,
    # status (the agent's own: the status page, also behind server.status_token)
    "GET /": STATUS,
    "GET /v2/status": STATUS,
}


class Headers(Protocol):
    """What a refusal reads of a request's headers: aiohttp's (case-insensitive), gRPC
    metadata (lower-case keys), or the infer lane's parsed head (`agent.api.http.lane`)."""

    def get(self, name: str, /) -> str | None: ...


class RestrictedApiError(AgentError):
    """A request to a restricted group without its header and value (HTTP 403, gRPC
    UNAVAILABLE, as Triton answers)."""


def http_endpoint(method: str, route: str) -> str:
    """The `ENDPOINT_GROUPS` key of an HTTP route (its canonical path: `/v2/models/{model}`)."""
    return f"{'GET' if method == 'HEAD' else method} {route}"


def grpc_endpoint(method: str) -> str:
    """The `ENDPOINT_GROUPS` key of a gRPC method (a full `/pkg.Service/Method` or its name)."""
    return f"grpc {method.rpartition('/')[2]}"


@dataclass(frozen=True, slots=True)
class Restriction:
    """The header (lower case) and value a restricted group requires."""

    header: str
    value: str = field(repr=False)  # a credential: kept out of reprs and logs


@dataclass(frozen=True, slots=True)
class Restrictions:
    """Which groups are restricted, and how; empty: everything is open."""

    by_group: Mapping[str, Restriction] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_group)

    def refusal(self, endpoint: str, headers: Headers) -> str | None:
        """Why a request to `endpoint` is refused, or None when it may pass.

        Args:
            endpoint: an `ENDPOINT_GROUPS` key (`http_endpoint`, `grpc_endpoint`).
            headers: the request's headers (aiohttp's, case-insensitive) or gRPC metadata
                (keys in lower case).

        Returns:
            Triton's message (its wording by transport), or None. An endpoint missing from
            the table is refused whenever any group is restricted: unknown means closed.
        """
        group = ENDPOINT_GROUPS.get(endpoint)
        if group is None:
            if not self.by_group:
                return None
            return (
                f"This API is restricted: endpoint '{endpoint}' is in no API group "
                "(agent.api.access.ENDPOINT_GROUPS)"
            )
        rule = self.by_group.get(group)
        if rule is None:
            return None
        given = headers.get(rule.header)
        if given is not None and hmac.compare_digest(given.encode(), rule.value.encode()):
            return None
        kind = "protocol" if endpoint.startswith("grpc ") else "API"
        return f"This {kind} is restricted, expecting header '{rule.header}'"


class ApiAccess:
    """The restrictions in force on each protocol. A SIGHUP reload swaps them (one reference
    each), so a rotated header value applies to the next request without a restart.

    `enforced`: the protocols restricted at start, whose listener checks requests; an
    unrestricted one has no check at all (it costs nothing per request).
    """

    __slots__ = ("enforced", "grpc", "http")

    def __init__(self, http: Restrictions | None = None, grpc: Restrictions | None = None) -> None:
        self.http = http or Restrictions()
        self.grpc = grpc or Restrictions()
        self.enforced = frozenset(
            name for name, rules in (("http", self.http), ("grpc", self.grpc)) if rules
        )


def parse_restrictions(specs: Iterable[str], header_prefix: str = "") -> Restrictions:
    """Triton's `<group>[,<group>...]:<key>=<value>` specs (one per option given).

    Items that name groups only (no `:`) are joined to the next item: a comma-separated list in
    an environment variable splits a spec, and this puts it back together.

    Args:
        specs: the specs, e.g. `("model-repository,cache:admin-key=s3cret",)`.
        header_prefix: `GRPC_HEADER_PREFIX` for gRPC, "" for HTTP.

    Raises:
        ValueError: a malformed spec, an unknown group, or a group in two specs (the message
            follows Triton's).

    Returns:
        The restrictions by group.
    """
    rules: dict[str, Restriction] = {}
    pending: list[str] = []
    for item in specs:
        if ":" not in item:
            pending.append(item)
            continue
        names, _, setting = ",".join([*pending, item]).rpartition(":")
        pending = []
        key, sep, value = setting.partition("=")
        if not names or not sep or not key.strip():
            raise ValueError(f"restriction must be <group>,...:<key>=<value>, got '{_hide(item)}'")
        rule = Restriction((header_prefix + key.strip()).lower(), value)
        for name in (n.strip() for n in names.split(",")):
            if name not in GROUPS:
                raise ValueError(f"unknown restricted group '{name}' (known: {', '.join(GROUPS)})")
            if name in rules:
                raise ValueError(
                    f"restricted group '{name}' can not be specified in multiple config groups"
                )
            rules[name] = rule
    if pending:
        raise ValueError(
            f"restriction must be <group>,...:<key>=<value>, got '{','.join(pending)}'"
        )
    return Restrictions(rules)


def _hide(spec: str) -> str:
    """A spec with its value masked (error messages and logs never show a credential)."""
    head, sep, _ = spec.partition("=")
    return head + sep + ("********" if sep else "")


def is_loopback_peer(peer: str | None) -> bool:
    """Whether a client address is this machine: an aiohttp `request.remote` ("127.0.0.1") or a
    gRPC `context.peer()` ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "unix:/run/x.sock")."""
    if not peer:
        return False
    peer = urllib.parse.unquote(peer)  # grpc writes IPv6 peers as ipv6:%5B::1%5D:port
    kind, sep, rest = peer.partition(":")
    if sep and kind in ("ipv4", "ipv6", "unix", "unix-abstract"):
        if kind.startswith("unix"):
            return True
        host = rest.rpartition(":")[0] if kind == "ipv4" else rest.rpartition("]:")[0] + "]"
        peer = host.strip("[]")
    peer = peer.split("%", 1)[0]  # an IPv6 zone
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def require_local_registrant(peer: str | None) -> None:
    """Shared-memory registration (system or CUDA) maps memory of this machine: local clients only.

    Raises:
        AccessDeniedError: `peer` (as for `is_loopback_peer`) is not this machine.
    """
    if not is_loopback_peer(peer):
        raise AccessDeniedError(
            f"shared memory registration is for local clients only; refused for {peer}"
        )
