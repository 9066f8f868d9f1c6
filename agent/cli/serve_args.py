"""`edge-agent serve`: its flags, each named after the config key it sets (`section.key`).

Flags win over `EDGE_AGENT_*` variables, which win over the file (`agent.config.loader`);
`config_flags` hands the given ones to the loader.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.config.choices import GrpcEngine, ModelControlMode, TraceMode

__all__ = ["add_serve_command", "config_flags"]


def add_serve_command(commands: Any) -> None:
    """Add `serve` and its flags to the sub-command parsers."""
    serve = commands.add_parser("serve", help="serve a model repository over KServe v2 HTTP")
    serve.add_argument("--config", type=Path, help="TOML config file (flags win over it)")
    serve.add_argument("--model-repository", type=Path, dest="models.repository", metavar="DIR")
    serve.add_argument(
        "--demo",
        action="store_const",
        const=True,
        dest="models.demo",
        help="serve the built-in demo repository (generated locally on first use)",
    )
    serve.add_argument("--host", dest="server.host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, dest="server.http_port", help="default 8000")
    serve.add_argument(
        "--http-infer-lane",
        type=_bool_value,
        nargs="?",
        const=True,
        dest="server.http_infer_lane",
        metavar="BOOL",
        help="false: every HTTP request through aiohttp's handler (default true)",
    )
    serve.add_argument(
        "--grpc-port", type=int, dest="server.grpc_port", help="default 8001; -1: off"
    )
    serve.add_argument(
        "--grpc-engine",
        dest="server.grpc_engine",
        choices=[engine.value for engine in GrpcEngine],
        help="gRPC server: loop (HTTP/2 on the event loop, default) or grpcio (grpc.aio)",
    )
    serve.add_argument(
        "--metrics-port", type=int, dest="server.metrics_port", help="default 8002; -1: off"
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        dest="server.max_request_bytes",
        help="largest request body accepted (default 64 MiB)",
    )
    serve.add_argument(
        "--shared-memory",
        action=argparse.BooleanOptionalAction,
        dest="server.shared_memory",
        help="let local clients pass tensors in system shared memory (default on)",
    )
    serve.add_argument(
        "--tls-cert-file",
        type=Path,
        dest="server.tls_cert_file",
        metavar="PEM",
        help="serve HTTP, gRPC and metrics over TLS with this certificate (chain)",
    )
    serve.add_argument("--tls-key-file", type=Path, dest="server.tls_key_file", metavar="PEM")
    serve.add_argument(
        "--tls-client-ca-file",
        type=Path,
        dest="server.tls_client_ca_file",
        metavar="PEM",
        help="mutual TLS: require client certificates signed by this CA",
    )
    serve.add_argument(
        "--http-restricted-api",
        action="append",
        dest="server.http_restricted_api",
        metavar="<API>,...:<KEY>=<VALUE>",
        help="Triton's restricted API group: these APIs answer only requests with header KEY: "
        "VALUE (repeatable; groups: health, metadata, inference, shared-memory, model-config, "
        "model-repository, statistics, trace, logging, cache, canary)",
    )
    serve.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        dest="server.grpc_restricted_protocol",
        metavar="<PROTOCOL>,...:<KEY>=<VALUE>",
        help="the same for gRPC (metadata triton-grpc-protocol-KEY: VALUE)",
    )
    serve.add_argument(
        "--strict-security",
        action="store_const",
        const=True,
        dest="server.strict_security",
        help="refuse to start beyond loopback without TLS and restricted control groups",
    )
    serve.add_argument(
        "--strict-readiness",
        type=_bool_value,
        nargs="?",
        const=True,
        dest="server.strict_readiness",
        metavar="BOOL",
        help="true (default): /v2/health/ready only while every loaded model version serves; "
        "false: while the server answers (Triton's --strict-readiness)",
    )
    serve.add_argument(
        "--exit-on-error",
        action=argparse.BooleanOptionalAction,
        dest="models.exit_on_error",
        help="stop start-up when a model fails to load (default) or serve the rest",
    )
    serve.add_argument(
        "--strict-model-config",
        type=_bool_value,
        nargs="?",
        const=True,
        dest="models.strict_model_config",
        metavar="BOOL",
        help="true: never complete configs from the model file (default false)",
    )
    serve.add_argument(
        "--disable-auto-complete-config",
        action="store_const",
        const=True,
        dest="models.strict_model_config",
        help="same as --strict-model-config=true",
    )
    serve.add_argument("--intra-op-threads", type=int, dest="models.intra_op_threads")
    serve.add_argument(
        "--model-control-mode",
        choices=[mode.value for mode in ModelControlMode],
        dest="models.control_mode",
        help="none: serve what is there at start; poll: watch the repository; explicit: load "
        "and unload on request (default none)",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        dest="models.load_models",
        metavar="MODEL",
        help="explicit mode: load this model at start (repeatable; '*' loads all)",
    )
    serve.add_argument(
        "--memory-budget-bytes",
        type=int,
        dest="models.memory_budget_bytes",
        help="memory the models may use (default: cgroup memory.max, else 80%% of RAM)",
    )
    serve.add_argument(
        "--inflight-memory-bytes",
        type=int,
        dest="models.inflight_memory_bytes",
        help="the memory budget's share kept for requests in flight "
        "(default: a quarter of the budget, 64 MiB to 1 GiB)",
    )
    serve.add_argument(
        "--response-cache-bytes",
        type=int,
        dest="models.response_cache_bytes",
        help="agent-wide response cache size (default 64 MiB)",
    )
    serve.add_argument(
        "--cache-dir",
        type=Path,
        dest="cache.dir",
        help="model cache root: serve its repository view (versions activated atomically)",
    )
    serve.add_argument("--log-level", dest="log.level", help="debug, info, warning, error")
    serve.add_argument(
        "--trace-file",
        type=Path,
        dest="log.trace_file",
        help="where request traces go (Triton's trace JSON; turn on with /v2/trace/setting)",
    )
    serve.add_argument(
        "--trace-mode",
        choices=[mode.value for mode in TraceMode],
        dest="log.trace_mode",
        help="triton: the trace file (default); opentelemetry: spans over OTLP/HTTP",
    )
    serve.add_argument(
        "--trace-otlp-url",
        dest="log.trace_otlp_url",
        metavar="URL",
        help="opentelemetry mode: the collector (default http://localhost:4318/v1/traces)",
    )
    serve.add_argument(
        "--trace-otlp-resource",
        action="append",
        dest="log.trace_otlp_resource",
        metavar="KEY=VALUE",
        help="opentelemetry mode: a resource attribute (repeatable; default "
        "service.name=triton-inference-server)",
    )


def config_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags whose destination is a `section.key` of the config (None: not given)."""
    flags: dict[str, Any] = {k: v for k, v in vars(args).items() if "." in k}
    for key in (
        "models.load_models",
        "sync.desired",
        "log.trace_otlp_resource",
        "server.http_restricted_api",
        "server.grpc_restricted_protocol",
    ):
        if flags.get(key) is not None:
            flags[key] = tuple(flags[key])
    return flags


def _bool_value(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
