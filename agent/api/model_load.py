"""Triton's answer to a failed explicit load, shared by the HTTP and gRPC load endpoints.

A Triton client reads a failed load as Triton words it: a model the repository does not hold is
"failed to load 'm', failed to poll from model repository" (INTERNAL), a model whose versions do
not load is "load failed for model 'm': ..." (INVALID_ARGUMENT). The agent's reason follows
Triton's text. MQTT keeps the data plane's own error types (its codes tell out-of-memory and bad
config apart), so the wording is applied here, at the two client-facing edges only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.errors import (
    AgentError,
    InvalidInputError,
    ModelConfigError,
    ModelControlError,
    ModelLoadError,
    ModelNotFoundError,
    OverloadedError,
    RepositoryPollError,
)
from agent.serving.dataplane import DataPlane


class ModelLoadFailedError(AgentError):
    """An explicit load request failed: the model's versions did not load (Triton: INVALID_ARG)."""


# Refused before any loading starts: the request's own error is already Triton's answer.
_NOT_A_LOAD_FAILURE = (InvalidInputError, ModelConfigError, ModelControlError, OverloadedError)


async def load_model(
    dataplane: DataPlane,
    name: str,
    config: dict[str, Any] | None,
    files: Mapping[str, bytes] | None = None,
) -> None:
    """`DataPlane.load_model`, with a failure worded as Triton words it.

    Raises:
        ModelLoadError: the repository holds no such model, or the files sent with the request
            cannot be written ("failed to load 'm', failed to poll from model repository: ...").
        ModelLoadFailedError: the model did not load ("load failed for model 'm': ...").
        InvalidInputError, ModelConfigError, ModelControlError, OverloadedError: as the data
            plane raises them.
    """
    try:
        await dataplane.load_model(name, config, files)
    except (ModelNotFoundError, RepositoryPollError) as exc:
        raise poll_failed(name, exc.message) from None
    except _NOT_A_LOAD_FAILURE:
        raise
    except AgentError as exc:
        why = _version_states(dataplane, name) or exc.message
        raise ModelLoadFailedError(f"load failed for model '{name}': {why}") from None


def _version_states(dataplane: DataPlane, name: str) -> str:
    """Triton's account of a failed load: each version not READY, "version V is at STATE
    state: REASON;" a line each ("" when no version was read: the config failed)."""
    rows = dataplane.repository_index(detailed=True)
    return "".join(
        f"version {r['version']} is at {r['state']} state: {r.get('reason', '')};\n"
        for r in rows
        if r["name"] == name and "version" in r and r.get("state") != "READY"
    )


def poll_failed(name: str, reason: str) -> ModelLoadError:
    """Triton's answer (INTERNAL) when the model named in a load request cannot be read: not in
    the repository, a config override that does not parse, files that cannot be written."""
    return ModelLoadError(
        f"failed to load '{name}', failed to poll from model repository: {reason}"
    )


def invalid_override(name: str, reason: str) -> ModelLoadError:
    """A load's `config` parameter that is not a JSON object: Triton fails the poll with
    "Invalid config override" (INTERNAL, not INVALID_ARGUMENT)."""
    return poll_failed(name, f"Invalid config override: {reason}")
