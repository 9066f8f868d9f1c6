"""A Python model's config as its backend reads it: timeouts and the declared tensors."""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.tensors import datatypes
from agent.tensors.datatypes import ModelTensor

DEFAULT_MODEL_FILENAME = "model.py"
PYTHON_BACKEND = "python"
EXECUTE_TIMEOUT_KEY = "execute_timeout_seconds"
INITIALIZE_TIMEOUT_KEY = "initialize_timeout_seconds"
FINALIZE_TIMEOUT_KEY = "finalize_timeout_seconds"
# No heartbeat answer within this many seconds is a hang (default: models.heartbeat_timeout_ms).
HEARTBEAT_TIMEOUT_KEY = "heartbeat_timeout_seconds"
_DEFAULTS = {EXECUTE_TIMEOUT_KEY: 30.0, INITIALIZE_TIMEOUT_KEY: 120.0, FINALIZE_TIMEOUT_KEY: 5.0}


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds the agent waits for a worker's answer."""

    execute_s: float
    initialize_s: float
    finalize_s: float
    heartbeat_s: float | None = None  # None: the agent's default (RestartPolicy)


def timeouts_from_config(config: mc.ModelConfig) -> Timeouts:
    """The timeouts from the config's parameters (defaults 30 s, 120 s, 5 s; the heartbeat's
    is the agent's unless the config sets one).

    Raises:
        ModelConfigError: a value that is not a positive number; the message names the key.
    """
    values: dict[str, float] = {}
    for key, default in (*_DEFAULTS.items(), (HEARTBEAT_TIMEOUT_KEY, 0.0)):
        values[key] = default
        if key not in config.parameters:
            continue
        text = config.parameters[key].string_value
        try:
            values[key] = float(text)
        except ValueError:
            values[key] = -1.0
        if not 0 < values[key] < float("inf"):
            raise ModelConfigError(
                f"model '{config.name}': parameters {key} must be a positive number of seconds, "
                f"got {text!r}"
            )
    return Timeouts(
        values[EXECUTE_TIMEOUT_KEY],
        values[INITIALIZE_TIMEOUT_KEY],
        values[FINALIZE_TIMEOUT_KEY],
        values[HEARTBEAT_TIMEOUT_KEY] or None,
    )


def tensors_from_config(
    config: mc.ModelConfig, model_name: str
) -> tuple[tuple[ModelTensor, ...], tuple[ModelTensor, ...]]:
    """Inputs and outputs as the config declares them; (None, *dims) when the model batches.

    Raises:
        ModelConfigError: a tensor without a supported data type.
    """
    found: list[tuple[ModelTensor, ...]] = []
    # None at all is fine, as in Triton: a model may take no input (a generator) or answer none.
    for kind, declared in (("input", config.input), ("output", config.output)):
        tensors = []
        for entry in declared:
            type_name = mc.DataType.Name(entry.data_type)
            dt = datatypes.from_config(type_name)
            if dt is None:
                raise ModelConfigError(
                    f"python model '{model_name}' {kind} '{entry.name}': data_type {type_name} "
                    "is missing or not supported"
                )
            dims = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
            shape = [None if d < 0 else d for d in dims]
            if config.max_batch_size > 0:
                shape.insert(0, None)
            tensors.append(ModelTensor(entry.name, dt, type_name, tuple(shape)))
        found.append(tuple(tensors))
    return found[0], found[1]
