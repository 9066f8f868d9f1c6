"""Loading ensembles: the order models load in, and an ensemble's versions built on its plan.

An ensemble has no runtime of its own: its plan (DAG checks in `agent.ensemble.plan`) is
checked against the composing models served now, so those load first (`load_order`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path

from agent.ensemble.plan import (
    build_plan,
    composing_model_names,
    decoupled_ensemble,
    is_ensemble,
)
from agent.ensemble.runner import EnsembleScheduler, StepRunnerSlot
from agent.errors import AgentError
from agent.models.served import LoadedVersion, ModelRecord, ModelState, ServedModel, VersionStatus
from agent.proto import model_config_pb2 as mc
from agent.repository.autocomplete import named_copy
from agent.repository.model_config import load_model_config
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.statistics import StatisticsRegistry
from agent.tensors.signature import ModelSignature

__all__ = ["ServedConfig", "ServedVersions", "load_ensemble", "load_order"]

logger = logging.getLogger(__name__)

ServedConfig = Callable[[str], "mc.ModelConfig | None"]
ServedVersions = Callable[[str], "Collection[int] | None"]


def load_ensemble(
    name: str,
    config: mc.ModelConfig,
    versions: list[int],
    record: ModelRecord,
    generation: int,
    *,
    served_config: ServedConfig,
    served_versions: ServedVersions | None,
    step_runner: StepRunnerSlot,
    stats: StatisticsRegistry,
) -> ServedModel:
    """An ensemble: its plan checked against the composing models served now.

    Raises:
        ModelConfigError: the config's name is not its folder's, or its plan is invalid.
    """
    completed = named_copy(config, name)
    if completed.version_policy.WhichOneof("policy_choice") is None:
        completed.version_policy.latest.num_versions = 1
    completed.model_transaction_policy.SetInParent()  # Triton reports it for ensembles too
    plan = build_plan(completed, served_config, served_versions)
    if decoupled_ensemble(plan):  # as Triton: it streams its decoupled step's responses
        completed.model_transaction_policy.decoupled = True
    signature = ModelSignature.from_config(completed)
    policy = BatchingPolicy.from_config(completed)
    loaded: dict[int, LoadedVersion] = {}
    for version in versions:
        version_stats = stats.get(name, str(version))
        scheduler = EnsembleScheduler(plan, version, policy, step_runner, version_stats)
        key = (name, f"{version}@{generation}")
        loaded[version] = LoadedVersion(version, None, scheduler, None, version_stats, None, key)
        record.versions[version] = VersionStatus(ModelState.READY)
    logger.info(
        "ensemble %s ready: %s",
        name,
        " -> ".join(s.model_name for s in plan.steps),
        extra={"model": name},
    )
    return ServedModel(name, completed, signature, loaded)


def load_order(root: Path, names: list[str]) -> list[str]:
    """Models first, then ensembles once the models their steps name come before them."""
    steps: dict[str, tuple[str, ...]] = {}
    for name in names:
        try:
            config = load_model_config(root / name)
        except AgentError:
            continue  # reported when the model itself is loaded
        if config is not None and is_ensemble(config):
            steps[name] = composing_model_names(config)
    order = [n for n in names if n not in steps]
    waiting = [n for n in names if n in steps]
    while waiting:
        ready = [n for n in waiting if not any(m in waiting for m in steps[n])]
        if not ready:  # a cycle between ensembles: load them anyway, each will say why
            ready = waiting
        order.extend(ready)
        waiting = [n for n in waiting if n not in ready]
    return order
