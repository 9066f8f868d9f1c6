"""The device's side of the wire: the documents it publishes, built from plain values. Pure.

Every payload a device sends (docs/mqtt.md) is built here: the envelope every message carries
(`schema`, `kind`, `device`, `ts`), the retained status and its `offline` form (the last will
and the clean stop), a model version's telemetry entry, an event, and a command's response with
its error code (`ERROR_CODES`: the one error -> code table of the MQTT side). The fleet link
(`agent.fleet.link`, `telemetry`, `runner`) fills them from the running agent; the fleet
simulator (`bench/fleet_sim.py`) fills them from simulated devices: one protocol, two sources.
No clock and no I/O: "now" (Unix seconds) is passed in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agent.errors import (
    AccessDeniedError,
    AgentError,
    BackendError,
    CacheCommitError,
    ConflictError,
    InternalError,
    InvalidInputError,
    MemoryBudgetError,
    MemoryPressureError,
    ModelConfigError,
    ModelControlDisabledError,
    ModelControlError,
    ModelInstanceFailedError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelReportedCancelledError,
    ModelReportedError,
    ModelReportedExistsError,
    ModelReportedInvalidArgError,
    ModelReportedNotFoundError,
    ModelReportedUnavailableError,
    ModelReportedUnknownError,
    ModelReportedUnsupportedError,
    NoReadyVersionError,
    OverloadedError,
    PayloadTooLargeError,
    RegionExistsError,
    RepositoryPollError,
    RequestTimeoutError,
    SharedMemoryNotFoundError,
    UnknownTensorError,
    UnsupportedError,
    lookup,
)
from agent.fleet import commands as cmd

__all__ = [
    "ERROR_CODES",
    "SCHEMA",
    "encode",
    "envelope",
    "error_code",
    "event_body",
    "model_telemetry",
    "offline_status",
    "response_doc",
    "status_document",
]

SCHEMA = 1

# The one place where error types become response codes (every type listed: a test checks).
ERROR_CODES: dict[type[AgentError], str] = {
    PayloadTooLargeError: "too_large",
    cmd.CommandTooLargeError: "too_large",
    cmd.CommandError: "bad_command",
    InvalidInputError: "invalid_argument",
    UnknownTensorError: "invalid_argument",
    ModelNotFoundError: "not_found",
    SharedMemoryNotFoundError: "failed",
    ModelNotReadyError: "not_ready",
    NoReadyVersionError: "not_ready",
    ModelControlError: "not_allowed",
    AccessDeniedError: "not_allowed",
    ModelControlDisabledError: "not_allowed",
    ConflictError: "conflict",
    RegionExistsError: "conflict",
    MemoryBudgetError: "out_of_memory",
    ModelConfigError: "bad_config",
    CacheCommitError: "load_failed",
    ModelLoadError: "load_failed",
    RepositoryPollError: "load_failed",
    OverloadedError: "busy",
    MemoryPressureError: "busy",
    RequestTimeoutError: "failed",
    BackendError: "failed",
    ModelInstanceFailedError: "failed",
    # A model's TritonError: MQTT's nearest code for Triton's
    ModelReportedError: "failed",
    ModelReportedUnknownError: "failed",
    ModelReportedNotFoundError: "not_found",
    ModelReportedInvalidArgError: "invalid_argument",
    ModelReportedUnavailableError: "busy",
    ModelReportedUnsupportedError: "not_allowed",
    ModelReportedExistsError: "conflict",
    ModelReportedCancelledError: "failed",
    InternalError: "internal",
    UnsupportedError: "not_allowed",
    AgentError: "failed",
}


def error_code(error: BaseException) -> str:
    """The response code of an error (any non-`AgentError` is an `InternalError`: `internal`)."""
    return lookup(ERROR_CODES, error)


def encode(doc: Mapping[str, Any]) -> bytes:
    """A document as the bytes published (compact JSON)."""
    return json.dumps(doc, separators=(",", ":")).encode()


def envelope(kind: str, device: str, now: float) -> dict[str, Any]:
    """What every message starts with: schema, kind, device and when (Unix seconds)."""
    return {"schema": SCHEMA, "kind": kind, "device": device, "ts": now}


def status_document(
    device: str,
    now: float,
    *,
    faults: Mapping[str, str],
    agent_version: str,
    mqtt: str | None,
    groups: Sequence[str],
    models: Sequence[Mapping[str, Any]],
    served: Any,
    inventory: Mapping[str, Any],
    rejected: Any,
    desired: Any,
    outbox: Any,
) -> dict[str, Any]:
    """The retained status (and the `status` command's result).

    Args:
        device: The device id.
        now: Unix seconds.
        faults: Failing parts and why ({}: `online`, else `degraded` with the reason).
        agent_version: The agent's version.
        mqtt: The protocol spoken ("5", "3.1.1"; None before the client exists).
        groups: The device's groups.
        models: {"name", "versions" (those serving), and "signers", "not_ready" and
            "cpu_fallback" when there are any} per loaded model.
        served: Per served version: model, version, digest, signed_by (None: not readable).
        inventory: The device facts.
        rejected: The rejected versions (None: not readable).
        desired: {MODEL: POLICY} stored by `set-desired` (None: not readable).
        outbox: The outbox's figures (None: not readable).
    """
    doc = envelope("status", device, now)
    doc.update(
        state="degraded" if faults else "online",
        agent_version=agent_version,
        mqtt=mqtt,
        groups=list(groups),
        models=[dict(m) for m in models],
        served=served,
        inventory=dict(inventory),
        rejected=rejected,
        desired=desired,
        outbox=outbox,
    )
    if faults:
        doc["reason"] = "; ".join(f"{part}: {text}" for part, text in sorted(faults.items()))
        doc["faults"] = dict(faults)
    return doc


def offline_status(device: str, now: float, reason: str) -> bytes:
    """The `offline` status: the last will ("connection lost") or a clean stop ("stopped")."""
    return encode({**envelope("status", device, now), "state": "offline", "reason": reason})


def event_body(
    model: str, version: int | None, kind: str, detail: Mapping[str, object]
) -> dict[str, Any]:
    """An event's fields (the envelope and `seq` are added when it is queued)."""
    return {"event": kind, "model": model, "version": version, "detail": dict(detail)}


def model_telemetry(
    model: str,
    version: int,
    *,
    requests: int,
    failures: int,
    inferences_per_s: float | None,
    latency_us: Mapping[str, float | None],
    queue_us: Mapping[str, float | None],
    mean_batch_size: float | None,
    cache_hit_rate: float | None,
    pending: int,
) -> dict[str, Any]:
    """One served version's entry in a telemetry message's `models` (docs/mqtt.md#telemetry).

    `latency_us` and `queue_us` hold p50, p90, p95, p99 (and `queue_us` its mean) in µs.
    """
    return {
        "model": model,
        "version": version,
        "requests": requests,
        "failures": failures,
        "inferences_per_s": inferences_per_s,
        "latency_us": dict(latency_us),
        "queue_us": dict(queue_us),
        "mean_batch_size": mean_batch_size,
        "cache_hit_rate": cache_hit_rate,
        "pending": pending,
    }


def response_doc(
    envelope: Mapping[str, Any],
    command_id: str | None,
    name: str | None,
    *,
    result: Mapping[str, Any] | None = None,
    error: AgentError | None = None,
) -> dict[str, Any]:
    """A command response: `ok` with the result, or the error's code and message."""
    doc = dict(envelope)
    doc.update(id=command_id, command=name, ok=error is None)
    if error is not None:
        doc["error"] = {"code": error_code(error), "message": error.message}
    else:
        doc["result"] = dict(result or {})
    return doc
