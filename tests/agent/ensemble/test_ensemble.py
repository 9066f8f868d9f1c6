"""Ensembles end to end over HTTP with ONNX steps, and the DAG runner on an in-memory data plane."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.ensemble.plan import build_plan
from agent.ensemble.runner import EnsembleScheduler, StepRunnerSlot
from agent.errors import BackendError, ModelNotReadyError
from agent.proto import model_config_pb2 as mc
from agent.runtime.daemon import RunningAgent
from agent.scheduling.batching import BatchingPolicy
from agent.tensors.request import InferRequest, InferResponse, OutputTensor
from agent.tensors.signature import ValidatedRequest
from tests.models import save_ready, write_model
from tests.server import running_agent


def _unary(op: str, constant: float) -> Any:
    c = helper.make_tensor("c", TensorProto.FLOAT, [], [constant])
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "c"], ["y"])],
        op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
        [c],
    )
    return save_ready(graph)


def _add_pair() -> Any:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"])],
        "add_pair",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4]),
        ],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["n", 4])],
    )
    return save_ready(graph)


def _fragile() -> Any:
    """y = [7, 7][index], index 10 (out of range: the run fails) wherever x > 0.5."""
    consts = [
        helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
        helper.make_tensor("ten", TensorProto.INT64, [], [10]),
        helper.make_tensor("table", TensorProto.FLOAT, [2], [7.0, 7.0]),
    ]
    nodes = [
        helper.make_node("Greater", ["x", "half"], ["big"]),
        helper.make_node("Cast", ["big"], ["flag"], to=TensorProto.INT64),
        helper.make_node("Mul", ["flag", "ten"], ["index"]),
        helper.make_node("Gather", ["table", "index"], ["y"], axis=0),
    ]
    graph = helper.make_graph(
        nodes,
        "fragile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
        consts,
    )
    return save_ready(graph)


def _io(*inputs: str, outputs: tuple[str, ...] = ("y",), batch: int = 8) -> str:
    ins = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in inputs)
    outs = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in outputs)
    return f'platform: "onnxruntime_onnx" max_batch_size: {batch} input [ {ins} ] output [ {outs} ]'


ENSEMBLE_HEAD = """
name: "{name}" platform: "ensemble" max_batch_size: 8
input [ {{ name: "IN" data_type: {dtype} dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""

# OUT = double(IN) + plus1(IN) = 3 * IN + 1; double and plus1 are independent branches.
DIAMOND = """
ensemble_scheduling {
  step { model_name: "double" model_version: -1
         input_map { key: "x" value: "IN" } output_map { key: "y" value: "d" } }
  step { model_name: "plus1" model_version: -1
         input_map { key: "x" value: "IN" } output_map { key: "y" value: "p" } }
  step { model_name: "add_pair" model_version: -1
         input_map { key: "a" value: "d" } input_map { key: "b" value: "p" }
         output_map { key: "s" value: "OUT" } }
}
"""
FRAGILE_CHAIN = """
ensemble_scheduling {
  step { model_name: "double" input_map { key: "x" value: "IN" }
         output_map { key: "y" value: "d" } }
  step { model_name: "fragile" input_map { key: "x" value: "d" }
         output_map { key: "y" value: "OUT" } }
}
"""
GHOST = """
ensemble_scheduling {
  step { model_name: "ghost" input_map { key: "x" value: "IN" }
         output_map { key: "y" value: "OUT" } }
}
"""


def _ensemble(repo: Path, name: str, steps: str, dtype: str = "TYPE_FP32") -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(ENSEMBLE_HEAD.format(name=name, dtype=dtype) + steps)


@pytest.fixture(scope="module")
def ens_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("ensemble") / "models"
    write_model(repo, "double", _unary("Mul", 2.0), f'name: "double" {_io("x")}')
    write_model(repo, "plus1", _unary("Add", 1.0), f'name: "plus1" {_io("x")}')
    write_model(repo, "add_pair", _add_pair(), f'name: "add_pair" {_io("a", "b", outputs=("s",))}')
    write_model(repo, "fragile", _fragile(), f'name: "fragile" {_io("x")}')
    # Names sort before their composing models: load order must not depend on names.
    _ensemble(repo, "a_diamond", DIAMOND)
    _ensemble(repo, "a_fragile_chain", FRAGILE_CHAIN)
    _ensemble(repo, "a_ghost", GHOST)
    _ensemble(repo, "a_wrong_type", DIAMOND, dtype="TYPE_INT32")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1, exit_on_error=False),
    )
    with running_agent(config) as agent:
        yield agent


def _client(agent: RunningAgent) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")


def _infer(agent: RunningAgent, model: str, x: np.ndarray) -> np.ndarray:
    inp = httpclient.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = _client(agent).infer(model, [inp])
    out = result.as_numpy("OUT")
    assert out is not None
    return np.asarray(out)


def _success_count(agent: RunningAgent, model: str) -> int:
    stats = _client(agent).get_inference_statistics(model)
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_diamond_ensemble_equals_its_steps_by_hand(ens_agent: RunningAgent) -> None:
    rng = np.random.default_rng(3)
    before = {m: _success_count(ens_agent, m) for m in ("double", "plus1", "add_pair")}
    for rows in (1, 3, 8):
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        out = _infer(ens_agent, "a_diamond", x)
        np.testing.assert_array_equal(out, (x * 2) + (x + 1))
    # Per-step statistics: each composing model counted each step it ran.
    for model, count in before.items():
        assert _success_count(ens_agent, model) == count + 3
    assert _success_count(ens_agent, "a_diamond") == 3
    # The ensemble's own: one execution per request, of its rows (Triton's counts).
    [own] = _client(ens_agent).get_inference_statistics("a_diamond")["model_stats"]
    assert (int(own["execution_count"]), int(own["inference_count"])) == (3, 1 + 3 + 8)
    assert sorted(int(b["batch_size"]) for b in own["batch_stats"]) == [1, 3, 8]
    meta = _client(ens_agent).get_model_metadata("a_diamond")
    assert meta["platform"] == "ensemble"
    assert meta["inputs"] == [{"name": "IN", "datatype": "FP32", "shape": [-1, 4]}]


def test_concurrent_ensemble_requests_batch_on_the_steps(ens_agent: RunningAgent) -> None:
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ens_agent.http_port}", concurrency=8)
    pending = []
    for row in x:
        inp = httpclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(row.reshape(1, 4), binary_data=True)
        pending.append(client.async_infer("a_diamond", [inp]))
    outs = [p.get_result().as_numpy("OUT") for p in pending]
    np.testing.assert_array_equal(np.concatenate(outs), x * 3 + 1)


