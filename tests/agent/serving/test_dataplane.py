"""DataPlane over a real registry of generated ONNX models, no transport: inference, metadata,
readiness, the errors every transport maps, statistics and the response cache."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from agent.errors import (
    InvalidInputError,
    ModelControlError,
    ModelNotFoundError,
    ModelNotReadyError,
)
from agent.models.control import ModelControlMode
from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from agent.serving.dataplane import SERVER_NAME, DataPlane
from agent.serving.response_cache import ResponseCache
from agent.tensors.request import InferInput, InferRequest, RequestedOutput
from tests.models import mlp_model_dir, scale_model, write_versions

X = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """m: versions 1 (Y = X) and 2 (Y = 2 X); cached: the same with the response cache on;
    mlp: the demo MLP with no config.pbtxt (auto-completed, batched)."""
    root = tmp_path / "models"
    write_versions(root, "m", {1: scale_model(1.0), 2: scale_model(2.0)})
    write_versions(root, "cached", {1: scale_model(1.0), 2: scale_model(2.0)})
    config = root / "cached" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    mlp_model_dir(root, "mlp")
    return root


@pytest.fixture
def registry(repo: Path) -> Iterator[ModelRegistry]:
    reg = ModelRegistry(repo, LoadSettings(intra_op_threads=1))
    assert reg.load_all() == {}
    yield reg
    reg.close()


@pytest.fixture
def cache() -> ResponseCache:
    return ResponseCache(1 << 20)


@pytest.fixture
def dataplane(registry: ModelRegistry, cache: ResponseCache) -> DataPlane:
    plane = DataPlane(registry, cache, mode=ModelControlMode.EXPLICIT)
    plane.set_ready(True)
    return plane


def request(x: np.ndarray = X, *, name: str = "X", request_id: str | None = None) -> InferRequest:
    return InferRequest((InferInput(name, "FP32", x.shape, x),), id=request_id)


def stats(plane: DataPlane, model: str, version: str) -> dict[str, Any]:
    [entry] = plane.statistics(model, version)["model_stats"]
    return dict(entry)


def counts(plane: DataPlane, model: str, version: str) -> dict[str, int]:
    return {k: v["count"] for k, v in stats(plane, model, version)["inference_stats"].items()}


def test_health_and_server_metadata(registry: ModelRegistry) -> None:
    plane = DataPlane(registry)
    assert plane.server_live()
    assert not plane.server_ready()  # not until start-up loading is done
    plane.set_ready(True)
    assert plane.server_ready()
    plane.set_ready(False)  # shutting down
    assert not plane.server_ready()
    meta = plane.server_metadata()
    assert meta["name"] == SERVER_NAME == "edge-agent"
    assert "model_repository" in meta["extensions"]
    assert "system_shared_memory" in meta["extensions"]  # the default registry is enabled


def test_infer_runs_the_latest_version_unless_one_is_named(dataplane: DataPlane) -> None:
    async def scenario() -> None:
        latest = await dataplane.infer("m", None, request(request_id="r-1"))
        assert (latest.model_name, latest.model_version, latest.id) == ("m", "2", "r-1")
        [out] = latest.outputs
        assert (out.name, out.datatype) == ("Y", "FP32")
        np.testing.assert_array_equal(out.data, 2 * X)
        first = await dataplane.infer("m", "1", request())
        assert first.model_version == "1"
        np.testing.assert_array_equal(first.outputs[0].data, X)

    asyncio.run(scenario())
    assert counts(dataplane, "m", "2")["success"] == 1
    assert counts(dataplane, "m", "1")["success"] == 1
    assert stats(dataplane, "m", "2")["inference_count"] == 1


def test_infer_returns_only_the_outputs_asked_for(dataplane: DataPlane) -> None:
    ask = InferRequest(request().inputs, outputs=(RequestedOutput("Y"),))
    response = asyncio.run(dataplane.infer("m", None, ask))
    assert [o.name for o in response.outputs] == ["Y"]
    bad = InferRequest(request().inputs, outputs=(RequestedOutput("Z"),))
    with pytest.raises(InvalidInputError, match="Z"):
        asyncio.run(dataplane.infer("m", None, bad))


def test_model_metadata_and_config(dataplane: DataPlane) -> None:
    meta = dataplane.model_metadata("m", None)
    assert meta == {
        "name": "m",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4]}],
        "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1, 4]}],
    }
    assert dataplane.model_metadata("m", "1")["versions"] == ["1"]
    batched = dataplane.model_metadata("mlp", None)  # auto-completed from the model file
    assert batched["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}]
    assert batched["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 10]}]
    assert dataplane.model_config("m", None)["name"] == "m"
    assert dataplane.model_config("mlp", None)["max_batch_size"] > 0
    assert dataplane.model_config_message("m", "2").name == "m"


def test_readiness_follows_the_registry(dataplane: DataPlane, registry: ModelRegistry) -> None:
    assert dataplane.model_ready("m", None)
    assert dataplane.model_ready("m", "1")
    assert registry.mark_failed("m", 2, "instance died")
    assert not dataplane.model_ready("m", "2")
    assert dataplane.model_ready("m", None)  # version 1 still serves
    with pytest.raises(ModelNotFoundError):
        dataplane.model_ready("nope", None)
    with pytest.raises(ModelNotFoundError):
        dataplane.model_ready("m", "9")
    ready = dataplane.repository_index(ready_only=True)
    assert {(r["name"], r["version"]) for r in ready} == {
        ("m", "1"),
        ("cached", "1"),
        ("cached", "2"),
        ("mlp", "1"),
    }
    everything = dataplane.repository_index()
    assert {"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "instance died"} in (
        everything
    )


@pytest.mark.parametrize(
    ("model", "version", "error", "message"),
    [
        ("nope", None, ModelNotFoundError, "Request for unknown model: 'nope' is not found"),
        ("m", "9", ModelNotFoundError, "Request for unknown model: 'm' version 9 is not found"),
        (
            "m",
            "v1",
            InvalidInputError,
            "failed to get model version from specified version string 'v1' (details: stol), "
            "version should be an integral value > 0",
        ),
    ],
)
def test_infer_on_an_unknown_model_or_version_is_not_found(
    dataplane: DataPlane, model: str, version: str | None, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        asyncio.run(dataplane.infer(model, version, request()))
    assert str(raised.value) == message


def test_infer_on_an_unloaded_model_is_not_ready(dataplane: DataPlane) -> None:
    async def scenario() -> None:
        await dataplane.unload_model("m")
        with pytest.raises(ModelNotReadyError, match="'m' has no available versions: unloaded"):
            await dataplane.infer("m", None, request())
        with pytest.raises(ModelNotReadyError, match="version 1 is not at ready state"):
            await dataplane.infer("m", "1", request())
        assert not dataplane.model_ready("m", None)
        # An explicit load brings it back.
        await dataplane.load_model("m", None)
        assert (await dataplane.infer("m", None, request())).model_version == "2"

    asyncio.run(scenario())


def test_load_and_unload_need_explicit_mode(registry: ModelRegistry) -> None:
    plane = DataPlane(registry)  # model-control mode NONE
    with pytest.raises(ModelControlError, match="explicit"):
        asyncio.run(plane.unload_model("m"))
    assert plane.model_ready("m", None)


def test_an_invalid_request_fails_and_is_not_counted(dataplane: DataPlane) -> None:
    """As Triton: a request refused before it runs is no failure in the model's statistics."""
    with pytest.raises(InvalidInputError):
        asyncio.run(dataplane.infer("m", None, request(name="NOT_X")))
    with pytest.raises(InvalidInputError):
        asyncio.run(dataplane.infer("m", None, request(np.zeros((1, 5), np.float32))))
    assert counts(dataplane, "m", "2")["fail"] == 0
    assert counts(dataplane, "m", "2")["success"] == 0


