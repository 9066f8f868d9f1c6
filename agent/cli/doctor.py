"""`edge-agent doctor`: what this device has and what the agent would use, OK / WARN / FAIL each.

It must run where the agent itself cannot start (no ONNX Runtime, an unsupported JetPack), so it
imports nothing that pulls onnxruntime in at import time: `agent.cli` dispatches here before
loading the serving stack. Exit status 1 when any line is FAIL (the Ansible role fails the play).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import socket
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from agent.config.extras import OPTIONAL, installed
from agent.config.loader import load_config
from agent.config.schema import AgentConfig
from agent.config.security import exposure_problems
from agent.device.checks import (
    Check,
    Status,
    accelerator_checks,
    agent_checks,
    device_checks,
    footprint_checks,
    worst,
)
from agent.device.facts import CUDA_VERSION_JSON, NV_TEGRA_RELEASE, device_facts
from agent.device.footprint import import_facts, install_facts, running_facts
from agent.device.gpu import detect_gpu_reader
from agent.errors import AgentConfigError, AgentError
from agent.models.memory_plan import detect_budget_bytes
from agent.repository.model_config import load_model_config
from model_cache.layout import CacheLayout

DEFAULT_CONFIG = Path("/etc/edge-agent/agent.toml")
EXIT_FAIL = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The doctor's flags (shared by `edge-agent doctor` and the ONNX-Runtime-free front door)."""
    parser.add_argument(
        "--config", type=Path, help=f"the agent's config (default: {DEFAULT_CONFIG} if present)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document (for the fleet)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds to wait for the broker and the store (default 2)",
    )
    parser.add_argument(
        "--tegra-release", type=Path, default=NV_TEGRA_RELEASE, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--cuda-version-file", type=Path, default=CUDA_VERSION_JSON, help=argparse.SUPPRESS
    )


def add_commands(commands: Any) -> None:
    """Register `doctor` on the main parser's sub-commands."""
    parser = commands.add_parser(
        "doctor", help="report what this device has and what the agent would use (OK/WARN/FAIL)"
    )
    add_arguments(parser)


def main(argv: list[str]) -> int:
    """`edge-agent doctor ARGS` without the main parser (which needs ONNX Runtime)."""
    parser = argparse.ArgumentParser(prog="edge-agent doctor", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace, *, out: TextIO = sys.stdout) -> int:
    """Probe, judge and print; 1 when a line is FAIL, else 0."""
    facts = device_facts(
        tegra_release=args.tegra_release,
        cuda_version_json=args.cuda_version_file,
        gpu_reader=detect_gpu_reader(),
    )
    agent = agent_facts(_config_path(args.config), os.environ, timeout_s=args.timeout)
    footprint = footprint_facts()
    checks = (
        device_checks(facts)
        + agent_checks(agent)
        + accelerator_checks(agent, facts)
        + footprint_checks(footprint)
    )
    status = worst(checks)
    if args.json:
        doc = {
            "status": status.value,
            "checks": [c.to_json() for c in checks],
            "device": facts,
            "agent": agent,
            "footprint": footprint,
        }
        json.dump(doc, out, indent=2, default=str)
        out.write("\n")
    else:
        out.write(format_report(checks))
    return EXIT_FAIL if status is Status.FAIL else 0


def footprint_facts() -> dict[str, Any]:
    """The agent's own footprint: its install (with the extras installed), what `serve`
    imports (in a fresh interpreter), and each running agent's memory, threads and compiled
    packages (`agent.device.footprint`)."""
    extras = {extra: installed(module) for extra, (module, _) in OPTIONAL.items()}
    return {
        "install": install_facts(e for e, ok in extras.items() if ok),
        "extras": extras,
        "imports": import_facts(),
        "running": running_facts(),
    }


