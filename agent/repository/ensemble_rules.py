"""Triton's ensemble rules that need only the config, worded as Triton words them.

`ensemble_scheduling` only on the ensemble platform (and always there), no instance groups,
optimization or warm-up on an ensemble, every step complete, and a data flow in which each
ensemble input feeds a step, each output is written and no tensor is left unused. Checks that
need the composing models (their signatures, cycles, versions) are `agent.ensemble.plan`'s.
"""

from __future__ import annotations

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc

ENSEMBLE_PLATFORM = "ensemble"


def check_ensemble(config: mc.ModelConfig, model: str) -> None:
    """Triton's rules on `ensemble_scheduling` and the ensemble platform (config only).

    Raises:
        ModelConfigError: the first rule broken, in Triton's words.
    """
    ensemble = config.platform == ENSEMBLE_PLATFORM
    if ensemble and config.backend:
        raise ModelConfigError(
            f"Ensemble model '{model}' must have platform type '{ENSEMBLE_PLATFORM}' and empty "
            "backend type"
        )
    if not config.HasField("ensemble_scheduling"):
        if ensemble:
            raise ModelConfigError(
                f"ensemble scheduling must be set for ensemble {model} whose platform is "
                f"{ENSEMBLE_PLATFORM}"
            )
        return
    if not ensemble:
        raise ModelConfigError(
            f"ensemble scheduling cannot be set for model '{model}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise ModelConfigError(f"instance group should not be specified for ensemble '{model}'")
    if config.HasField("optimization"):
        raise ModelConfigError(f"optimization should not be specified for ensemble '{model}'")
    if config.model_warmup:
        raise ModelConfigError(f"model_warmup can not be specified for ensemble '{model}'")
    if not config.ensemble_scheduling.step:
        raise ModelConfigError(f"must specify 'step' for ensemble '{model}'")
    _check_ensemble_flow(config, model)


def _check_ensemble_flow(config: mc.ModelConfig, model: str) -> None:
    """Every ensemble input feeds a step, every output is written, no tensor is left unused."""
    written: dict[str, set[str]] = {}  # ensemble tensor -> tensors its producing step reads
    read: set[str] = set()  # tensors some step reads
    for index, step in enumerate(config.ensemble_scheduling.step):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(step, field):
                raise ModelConfigError(
                    f"must specify '{field}' in step {index} of ensemble '{model}'"
                )
        for tensor in step.output_map.values():
            if tensor in written:
                raise ModelConfigError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{model}' step {index}"
                )
            written[tensor] = set(step.input_map.values())
        read.update(step.input_map.values())
    tensors = read | set(written)
    inputs = [t.name for t in config.input]
    for name in inputs:
        if name not in tensors:
            raise ModelConfigError(f"ensemble input '{name}' for ensemble {model}' is not used")
    ready = set(inputs)
    changed = True
    while changed:  # a step's outputs are ready once all the tensors it reads are
        changed = False
        for tensor, needs in written.items():
            if tensor not in ready and needs <= ready:
                ready.add(tensor)
                changed = True
    outputs = {t.name for t in config.output}
    for name in (t.name for t in config.output):
        if name not in tensors:
            raise ModelConfigError(f"ensemble output '{name}' for ensemble {model}' is not used")
        if name not in ready:
            missing = _first_unready_source(name, written, ready)
            cause = (
                f": at least one of its depending tensors, '{missing}', is not connected"
                if missing != name
                else ""
            )
            raise ModelConfigError(f"output '{name}' for ensemble '{model}' is not written{cause}")
    for tensor in sorted(tensors - outputs):
        if tensor not in ready or tensor not in read:
            raise ModelConfigError(f"ensemble tensor '{tensor}' is unused in ensemble '{model}'")


def _first_unready_source(name: str, written: dict[str, set[str]], ready: set[str]) -> str:
    current, seen = name, {name}
    while True:
        upstream = sorted(t for t in written.get(current, ()) if t not in ready and t not in seen)
        if not upstream:
            return current
        current = upstream[0]
        seen.add(current)
