"""The scheduler of one loaded model version: the dynamic batcher, or the sequence batcher of a
stateful model.

The dynamic batcher's bounds come from the config and the memory plan: its queue bound, its
rate-limiter needs, and the bytes a batch may hold (the planned footprint, but always room for
one request of the largest size the API accepts). A sequence batcher's slot state is reserved
in the memory budget beside the model.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent.backends.base import Backend
from agent.errors import AgentError
from agent.models.memory_plan import Footprint, MemoryLedger
from agent.proto import model_config_pb2 as mc
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.rate_limiter import ResourceNeed
from agent.scheduling.scheduler import INLINE_BELOW_NS, LimiterGate, ModelScheduler
from agent.scheduling.sequence_policy import SequencePolicy
from agent.scheduling.sequence_scheduler import SequenceScheduler
from agent.scheduling.sequence_tensors import SequenceTensors
from agent.scheduling.statistics import ModelStatistics
from agent.tensors.limits import output_row_bytes
from agent.tensors.signature import ModelSignature

__all__ = ["dynamic_scheduler", "sequence_scheduler"]


def dynamic_scheduler(
    config: mc.ModelConfig,
    backend: Backend,
    *,
    name: str,
    version: int,
    instances: int,
    executor: ThreadPoolExecutor,
    stats: ModelStatistics,
    gate: LimiterGate | None,
    footprint: Footprint | None,
    python: bool,
    max_queue_size: int,
    max_request_bytes: int,
) -> ModelScheduler:
    """The dynamic batcher of a stateless version (no batching when the config sets none)."""
    policy = BatchingPolicy.from_config(config)
    return ModelScheduler(
        model=name,
        version=version,
        backend=backend,
        policy=policy,
        instances=instances,
        executor=executor,
        stats=stats,
        gate=gate,
        need=_resource_need(config, gate),
        max_pending=_queue_bound(policy, max_queue_size),
        # A Python model's run is a wait on its worker process, cheap in CPU but unbounded
        # when user code hangs: it must never run on the event loop.
        inline_below_ns=0 if python else INLINE_BELOW_NS,
        max_batch_bytes=None
        if footprint is None
        else max(footprint.bytes_for(max(1, config.max_batch_size)), max_request_bytes),
        output_row_bytes=output_row_bytes(ModelSignature.from_config(config)),
    )


def sequence_scheduler(
    config: mc.ModelConfig,
    model_dir: Path,
    backend: Backend,
    *,
    instances: int,
    executor: ThreadPoolExecutor,
    stats: ModelStatistics,
    key: tuple[str, str],
    ledger: MemoryLedger | None,
    measure_memory: bool,
    python: bool,
    max_queue_size: int,
) -> SequenceScheduler:
    """The sequence batcher of a stateful model; its slots' state counts in the budget (with a
    `ledger`, when `measure_memory`). On failure the executor is shut down, the backend
    closed and the version's reservation released.

    Raises:
        ModelConfigError: a control or state the config describes cannot be built.
        MemoryBudgetError: the state of every slot does not fit beside the model.
    """
    try:
        policy = SequencePolicy.from_config(config, instances, max_queue_size)
        tensors = SequenceTensors.from_config(config, model_dir)
        if ledger is not None and measure_memory and tensors.states:
            held = ledger.reserved().get(key, 0)
            ledger.reserve(key, held + tensors.state_bytes * policy.slots)
    except AgentError:
        executor.shutdown(wait=False)
        backend.close()
        if ledger is not None:
            ledger.release(key)
        raise
    return SequenceScheduler(
        model=config.name,
        version=int(key[1].split("@")[0]),
        backend=backend,
        policy=policy,
        tensors=tensors,
        instances=instances,
        executor=executor,
        stats=stats,
        inline_below_ns=0 if python else INLINE_BELOW_NS,  # as for the dynamic scheduler
    )


def _resource_need(config: mc.ModelConfig, gate: LimiterGate | None) -> ResourceNeed:
    """Rate-limiter needs of a model (its first instance group declares them)."""
    if gate is None or not config.instance_group:
        return ResourceNeed()
    need = ResourceNeed.from_group(config.instance_group[0])
    gate.limiter.declare(need)
    return need


def _queue_bound(policy: BatchingPolicy, default: int) -> int:
    configured = policy.default_queue_policy.max_queue_size
    return configured if configured > 0 else default
