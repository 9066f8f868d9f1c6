"""The agent's settings: frozen dataclasses, read once at start-up by `agent.config.loader`.

    [server]  name, host, http_port, http_infer_lane, grpc_port, grpc_engine, metrics_port,
              max_request_bytes,
              shared_memory, max_bytes_elements, max_connections, header_timeout_ms,
              body_timeout_ms, idle_timeout_ms, send_timeout_ms, stop_timeout_ms, tls_cert_file,
              tls_key_file,
              tls_client_ca_file,
              http_restricted_api, grpc_restricted_protocol, strict_security, status_token,
              status_sample_ms, strict_readiness
    [models]  repository, demo, strict_model_config, exit_on_error, intra_op_threads,
              memory_budget_bytes, inflight_memory_bytes, response_cache_bytes, max_queue_size,
              control_mode,
              load_models, poll_quiet_ms, restart_backoff_ms, restart_backoff_max_ms,
              restart_limit, restart_reset_ms, heartbeat_interval_ms, heartbeat_timeout_ms,
              allow_cpu_fallback
    [cache]   dir, keep_last, disk_budget_bytes
    [sync]    source, trusted_root, desired, interval_s, jitter_s, ... (see sync/config.py)
    [mqtt]    host, port, device_id, tls_*, topic_prefix, telemetry_interval_ms, slo, ...
              (see agent/fleet/config.py)
    [log]     level, trace_file, trace_mode, trace_otlp_url, trace_otlp_resource
    [canary.MODEL]  version, share, promote_after, window, min_requests, max_error_rate,
              max_p95_ms (one table per model; see agent/canary/policy.py)

The closed choices (`server.grpc_engine`, `log.level`, `log.trace_mode`, `models.control_mode`,
`mqtt.protocol`) are enums (`agent.config.choices`), parsed by the loader. `validate` checks what
the types cannot (ranges, exclusive keys, what `serve` needs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from agent.backends.health import RestartPolicy
from agent.backends.intra_op import MAX_INTRA_OP_THREADS
from agent.canary.policy import CanaryPolicy
from agent.config.choices import GrpcEngine, LogLevel, ModelControlMode, TraceMode, parse_choice
from agent.config.extras import missing_extra
from agent.config.security import validate_security
from agent.errors import AgentConfigError
from agent.fleet.config import MqttConfig, validate_mqtt
from sync.config import SyncConfig
from sync.config import validate as validate_sync
from sync.errors import SyncConfigError


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Network endpoints."""

    name: str = "edge-agent"  # server metadata's "name" (a fleet whose clients check it: "triton")
    host: str = "127.0.0.1"
    http_port: int = 8000
    http_infer_lane: bool = True  # /infer served straight from the connection (api.md)
    grpc_port: int = 8001  # KServe v2 gRPC; -1 turns it off
    grpc_engine: GrpcEngine = GrpcEngine.LOOP  # loop: HTTP/2 on the event loop; grpcio: grpc.aio
    metrics_port: int = 8002  # Prometheus /metrics; -1 turns it off
    max_request_bytes: int = 64 * 1024 * 1024
    shared_memory: bool = True  # Triton's system shared-memory extension for local clients
    # Resource limits (agent/api/http/limits.py, agent/tensors/limits.py):
    max_bytes_elements: int = 1 << 20  # elements of one BYTES input tensor
    max_connections: int = 2048  # HTTP connections open at once (per listener); more: 503
    header_timeout_ms: int = 30_000  # request line + headers, from their first byte
    body_timeout_ms: int = 60_000  # a request's body, once its headers are in; else 408
    idle_timeout_ms: int = 75_000  # an HTTP or gRPC connection without a request is closed
    # A gRPC connection whose unsent answers are over its cap and whose peer takes no byte for
    # this long is closed (agent/api/grpc/sending.py).
    send_timeout_ms: int = 30_000
    # The whole stop on SIGTERM (agent/runtime/shutdown.py): under the unit's TimeoutStopSec=45s.
    stop_timeout_ms: int = 40_000
    # Off loopback (agent/api/tls.py, agent/api/access.py, agent/config/security.py):
    tls_cert_file: Path | None = None  # set (with tls_key_file): HTTP, gRPC, metrics over TLS
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None  # set: mutual TLS, clients need a cert it signed
    http_restricted_api: tuple[str, ...] = ()  # Triton's "<group>,...:<key>=<value>" specs
    grpc_restricted_protocol: tuple[str, ...] = ()  # the same; header triton-grpc-protocol-<key>
    strict_security: bool = False  # refuse to start beyond loopback without TLS + restrictions
    # The status page (GET /, GET /v2/status): open on loopback; beyond, only with this token.
    status_token: str = ""
    status_sample_ms: int = 5000  # how often the page's figures and sparklines are sampled
    # Triton's --strict-readiness: /v2/health/ready only while every known model version serves.
    strict_readiness: bool = True

    def __post_init__(self) -> None:  # a spelling given in code becomes its member
        engine = parse_choice("server.grpc_engine", GrpcEngine, self.grpc_engine)
        object.__setattr__(self, "grpc_engine", engine)


