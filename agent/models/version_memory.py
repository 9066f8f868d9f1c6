"""Fitting one model version to memory: its GPU's free memory before it loads, the host budget
once its footprint is known.

The plan itself (`plan_capacity`, `fit_config`) is pure and lives in `agent.models.memory_plan`;
this module applies it to the shared `MemoryLedger` and says in the log what it lowered.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agent.backends.select import BackendKind, backend_kind
from agent.errors import MemoryBudgetError
from agent.models.device_memory import (
    DeviceMemoryProbe,
    MemoryKind,
    check_device_fit,
    device_need_bytes,
    folder_bytes,
    gpu_device,
)
from agent.models.memory_plan import Footprint, MemoryLedger, fit_config, plan_capacity
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import instance_count

__all__ = ["check_device_memory", "fit_to_budget"]

logger = logging.getLogger(__name__)


def check_device_memory(
    probe: DeviceMemoryProbe | None,
    config: mc.ModelConfig,
    version_dir: Path,
    name: str,
    version: int,
) -> None:
    """Refuse, before loading, a GPU version that does not fit in its GPU's free memory.

    Raises:
        MemoryBudgetError: the version's expected need exceeds its GPU's free memory.
    """
    if probe is None or probe.kind is MemoryKind.UNIFIED:
        return  # no GPU, or its memory is the host's (the host budget covers it)
    tensorrt = backend_kind(config, version_dir) is BackendKind.TENSORRT
    device = gpu_device(config, tensorrt=tensorrt)
    memory = probe.read(device) if device is not None else None
    if memory is None:
        return
    need = device_need_bytes(folder_bytes(version_dir))
    check_device_fit(need, memory, model=name, version=version)
    logger.info(
        "model %s version %d: %d MiB of GPU %d memory expected, %d MiB free",
        name,
        version,
        need >> 20,
        device,
        memory.free_bytes >> 20,
        extra={"model": name},
    )


def fit_to_budget(
    ledger: MemoryLedger,
    config: mc.ModelConfig,
    footprint: Footprint,
    key: tuple[str, str],
    estimated: str = "",
    extra_runs: int = 0,
) -> mc.ModelConfig:
    """Reserve what the version needs of what is left, lowering its batch cap and instances.

    `extra_runs`: runs the backend holds memory for beyond one per instance (`plan_capacity`).
    `estimated` says why the footprint is an estimate from the model file (not measured):
    the log, a refusal and the config's `edge_agent_memory_plan` parameter say so too.

    Raises:
        MemoryBudgetError: not even one instance at batch 1 fits in what is left.
    """
    try:
        plan = plan_capacity(
            footprint,
            budget_left=ledger.left(),
            max_batch_size=config.max_batch_size,
            instances=instance_count(config),
            budget_bytes=ledger.budget_bytes(),
            extra_runs=extra_runs,
        )
    except MemoryBudgetError as exc:
        if estimated:
            raise MemoryBudgetError(f"{exc.message} ({estimated})") from None
        raise
    ledger.reserve(key, plan.estimated_bytes)
    fitted = fit_config(config, plan)
    if fitted is not config:
        logger.warning("model %s version %s: %s", key[0], key[1], plan.reason)
    if estimated:
        logger.warning(
            "model %s version %s: %s: %d MiB at batch 1; %s",
            key[0],
            key[1],
            estimated,
            footprint.bytes_for(1) >> 20,
            plan.reason,
            extra={"model": key[0]},
        )
        if fitted is config:
            fitted = mc.ModelConfig()
            fitted.CopyFrom(config)
        fitted.parameters[
            "edge_agent_memory_plan"
        ].string_value = f"{estimated}: {_mib(footprint.bytes_for(1))} at batch 1; {plan.reason}"
    return fitted


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f}".removesuffix(".0") + " MiB"