def test_a_failing_step_fails_the_request_and_names_the_step(ens_agent: RunningAgent) -> None:
    ok = _infer(ens_agent, "a_fragile_chain", np.zeros((1, 4), np.float32))
    np.testing.assert_array_equal(ok, np.full((1, 4), 7.0, np.float32))
    with pytest.raises(InferenceServerException) as caught:
        _infer(ens_agent, "a_fragile_chain", np.ones((1, 4), np.float32))
    assert "ensemble 'a_fragile_chain' step 1 (model 'fragile')" in str(caught.value)
    # Neither the ensemble nor its steps became unavailable.
    again = _infer(ens_agent, "a_fragile_chain", np.zeros((2, 4), np.float32))
    assert again.shape == (2, 4)
    assert _client(ens_agent).is_model_ready("fragile")


def test_bad_ensembles_are_refused_at_load_with_the_reason(ens_agent: RunningAgent) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{ens_agent.http_port}/v2/repository/index", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        index = {row["name"]: row for row in json.load(response)}
    assert index["a_diamond"]["state"] == "READY"
    assert index["a_ghost"]["state"] == "UNAVAILABLE"
    assert "step 0 (model 'ghost'): model 'ghost' is not loaded" in index["a_ghost"]["reason"]
    assert index["a_wrong_type"]["state"] == "UNAVAILABLE"
    assert (
        "tensor 'IN' is INT32 but step 0 (model 'double') input 'x' expects FP32"
        in (index["a_wrong_type"]["reason"])
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(
            f"http://127.0.0.1:{ens_agent.http_port}/v2/models/a_ghost/ready", timeout=10
        )
    assert caught.value.code == 400  # Triton's "not ready"


def test_an_ensemble_has_no_batcher_to_tune(ens_agent: RunningAgent) -> None:
    config = _client(ens_agent).get_model_config("a_diamond")
    assert config["platform"] == "ensemble"
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
        "double",
        "plus1",
        "add_pair",
    ]