@dataclass(frozen=True, slots=True)
class ModelsConfig:
    """Which repository is served and how models load."""

    repository: Path | None = None
    demo: bool = False  # serve the built-in demo repository (generated on first use)
    strict_model_config: bool = False  # True: no auto-complete from the model file
    exit_on_error: bool = True  # a model that fails to load stops start-up
    intra_op_threads: int = 0  # ONNX Runtime threads per run; 0: all cores alone, else shared
    memory_budget_bytes: int = 0  # 0: the cgroup's memory.max, else 80% of RAM
    # The budget's share kept for requests in flight (agent.models.inflight); 0: a quarter of
    # the budget, between 64 MiB and 1 GiB.
    inflight_memory_bytes: int = 0
    response_cache_bytes: int = 64 * 1024 * 1024  # agent-wide, for models with response_cache
    max_queue_size: int = 1024  # per model version, when the config sets no max_queue_size
    control_mode: ModelControlMode = ModelControlMode.NONE  # Triton's --model-control-mode
    load_models: tuple[str, ...] = ()  # explicit mode: models to load at start ("*": all)
    poll_quiet_ms: int = 1000  # poll mode: act once a model folder has been quiet this long
    # Instances that fail while serving (docs/operations.md, "Health of models"):
    restart_backoff_ms: int = 500  # before the first restart; doubled for each one in a row
    restart_backoff_max_ms: int = 30_000
    restart_limit: int = 5  # restarts in a row before the version gives up; 0: none
    restart_reset_ms: int = 60_000  # serving this long forgets an instance's failures
    heartbeat_interval_ms: int = 2000  # Python workers: a PING this often
    heartbeat_timeout_ms: int = 10_000  # no PONG within it: hung (killed, restarted)
    # An ONNX model asking for an accelerator this device lacks runs on the CPU (flagged)
    # instead of being refused.
    allow_cpu_fallback: bool = False

    def __post_init__(self) -> None:  # a spelling given in code becomes its member
        mode = parse_choice("models.control_mode", ModelControlMode, self.control_mode)
        object.__setattr__(self, "control_mode", mode)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The local model cache (content-addressed store, served through an atomic view)."""

    dir: Path | None = None  # set: serve the cache's repository view unless a repository is given
    keep_last: int = 2  # retained versions per model besides the active one
    disk_budget_bytes: int = 0  # 0: no budget


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Logging."""

    level: LogLevel = LogLevel.INFO
    trace_file: Path | None = None  # Triton's trace JSON (settings: /v2/trace/setting)
    trace_mode: TraceMode = TraceMode.TRITON  # triton: the trace file; opentelemetry: OTLP/HTTP
    trace_otlp_url: str = ""  # opentelemetry mode; "": Triton's http://localhost:4318/v1/traces
    trace_otlp_resource: tuple[str, ...] = ()  # opentelemetry mode: "key=value" attributes

    def __post_init__(self) -> None:  # a spelling given in code becomes its member
        object.__setattr__(self, "level", parse_choice("log.level", LogLevel, self.level))
        mode = parse_choice("log.trace_mode", TraceMode, self.trace_mode)
        object.__setattr__(self, "trace_mode", mode)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Every setting of the agent."""

    server: ServerConfig = ServerConfig()
    models: ModelsConfig = ModelsConfig()
    cache: CacheConfig = CacheConfig()
    sync: SyncConfig = dataclasses.field(default_factory=SyncConfig)
    mqtt: MqttConfig = dataclasses.field(default_factory=MqttConfig)
    log: LogConfig = LogConfig()
    canary: tuple[tuple[str, CanaryPolicy], ...] = ()  # (model, policy), sorted by model


def config_sections() -> dict[str, type[Any]]:
    """`AgentConfig`'s sections: name → dataclass (`canary`, a table per model, is not one)."""
    hints = get_type_hints(AgentConfig)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(AgentConfig)
        if dataclasses.is_dataclass(hints[f.name])
    }


