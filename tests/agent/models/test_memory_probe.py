"""No inference at load unless asked: warm-up samples measure, a model that fails on zeros loads
with an estimate from its file, and only one that cannot fit by that estimate is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.errors import ModelLoadError
from agent.models.loader import LoadSettings
from agent.models.memory_plan import MemoryLedger
from agent.models.memory_probe import ARENA_INITIAL_CHUNK, estimate_footprint
from agent.models.registry import ModelRegistry, ModelState
from agent.repository.model_config import config_to_json
from agent.tensors.request import InferInput, InferRequest
from agent.tensors.signature import ModelSignature
from tests.models import save_ready, write_model

MIB = 1 << 20

# Y = reshape(X, S): fine for S = [2, 2], an error for the zeros of a probe (S = [0, 0]).
RESHAPE_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "S" data_type: TYPE_INT64 dims: [ 2 ] }}
]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""

ZERO_WARMUP = """
model_warmup [ {
  name: "zeros"
  batch_size: 1
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
  inputs { key: "S" value: { data_type: TYPE_INT64 dims: [ 2 ] zero_data: true } }
} ]
"""


def reshape_model(weights_floats: int = 0) -> onnx.ModelProto:
    """The reshape model; an unused initializer of `weights_floats` floats weighs its file."""
    initializers = []
    if weights_floats:
        initializers.append(
            helper.make_tensor(
                "W",
                TensorProto.FLOAT,
                [weights_floats],
                np.ones(weights_floats, np.float32).tobytes(),
                raw=True,
            )
        )
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "S"], ["Y"])],
        "reshape",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("S", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["a", "b"])],
        initializers,
    )
    return save_ready(graph)


def _registry(repo: Path, budget: int) -> ModelRegistry:
    return ModelRegistry(repo, LoadSettings(intra_op_threads=1), ledger=MemoryLedger(budget))


def test_a_model_that_fails_on_zeros_loads_ready_with_the_estimate(tmp_path: Path) -> None:
    write_model(tmp_path, "r", reshape_model(), RESHAPE_CONFIG.format(name="r", extra=""))
    registry = _registry(tmp_path, 1 << 30)
    try:
        served = registry.load_model("r")
        assert registry.index() == [{"name": "r", "version": "1", "state": "READY", "reason": ""}]
        note = config_to_json(served.config)["parameters"]["edge_agent_memory_plan"]
        assert "the probe run on zeros failed" in note["string_value"]
        assert "memory estimated from the model file" in note["string_value"]
        footprint = served.versions[1].footprint
        assert footprint is not None
        assert footprint.bytes_for(1) >= ARENA_INITIAL_CHUNK
        assert registry.ledger is not None
        assert sum(registry.ledger.reserved().values()) == footprint.bytes_for(1)
        # Real input runs as it would in Triton.
        request = InferRequest(
            inputs=(
                InferInput("X", "FP32", (4,), np.arange(4, dtype=np.float32)),
                InferInput("S", "INT64", (2,), np.array([2, 2], np.int64)),
            )
        )
        valid = ModelSignature.from_config(served.config).validate(request)
        assert served.versions[1].backend is not None
        out = served.versions[1].backend.run(valid.feeds, valid.output_names)
        np.testing.assert_array_equal(out[0], [[0.0, 1.0], [2.0, 3.0]])
    finally:
        registry.close()


def test_a_model_over_the_budget_by_estimate_is_refused(tmp_path: Path) -> None:
    # 16 MiB of weights: the estimate is at least 2 x 16 MiB, over a 20 MiB budget.
    heavy = reshape_model(weights_floats=4 * MIB)
    write_model(tmp_path, "heavy", heavy, RESHAPE_CONFIG.format(name="heavy", extra=""))
    registry = _registry(tmp_path, 20 * MIB)
    try:
        with pytest.raises(ModelLoadError) as err:
            registry.load_model("heavy")
        assert "of the 20 MiB budget" in err.value.message
        assert "memory estimated from the model file" in err.value.message
        [row] = registry.index()
        assert row["state"] == ModelState.UNAVAILABLE.value
        assert registry.ledger is not None
        assert registry.ledger.reserved() == {}
    finally:
        registry.close()


def test_a_configured_warm_up_that_fails_is_still_refused(tmp_path: Path) -> None:
    config = RESHAPE_CONFIG.format(name="w", extra=ZERO_WARMUP)
    write_model(tmp_path, "w", reshape_model(), config)
    registry = _registry(tmp_path, 1 << 30)
    try:
        with pytest.raises(ModelLoadError, match="onnxruntime failed"):
            registry.load_model("w")
        assert registry.ledger is not None
        assert registry.ledger.reserved() == {}
    finally:
        registry.close()


def test_warm_up_samples_replace_the_probe_on_zeros(tmp_path: Path) -> None:
    good = """
model_warmup [ {
  name: "two_by_two"
  batch_size: 1
  count: 1
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } }
  inputs { key: "S" value: { data_type: TYPE_INT64 dims: [ 2 ] input_data_file: "s" } }
} ]
"""
    model_dir = write_model(
        tmp_path, "g", reshape_model(), RESHAPE_CONFIG.format(name="g", extra=good)
    )
    (model_dir / "warmup").mkdir()
    (model_dir / "warmup" / "s").write_bytes(np.array([2, 2], "<i8").tobytes())
    registry = _registry(tmp_path, 1 << 30)
    try:
        served = registry.load_model("g")
        # The model fails on zeros: no estimate note means the samples measured it.
        assert "edge_agent_memory_plan" not in served.config.parameters
        assert served.versions[1].footprint is not None
    finally:
        registry.close()


def test_the_estimate_follows_the_documented_formula() -> None:
    fp = estimate_footprint(
        weights_bytes=10 * MIB, load_growth=3 * MIB, io_bytes_at_1=100, row_bytes=100, max_batch=8
    )
    assert fp.bytes_for(1) == 20 * MIB + 200 + ARENA_INITIAL_CHUNK
    assert fp.bytes_for(8) == fp.bytes_for(1) + 2 * 100 * 7
    grown = estimate_footprint(
        weights_bytes=MIB, load_growth=50 * MIB, io_bytes_at_1=0, row_bytes=0, max_batch=1
    )
    assert grown.bytes_for(4) == 50 * MIB + ARENA_INITIAL_CHUNK
