"""The data plane's parts (agent/serving/routing.py and its composition in dataplane.py): one
routing prologue for the unary and the streamed path, schedulers called through their protocol,
and parts that share their dependencies explicitly. Real ONNX and Python models, no transport."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

from agent.errors import InvalidInputError, UnknownTensorError
from agent.models.control import ModelControlMode, ModelManager
from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from agent.serving.dataplane import DataPlane
from agent.tensors.request import InferInput, InferRequest, RequestedOutput
from tests.decoupled_models import DECOUPLED_MODEL, decoupled_config
from tests.models import scale_model, write_versions
from tests.python_models import write_python_model

ROOT = Path(__file__).resolve().parents[3]
CONCRETE_SCHEDULERS = {"ModelScheduler", "SequenceScheduler", "EnsembleScheduler"}


def test_the_data_plane_names_no_concrete_scheduler() -> None:
    """It calls `Scheduler.submit` whatever the scheduler is: no isinstance chain picks a call."""
    named: list[str] = []
    for path in sorted((ROOT / "agent" / "serving").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name | ast.alias):
                name = node.id if isinstance(node, ast.Name) else node.name
                if name in CONCRETE_SCHEDULERS:
                    named.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not named


class Recorded:
    """An event sink that keeps what it is told."""

    def __init__(self) -> None:
        self.kinds: list[tuple[str, str]] = []

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        self.kinds.append((model, kind))


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelRegistry]:
    """m: Y = X (ONNX); streamer: the decoupled Python model."""
    root = tmp_path_factory.mktemp("models")
    write_versions(root, "m", {1: scale_model(1.0)})
    markers = tmp_path_factory.mktemp("markers")
    write_python_model(root, "streamer", DECOUPLED_MODEL, decoupled_config("streamer", markers))
    reg = ModelRegistry(root, LoadSettings(intra_op_threads=1))
    assert reg.load_all() == {}
    yield reg
    reg.close()


def failures(plane: DataPlane, model: str) -> int:
    [entry] = plane.statistics(model, "1")["model_stats"]
    return int(entry["inference_stats"]["fail"]["count"])


def wrong_input(request_id: str) -> InferRequest:
    x = np.ones((1, 4), np.int32)  # m's X is FP32
    return InferRequest((InferInput("X", "INT32", x.shape, x),), id=request_id)


def unknown_input(request_id: str) -> InferRequest:
    x = np.ones((1, 1), np.int32)
    return InferRequest((InferInput("NOPE", "INT32", x.shape, x),), id=request_id)


def test_a_mismatched_request_is_refused_alike_on_both_paths(registry: ModelRegistry) -> None:
    plane = DataPlane(registry)

    async def main() -> tuple[str, str]:
        with pytest.raises(InvalidInputError) as unary:
            await plane.infer("m", None, wrong_input("u-1"))
        with pytest.raises(InvalidInputError) as streamed:
            async for _ in plane.infer_stream("streamer", None, wrong_input("s-1")):
                pass
        return unary.value.message, streamed.value.message

    before = failures(plane, "m"), failures(plane, "streamer")
    unary, streamed = asyncio.run(main())
    assert unary.startswith("[request id: u-1] ")
    assert streamed.startswith("[request id: s-1] ")
    # As Triton: a request its model refuses never ran, and is no failure in the statistics.
    assert (failures(plane, "m"), failures(plane, "streamer")) == before


def test_an_unknown_input_or_output_is_refused_without_the_request_id(
    registry: ModelRegistry,
) -> None:
    """Triton words an unknown input or output without the request's id."""
    plane = DataPlane(registry)
    x = np.ones((1, 4), np.float32)
    nope_out = InferRequest(
        (InferInput("X", "FP32", x.shape, x),), id="u-3", outputs=(RequestedOutput("NOPE"),)
    )
    for request, text in (
        (unknown_input("u-2"), "unexpected inference input 'NOPE' for model 'm'"),
        (nope_out, "unexpected inference output 'NOPE' for model 'm'"),
    ):
        with pytest.raises(UnknownTensorError) as refused:
            asyncio.run(plane.infer("m", None, request))
        assert refused.value.message.startswith(text)


def test_a_stateless_model_answers_a_request_with_sequence_flags(registry: ModelRegistry) -> None:
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    request = InferRequest(
        (InferInput("X", "FP32", x.shape, x),),
        parameters={"sequence_id": 7, "sequence_start": True},
    )
    response = asyncio.run(DataPlane(registry).infer("m", None, request))
    np.testing.assert_array_equal(response.outputs[0].data, x)


def test_a_manager_wired_later_serves_model_control(registry: ModelRegistry) -> None:
    plane = DataPlane(registry, mode=ModelControlMode.EXPLICIT)
    events = Recorded()
    manager = ModelManager(registry, events)
    plane.manager = manager  # as the daemon wires the one that reports its events
    assert plane.manager is manager

    async def main() -> None:
        await plane.load_model("m", None)
        x = np.ones((1, 4), np.float32)
        await plane.infer("m", None, InferRequest((InferInput("X", "FP32", x.shape, x),)))

    asyncio.run(main())
    assert events.kinds == [("m", "version_activated")]