def validate(config: AgentConfig, *, serving: bool = True) -> None:
    """Check values beyond their types; `serving`: also what `serve` needs (a repository).

    Raises:
        AgentConfigError: the first problem, naming the key.
    """
    server, models = config.server, config.models
    if not 0 <= server.http_port <= 65535:
        raise AgentConfigError(f"server.http_port must be 0..65535, got {server.http_port}")
    if not -1 <= server.grpc_port <= 65535:
        raise AgentConfigError(
            f"server.grpc_port must be 0..65535 (or -1 for off), got {server.grpc_port}"
        )
    if not -1 <= server.metrics_port <= 65535:
        raise AgentConfigError(
            f"server.metrics_port must be 0..65535 (or -1 for off), got {server.metrics_port}"
        )
    if not server.name.strip():
        raise AgentConfigError("server.name must not be empty")
    if server.max_request_bytes < 1024:
        raise AgentConfigError(
            f"server.max_request_bytes must be at least 1024, got {server.max_request_bytes}"
        )
    for key in ("max_bytes_elements", "max_connections"):
        if getattr(server, key) < 1:
            raise AgentConfigError(f"server.{key} must be >= 1, got {getattr(server, key)}")
    timeouts = ("header_timeout_ms", "body_timeout_ms", "idle_timeout_ms", "send_timeout_ms")
    for key in (*timeouts, "status_sample_ms"):
        if getattr(server, key) < 10:
            raise AgentConfigError(f"server.{key} must be >= 10, got {getattr(server, key)}")
    if server.stop_timeout_ms < 100:
        raise AgentConfigError(
            f"server.stop_timeout_ms must be >= 100, got {server.stop_timeout_ms} "
            "(keep it under the systemd unit's TimeoutStopSec)"
        )
    _validate_trace(config.log)
    validate_security(server)
    if server.grpc_engine is GrpcEngine.GRPCIO and server.grpc_port >= 0:
        _need_extra("grpcio", 'server.grpc_engine = "grpcio"')
    if not 0 <= models.intra_op_threads <= MAX_INTRA_OP_THREADS:
        raise AgentConfigError(
            f"models.intra_op_threads must be from 0 to {MAX_INTRA_OP_THREADS} "
            f"(0: every core for a run alone), got {models.intra_op_threads}"
        )
    for key in (
        "memory_budget_bytes",
        "inflight_memory_bytes",
        "response_cache_bytes",
    ):
        if getattr(models, key) < 0:
            raise AgentConfigError(f"models.{key} must be >= 0")
    if models.max_queue_size < 1:
        raise AgentConfigError("models.max_queue_size must be >= 1")
    if models.load_models and models.control_mode is not ModelControlMode.EXPLICIT:
        raise AgentConfigError('models.load_models needs models.control_mode = "explicit"')
    if models.poll_quiet_ms < 10:
        raise AgentConfigError("models.poll_quiet_ms must be >= 10")
    _validate_health(models)
    if config.cache.keep_last < 0 or config.cache.disk_budget_bytes < 0:
        raise AgentConfigError("cache.keep_last and cache.disk_budget_bytes must be >= 0")
    try:
        validate_sync(config.sync, config.cache.dir)
    except SyncConfigError as exc:
        raise AgentConfigError(exc.message) from None
    validate_mqtt(config.mqtt)
    if serving:
        _validate_repository(config)