def format_report(checks: list[Check]) -> str:
    """One line per check, the fix indented under WARN and FAIL lines, a summary at the end."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for check in checks:
        lines.append(f"{check.status.value:<4}  {check.name:<{width}}  {check.detail}")
        if check.fix and check.status is not Status.OK:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {check.fix}")
    counts = {s: sum(c.status is s for c in checks) for s in Status}
    lines.append(
        f"{worst(checks).value}: {counts[Status.OK]} ok, {counts[Status.WARN]} warning(s), "
        f"{counts[Status.FAIL]} failure(s)"
    )
    return "\n".join(lines) + "\n"


def agent_facts(
    config_path: Path | None, environ: Mapping[str, str], *, timeout_s: float
) -> dict[str, Any]:
    """What the agent would use with this config: budget, ports, paths, broker and store."""
    try:
        config = load_config(config_path, None, environ, serving=False)
    except AgentConfigError as exc:
        return {"config": {"file": _str(config_path), "error": str(exc)}}
    limit, source = detect_budget_bytes(None, share=1.0)
    budget, budget_source = detect_budget_bytes(config.models.memory_budget_bytes or None)
    return {
        "config": {"file": _str(config_path), "error": None},
        "cgroup_memory_max": limit if source.startswith("cgroup") else None,
        "memory_budget": {"bytes": budget, "source": budget_source},
        "models_source": _models_source(config),
        "ports": _ports(config),
        "paths": _paths(config),
        "endpoints": [
            _broker(config, timeout_s),
            _store(config, environ, timeout_s),
        ],
        "security": _security(config),
        "accelerators": _accelerators(config),
        "allow_cpu_fallback": config.models.allow_cpu_fallback,
        "exit_on_error": config.models.exit_on_error,
    }


def _accelerators(config: AgentConfig) -> list[dict[str, Any]]:
    """The models of the configured repository whose configs ask for accelerators, and which
    (a config that does not parse is the agent's to report, not the doctor's)."""
    repository = config.models.repository
    if repository is None and config.cache.dir is not None:
        repository = CacheLayout(config.cache.dir).repository
    if repository is None or not repository.is_dir():
        return []
    found = []
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        try:
            model_config = load_model_config(model_dir)
        except (AgentError, OSError):
            continue
        if model_config is None:
            continue
        names = [
            a.name
            for a in model_config.optimization.execution_accelerators.gpu_execution_accelerator
        ]
        if names:
            found.append({"model": model_dir.name, "names": names})
    return found


def _security(config: AgentConfig) -> dict[str, Any]:
    """What the local API exposes: the same findings the agent logs at start."""
    server = config.server
    tls = "TLS" if server.tls_cert_file else "no TLS"
    return {
        "summary": f"API on {server.host or '(every address)'}, {tls}",
        "problems": exposure_problems(server),
        "strict": server.strict_security,
    }


def _config_path(given: Path | None) -> Path | None:
    if given is not None:
        return given
    return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None


def _models_source(config: AgentConfig) -> str | None:
    if config.models.repository is not None:
        return f"repository {config.models.repository}"
    if config.cache.dir is not None:
        return f"the model cache's repository view ({config.cache.dir})"
    return "the built-in demo repository" if config.models.demo else None


def _ports(config: AgentConfig) -> list[dict[str, Any]]:
    host = config.server.host
    ports = []
    for name, port in (
        ("http", config.server.http_port),
        ("grpc", config.server.grpc_port),
        ("metrics", config.server.metrics_port),
    ):
        if port >= 0:
            ports.append({"name": name, "host": host, "port": port, "in_use": _in_use(host, port)})
    return ports


def _in_use(host: str, port: int) -> bool:
    """Whether binding (host, port) fails because something listens there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _paths(config: AgentConfig) -> list[dict[str, Any]]:
    named = [
        ("models.repository", config.models.repository),
        ("cache.dir", config.cache.dir),
        ("sync.work_dir", config.sync.work_dir),
        ("mqtt.state_dir", config.mqtt.state_dir),
    ]
    return [
        {
            "name": name,
            "path": str(path),
            "exists": path.exists(),
            "writable": os.access(path, os.W_OK),
        }
        for name, path in named
        if path is not None
    ]


def _broker(config: AgentConfig, timeout_s: float) -> dict[str, Any]:
    if not config.mqtt.host:
        return {"name": "broker", "target": "MQTT off (mqtt.host unset)", "reachable": None}
    return _connect("broker", config.mqtt.host, config.mqtt.port, timeout_s)


def _store(config: AgentConfig, environ: Mapping[str, str], timeout_s: float) -> dict[str, Any]:
    source = config.sync.source
    if not source:
        return {"name": "store", "target": "sync off (sync.source unset)", "reachable": None}
    url = urllib.parse.urlsplit(source)
    if url.scheme == "file":
        folder = Path(url.path)
        ok = folder.is_dir()
        return {
            "name": "store",
            "target": source,
            "reachable": ok,
            "error": "" if ok else "no such folder",
        }
    if url.scheme == "s3":
        endpoint = config.sync.s3_endpoint
        if endpoint:
            url = urllib.parse.urlsplit(endpoint)
        else:
            region = config.sync.s3_region or environ.get("AWS_DEFAULT_REGION", "")
            host = f"s3.{region}.amazonaws.com" if region else "s3.amazonaws.com"
            return _connect("store", host, 443, timeout_s)
    port = url.port or (443 if url.scheme == "https" else 80)
    return _connect("store", url.hostname or "", port, timeout_s)


def _connect(name: str, host: str, port: int, timeout_s: float) -> dict[str, Any]:
    target = f"{host}:{port}"
    try:
        with contextlib.closing(socket.create_connection((host, port), timeout=timeout_s)):
            pass
    except OSError as exc:
        return {"name": name, "target": target, "reachable": False, "error": _os_error(exc)}
    return {"name": name, "target": target, "reachable": True}


def _os_error(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return exc.strerror or str(exc)


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)
