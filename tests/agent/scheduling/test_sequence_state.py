"""Implicit state: initial state from a data file, its share of the memory budget, string ids."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from agent.errors import InvalidInputError
from agent.models.loader import LoadSettings
from agent.models.memory_plan import MemoryLedger
from agent.models.registry import ModelRegistry
from agent.proto import model_config_pb2 as mc
from agent.scheduling.sequence_policy import SequenceRequest
from agent.scheduling.sequence_scheduler import SequenceScheduler
from agent.scheduling.sequence_tensors import SequenceTensors
from agent.tensors.signature import ValidatedRequest
from bench.sequence_models import ACCUMULATOR_CONFIG, accumulator_model
from tests.models import write_model

WIDTH = 1 << 16  # 256 KiB of FP32 state per sequence
SLOTS = 16


def wide_config() -> str:
    config = ACCUMULATOR_CONFIG.format(
        name="wide",
        strategy=f"oldest {{ max_candidate_sequences: {SLOTS} }}",
        idle_us=10**7,
    )
    # START always reads 0: the model adds to the state it is fed, the initial one included.
    config = config.replace("int32_false_true: [ 0, 1 ]", "int32_false_true: [ 0, 0 ]")
    start = config.index("state [")
    state = config[start:].replace("dims: [ 1 ]", f"dims: [ {WIDTH} ]")
    state = state.replace("zero_data: true", 'data_file: "tens.bin"')
    head = config[:start].replace(
        '{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }',
        f'{{ name: "INPUT" data_type: TYPE_FP32 dims: [ {WIDTH} ] }}',
    )
    return (
        head.replace(
            '{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }',
            f'{{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {WIDTH} ] }}',
        )
        + state
    )


def test_state_from_a_data_file_counts_in_the_memory_budget(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = write_model(repo, "wide", accumulator_model(width=WIDTH), wide_config())
    (model_dir / "initial_state").mkdir()
    (model_dir / "initial_state" / "tens.bin").write_bytes(
        np.full(WIDTH, 10.0, np.float32).tobytes()
    )
    registry = ModelRegistry(repo, LoadSettings(intra_op_threads=1), ledger=MemoryLedger(4 << 30))
    try:
        assert registry.load_all() == {}
        served, number = registry.resolve("wide", None)
        loaded = served.versions[number]
        scheduler = loaded.scheduler
        assert isinstance(scheduler, SequenceScheduler)
        assert registry.ledger is not None
        state_bytes = WIDTH * 4 * SLOTS
        assert registry.ledger.reserved()[loaded.ledger_key] >= state_bytes

        async def two_steps() -> list[float]:
            sums = []
            for start, end in ((True, False), (False, True)):
                request = ValidatedRequest(
                    {"INPUT": np.ones((1, WIDTH), np.float32)}, ("OUTPUT",), 1
                )
                result = await scheduler.submit(request, sequence=SequenceRequest(9, start, end))
                sums.append(float(result.outputs[0][0, -1]))
            return sums

        assert asyncio.run(two_steps()) == [11.0, 12.0]  # the data file's 10, then the sum
        assert scheduler.state_bytes == 0  # dropped at END
    finally:
        registry.close()


def test_string_correlation_ids_for_a_string_corrid() -> None:
    config = text_format.Parse(
        """
        name: "s" max_batch_size: 2
        sequence_batching { control_input [ { name: "CORRID" control [ {
          kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ] }
        """,
        mc.ModelConfig(),
    )
    tensors = SequenceTensors.from_config(config)
    tensors.check_corrid("user-7")
    feeds = tensors.control_feeds([("user-7", True, False), ("user-8", False, False)])
    assert feeds["CORRID"].ravel().tolist() == [b"user-7", b"user-8"]
    with pytest.raises(InvalidInputError, match="data-type is 'UINT64', but model 's'"):
        tensors.check_corrid(7)