# The DAG runner on an in-memory data plane: no sockets, no sleeps.

MODELS = {
    "double": f'name: "double" {_io("x")}',
    "plus1": f'name: "plus1" {_io("x")}',
    "add_pair": f'name: "add_pair" {_io("a", "b", outputs=("s",))}',
}


def _scheduler(slot: StepRunnerSlot) -> EnsembleScheduler:
    configs = {n: text_format.Parse(t, mc.ModelConfig()) for n, t in MODELS.items()}
    ensemble = text_format.Parse(
        ENSEMBLE_HEAD.format(name="d", dtype="TYPE_FP32") + DIAMOND, mc.ModelConfig()
    )
    plan = build_plan(ensemble, configs.get)
    return EnsembleScheduler(plan, 1, BatchingPolicy.from_config(ensemble), slot)


def _request(x: np.ndarray) -> ValidatedRequest:
    return ValidatedRequest({"IN": x}, ("OUT",), x.shape[0])


def test_independent_steps_run_concurrently() -> None:
    """`double` waits until `plus1` has started: a sequential runner would never finish."""
    started: dict[str, asyncio.Event] = {}
    calls: list[str] = []

    async def runner(
        model: str, version: str | None, request: InferRequest, *, refusal: str | None = None
    ) -> InferResponse:
        calls.append(model)
        started.setdefault(model, asyncio.Event()).set()
        if model == "double":
            await started.setdefault("plus1", asyncio.Event()).wait()
        feeds = {t.name: t.data for t in request.inputs}
        if model == "add_pair":
            data = feeds["a"] + feeds["b"]
        else:
            data = feeds["x"] * 2 if model == "double" else feeds["x"] + 1
        name = "s" if model == "add_pair" else "y"
        assert version is None
        return InferResponse(model, "1", (OutputTensor(name, "FP32", data),))

    slot = StepRunnerSlot()
    slot.runner = runner

    async def scenario() -> list[np.ndarray]:
        scheduler = _scheduler(slot)
        result = await asyncio.wait_for(scheduler.submit(_request(np.ones((2, 4), "f4"))), 10)
        await scheduler.drain()
        assert scheduler.pending == 0
        return result.outputs

    outputs = asyncio.run(scenario())
    np.testing.assert_array_equal(outputs[0], np.full((2, 4), 4.0, np.float32))
    assert calls[:2] in (["double", "plus1"], ["plus1", "double"])
    assert calls[2] == "add_pair"


def test_the_first_failure_stops_later_steps_and_keeps_its_kind() -> None:
    calls: list[str] = []

    async def runner(
        model: str, version: str | None, request: InferRequest, *, refusal: str | None = None
    ) -> InferResponse:
        calls.append(model)
        if model == "plus1":
            raise ModelNotReadyError("model 'plus1' is not ready: unloaded")
        if model == "double":
            raise BackendError("runtime failed")
        raise AssertionError("add_pair must not run")

    slot = StepRunnerSlot()
    slot.runner = runner

    async def scenario() -> BaseException:
        scheduler = _scheduler(slot)
        try:
            await scheduler.submit(_request(np.ones((1, 4), "f4")))
        except (BackendError, ModelNotReadyError) as exc:
            return exc
        raise AssertionError("the ensemble did not fail")

    error = asyncio.run(scenario())
    assert "add_pair" not in calls
    assert "ensemble 'd' step" in str(error)


def test_an_unbound_ensemble_is_not_ready() -> None:
    async def scenario() -> None:
        await _scheduler(StepRunnerSlot()).submit(_request(np.ones((1, 4), "f4")))

    with pytest.raises(ModelNotReadyError, match="not connected to a data plane"):
        asyncio.run(scenario())