def test_the_response_cache_answers_a_repeated_request(
    dataplane: DataPlane, cache: ResponseCache
) -> None:
    async def scenario() -> None:
        first = await dataplane.infer("cached", None, request())
        assert (cache.hits, cache.misses, cache.entries) == (0, 1, 1)
        again = await dataplane.infer("cached", None, request(request_id="again"))
        assert (cache.hits, cache.misses) == (1, 1)
        assert (again.model_version, again.id) == ("2", "again")
        np.testing.assert_array_equal(again.outputs[0].data, first.outputs[0].data)
        np.testing.assert_array_equal(again.outputs[0].data, 2 * X)
        other = await dataplane.infer("cached", None, request(X + 1))  # other bytes: a miss
        np.testing.assert_array_equal(other.outputs[0].data, 2 * (X + 1))
        assert (cache.hits, cache.misses, cache.entries) == (1, 2, 2)
        await dataplane.infer("cached", "1", request())  # other version: its own entry
        assert (cache.hits, cache.misses, cache.entries) == (1, 3, 3)

    asyncio.run(scenario())
    version_2 = stats(dataplane, "cached", "2")
    assert version_2["inference_stats"]["cache_hit"]["count"] == 1
    assert version_2["inference_stats"]["cache_miss"]["count"] == 2
    assert version_2["execution_count"] == 2  # the hit never reached the model
    assert version_2["inference_stats"]["success"]["count"] == 3  # a hit succeeds too, as in Triton


def test_the_response_cache_is_skipped_for_models_without_it(
    dataplane: DataPlane, cache: ResponseCache
) -> None:
    async def scenario() -> None:
        for _ in range(2):
            await dataplane.infer("m", None, request())

    asyncio.run(scenario())
    assert (cache.hits, cache.misses, cache.entries) == (0, 0, 0)
    assert stats(dataplane, "m", "2")["execution_count"] == 2


def test_unloading_drops_the_model_s_cached_responses(
    dataplane: DataPlane, cache: ResponseCache
) -> None:
    async def scenario() -> None:
        await dataplane.infer("cached", None, request())
        assert cache.entries == 1
        await dataplane.unload_model("cached")
        assert cache.entries == 0
        await dataplane.load_model("cached", None)
        await dataplane.infer("cached", None, request())
        assert (cache.hits, cache.misses) == (0, 2)  # served afresh, not from the old entry

    asyncio.run(scenario())


def test_a_version_rebuilt_under_the_same_number_is_not_answered_from_the_old_build(
    dataplane: DataPlane, cache: ResponseCache, registry: ModelRegistry, repo: Path
) -> None:
    async def scenario() -> None:
        first = await dataplane.infer("cached", None, request())
        np.testing.assert_array_equal(first.outputs[0].data, 2 * X)
        # Version 2's file changes on disk and the model is rebuilt (as a poll-mode reload or a
        # sync re-activation does), without going through the data plane's own load call.
        onnx.save(scale_model(3.0), str(repo / "cached" / "2" / "model.onnx"))
        registry.load_model("cached")
        again = await dataplane.infer("cached", None, request())
        np.testing.assert_array_equal(again.outputs[0].data, 3 * X)
        assert cache.hits == 0

    asyncio.run(scenario())