def _validate_health(models: ModelsConfig) -> None:
    for key in ("restart_backoff_ms", "restart_backoff_max_ms", "heartbeat_interval_ms"):
        if getattr(models, key) < 10:
            raise AgentConfigError(f"models.{key} must be >= 10, got {getattr(models, key)}")
    if models.restart_backoff_max_ms < models.restart_backoff_ms:
        raise AgentConfigError(
            f"models.restart_backoff_max_ms ({models.restart_backoff_max_ms}) must be at least "
            f"models.restart_backoff_ms ({models.restart_backoff_ms})"
        )
    if models.restart_limit < 0:
        raise AgentConfigError(
            f"models.restart_limit must be >= 0 (0: no restarts), got {models.restart_limit}"
        )
    if models.restart_reset_ms < 0:
        raise AgentConfigError(
            f"models.restart_reset_ms must be >= 0, got {models.restart_reset_ms}"
        )
    if models.heartbeat_timeout_ms < models.heartbeat_interval_ms:
        raise AgentConfigError(
            f"models.heartbeat_timeout_ms ({models.heartbeat_timeout_ms}) must be at least "
            f"models.heartbeat_interval_ms ({models.heartbeat_interval_ms})"
        )


def restart_policy(models: ModelsConfig) -> RestartPolicy:
    """The `[models]` health keys as the backends take them (seconds)."""
    return RestartPolicy(
        backoff_s=models.restart_backoff_ms / 1000,
        backoff_max_s=models.restart_backoff_max_ms / 1000,
        restart_limit=models.restart_limit,
        reset_after_s=models.restart_reset_ms / 1000,
        heartbeat_interval_s=models.heartbeat_interval_ms / 1000,
        heartbeat_timeout_s=models.heartbeat_timeout_ms / 1000,
    )


def _need_extra(extra: str, feature: str) -> None:
    missing = missing_extra(extra, feature)
    if missing is not None:
        raise AgentConfigError(missing)


def _validate_trace(log: LogConfig) -> None:
    if log.trace_mode is TraceMode.OPENTELEMETRY:
        _need_extra("otel", 'log.trace_mode = "opentelemetry"')
        if log.trace_file is not None:
            raise AgentConfigError(
                'log.trace_file is for log.trace_mode = "triton"; opentelemetry mode exports '
                "spans to log.trace_otlp_url"
            )
        if log.trace_otlp_url and not log.trace_otlp_url.startswith(("http://", "https://")):
            raise AgentConfigError(
                f"log.trace_otlp_url must be an http:// or https:// URL, got {log.trace_otlp_url!r}"
            )
        for pair in log.trace_otlp_resource:
            key, sep, _ = pair.partition("=")
            if not sep or not key.strip():
                raise AgentConfigError(
                    f"log.trace_otlp_resource entries must be <key>=<value>, got {pair!r}"
                )
    elif log.trace_otlp_url or log.trace_otlp_resource:
        raise AgentConfigError(
            'log.trace_otlp_url and log.trace_otlp_resource need log.trace_mode = "opentelemetry"'
        )


def _validate_repository(config: AgentConfig) -> None:
    models = config.models
    if models.repository is None and not models.demo and config.cache.dir is None:
        raise AgentConfigError(
            "no model repository: pass --model-repository DIR, --cache-dir DIR, set "
            "models.repository, or use --demo"
        )
    if models.repository is not None and config.cache.dir is not None:
        raise AgentConfigError(
            "models.repository and cache.dir are exclusive: the cache serves its own repository"
        )
    if models.control_mode is ModelControlMode.POLL and config.cache.dir is not None:
        raise AgentConfigError(
            'models.control_mode = "poll" watches a plain repository; the cache changes its '
            "view itself (activate/rollback)"
        )
    if models.repository is not None and models.demo:
        raise AgentConfigError("models.repository and models.demo are exclusive: choose one")
    if models.repository is not None and not models.repository.is_dir():
        raise AgentConfigError(f"models.repository: {models.repository} is not a directory")
