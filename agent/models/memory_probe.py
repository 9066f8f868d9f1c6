"""How a version's memory footprint is found at load: warm-up samples, a probe on zeros, or an
estimate from the model file.

Triton runs nothing at load unless the config has `model_warmup`; the agent needs a footprint
to fit each version to the memory budget (`agent.models.memory_plan`). So:

* **With `model_warmup` samples**: the samples are the measurement. They run once, as Triton
  runs them, and the footprint is the process's growth from loading plus the samples; each row
  beyond goes at twice its input and output bytes (`io_row_bytes`). A sample that fails refuses
  the version, as in Triton.
* **Without**: the model is probed on zeros (empty strings for BYTES) at batch 1 and at its max
  batch (`memory_plan.measure_footprint`). When the probe run fails (a model that refuses zero
  or empty input, which Triton would load), the version loads anyway with the estimate below,
  and the log and the config's `edge_agent_memory_plan` parameter say so.

The estimate (`estimate_footprint`, pure), in bytes at batch b:

    max(load growth, 2 * weights) + 2 * io_bytes(b) + ARENA_INITIAL_CHUNK

where `weights` is the size of the version folder's files (the model and its external data),
`load growth` the process's measured growth from creating the session, `io_bytes(b)` the
inputs and outputs at batch b (dims of any size counted as 1, at least 8 bytes per element),
doubled because ONNX Runtime's arena grows to the next power of two, and ARENA_INITIAL_CHUNK
ONNX Runtime's first CPU arena chunk (1 MiB). A version that does not fit by this estimate is
refused with the figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.backends.base import Backend
from agent.errors import AgentError, MemoryBudgetError
from agent.models.device_memory import folder_bytes
from agent.models.memory_plan import Footprint, measure_footprint
from agent.proto import model_config_pb2 as mc
from agent.scheduling.sequence_tensors import SequenceTensors
from agent.tensors import datatypes
from agent.tensors.signature import ModelSignature, TensorContract

__all__ = [
    "ARENA_INITIAL_CHUNK",
    "Measured",
    "estimate_footprint",
    "io_row_bytes",
    "measure_version",
    "run_zeros",
]

ARENA_INITIAL_CHUNK = 1 << 20  # ONNX Runtime's default initial CPU arena chunk

Loaded = tuple[Backend, mc.ModelConfig]
WarmUp = Callable[[Backend, mc.ModelConfig], None]


@dataclass(frozen=True, slots=True)
class Measured:
    """A loaded version and how much memory it is taken to need."""

    backend: Backend
    config: mc.ModelConfig
    footprint: Footprint
    estimated: str  # why the footprint is an estimate from the file; "" when measured
    warmed_up: bool  # the configured warm-up samples already ran


def measure_version(
    load: Callable[[], Loaded],
    *,
    warm_up: WarmUp | None,
    max_batch: int,
    limit_bytes: int,
    version_dir: Path,
    model_dir: Path | None = None,
) -> Measured:
    """Load a version and find its footprint (see the module docstring).

    Args:
        load: creates the backend and completes the config.
        warm_up: runs the config's `model_warmup` samples; None when it has none.
        max_batch: the batch size to probe at (without warm-up samples).
        limit_bytes: the whole memory budget (zero inputs over it are refused unallocated).
        version_dir: the version folder, whose files are the model's weights.
        model_dir: the model folder (a sequence model's initial state may be read from it).

    Raises:
        AgentError: loading failed, a warm-up sample failed, or the zero inputs alone are over
            the budget; the backend is closed.
    """
    kept: list[Loaded] = []
    failed: list[str] = []

    def load_kept() -> Loaded:
        loaded = load()
        kept.append(loaded)
        return loaded

    def run(loaded: Loaded, batch: int) -> None:
        if warm_up is not None:
            warm_up(*loaded)
        elif not failed:
            try:
                run_zeros(loaded, batch, limit_bytes=limit_bytes, model_dir=model_dir)
            except MemoryBudgetError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever the model does with zeros, it loads
                failed.append(exc.message if isinstance(exc, AgentError) else repr(exc))

    try:
        if warm_up is not None:
            loaded, measured = measure_footprint(load_kept, run, max_batch=1, repeats=1)
        else:
            loaded, measured = measure_footprint(load_kept, run, max_batch=max_batch)
            if not failed:
                run_zeros(
                    loaded, 1, shrink=True, model_dir=model_dir
                )  # hand the probe's arena chunks back
    except BaseException:
        if kept:
            kept[0][0].close()
        raise
    backend, config = loaded
    row = io_row_bytes(config)
    top = max(1, config.max_batch_size)
    if warm_up is not None:
        at_1 = measured.bytes_at_batch_1
        footprint = Footprint(at_1, at_1 + 2 * row * (top - 1), top)
        return Measured(backend, config, footprint, "", warmed_up=True)
    if not failed:
        return Measured(backend, config, measured, "", warmed_up=False)
    footprint = estimate_footprint(
        weights_bytes=folder_bytes(version_dir),
        load_growth=measured.bytes_at_batch_1,
        io_bytes_at_1=io_row_bytes(config, batch_rows=False),
        row_bytes=row,
        max_batch=top,
    )
    why = f"the probe run on zeros failed ({failed[0]}); memory estimated from the model file"
    return Measured(backend, config, footprint, why, warmed_up=False)


def estimate_footprint(
    *,
    weights_bytes: int,
    load_growth: int,
    io_bytes_at_1: int,
    row_bytes: int,
    max_batch: int,
) -> Footprint:
    """The footprint of a version that could not be run (pure; formula in the module docstring).

    Args:
        weights_bytes: size of the version folder's files.
        load_growth: the process's growth from creating the session (>= 0).
        io_bytes_at_1: input and output bytes of one request at batch 1.
        row_bytes: input and output bytes each further row adds (0: the model does not batch).
        max_batch: the batch size of the second point, >= 1.
    """
    at_1 = max(load_growth, 2 * weights_bytes) + 2 * io_bytes_at_1 + ARENA_INITIAL_CHUNK
    return Footprint(at_1, at_1 + 2 * row_bytes * (max_batch - 1), max_batch)


def io_row_bytes(config: mc.ModelConfig, *, batch_rows: bool = True) -> int:
    """Input and output bytes of one batch row (`batch_rows`; 0 for a model that does not
    batch), or of one request at batch 1. Dims of any size count as 1, elements as >= 8 bytes."""
    signature = ModelSignature.from_config(config)
    if batch_rows and not signature.batched:
        return 0
    contracts = [*signature.inputs.values(), *signature.outputs.values()]
    return sum(_contract_bytes(c) for c in contracts)


def _contract_bytes(contract: TensorContract) -> int:
    dt = datatypes.from_kserve(contract.datatype)
    itemsize = dt.numpy.itemsize if dt is not None else 8
    return math.prod(max(1, d) for d in contract.dims) * max(itemsize, 8)


def run_zeros(
    loaded: Loaded,
    batch: int,
    *,
    shrink: bool = False,
    limit_bytes: int | None = None,
    model_dir: Path | None = None,
) -> None:
    """Run the model once on zeros (empty strings for BYTES) at a batch size; a sequence model
    also gets its control and state tensors as the sequence batcher feeds a sequence's start.

    Raises:
        MemoryBudgetError: the zero inputs alone would be over `limit_bytes` (nothing allocated).
        AgentError: the model failed on them.
    """
    backend, config = loaded
    signature = ModelSignature.from_config(config)
    batch = min(batch, max(1, config.max_batch_size))
    shapes: dict[str, tuple[tuple[int, ...], datatypes.DataType]] = {}
    for contract in signature.inputs.values():
        dims = tuple(1 if d < 0 else d for d in contract.dims)
        shape = (batch, *dims) if signature.batched else dims
        dt = datatypes.from_kserve(contract.datatype)
        assert dt is not None
        if contract.reshape is not None:
            shape = (batch, *contract.reshape) if signature.batched else contract.reshape
            shape = tuple(1 if d < 0 else d for d in shape)
        shapes[contract.name] = (shape, dt)
    needed = sum(math.prod(s) * max(dt.numpy.itemsize, 8) for s, dt in shapes.values())
    if limit_bytes is not None and needed > limit_bytes:
        raise MemoryBudgetError(
            f"model '{config.name}': one batch of {batch} needs {needed >> 20} MiB for its inputs "
            f"alone, over the memory budget of {limit_bytes >> 20} MiB; lower max_batch_size"
        )
    feeds: dict[str, np.ndarray] = {
        name: np.full(shape, b"", dtype=np.object_)
        if dt.kserve == "BYTES"
        else np.zeros(shape, dt.numpy)
        for name, (shape, dt) in shapes.items()
    }
    if config.HasField("sequence_batching"):
        feeds.update(SequenceTensors.from_config(config, model_dir).starting_feeds(batch))
    backend.run(feeds, list(signature.outputs), shrink_memory=shrink)
