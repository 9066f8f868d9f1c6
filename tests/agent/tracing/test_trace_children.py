"""Triton's trace extension, level TENSORS and child traces, read from the trace file written
for real inferences: ensemble steps and BLS calls (`trace=request.trace()`) are traces of their
own with a `parent_id`; the settings tritonclient sends behave as Triton's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from agent.config.schema import AgentConfig, LogConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from agent.tracing.tensors import tensor_entry
from agent.tracing.tracer import Tracer
from tests.server import running_agent
from tests.trace_models import write_trace_children_repo

A = np.array([1.0, 2.5, -3.0, 4.0], np.float32)
B = np.array([0.5, 0.5, 1.0, 2.0], np.float32)
ON = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("child_traces")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, trace_dir: Path) -> Iterator[RunningAgent]:
    repo = write_trace_children_repo(tmp_path_factory.mktemp("trace_children") / "models")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
        log=LogConfig(trace_file=trace_dir / "trace.json"),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent, trace_dir: Path) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    yield client
    tracer = agent.dataplane.tracer
    for model in ("add_sub", "ens"):
        tracer.update(model, {})
    tracer.update(
        None, dict.fromkeys(("trace_level", "trace_rate", "trace_count", "log_frequency"))
    )
    tracer.flush()
    for path in trace_dir.iterdir():
        path.unlink()
    client.close()


def _infer(client: httpclient.InferenceServerClient, model: str) -> dict[str, np.ndarray]:
    inputs = []
    for name, data in (("INPUT0", A), ("INPUT1", B)):
        tensor = httpclient.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    result = client.infer(model, inputs)
    return {name: np.asarray(result.as_numpy(name)) for name in ("OUTPUT0", "OUTPUT1")}


def _entries(trace_dir: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for path in sorted(trace_dir.iterdir()):
        entries += json.loads(path.read_text())
    return entries


def _traces(trace_dir: Path) -> dict[int, dict[str, Any]]:
    """id -> {"head", "stamps": {name: ns}, "tensors": [(activity, tensor)]}."""
    traces: dict[int, dict[str, Any]] = {}
    for entry in _entries(trace_dir):
        trace = traces.setdefault(entry["id"], {"head": None, "stamps": {}, "tensors": []})
        if "timestamps" in entry:
            for stamp in entry["timestamps"]:
                trace["stamps"][stamp["name"]] = stamp["ns"]
        elif "activity" in entry:
            trace["tensors"].append((entry["activity"], entry["tensor"]))
        else:
            trace["head"] = entry
    return traces


def _csv(values: np.ndarray) -> str:
    return ",".join(format(float(v), "g") for v in values)


def test_tensors_level_writes_each_tensor(
    client: httpclient.InferenceServerClient, trace_dir: Path
) -> None:
    settings = client.update_trace_settings(
        settings={**ON, "trace_level": ["TIMESTAMPS", "TENSORS"]}
    )
    assert settings["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    _infer(client, "add_sub")
    (trace,) = _traces(trace_dir).values()
    assert trace["head"]["model_name"] == "add_sub"
    assert {"REQUEST_START", "COMPUTE_END", "HTTP_SEND_END"} <= set(trace["stamps"])
    by_activity: dict[str, dict[str, dict[str, str]]] = {}
    for activity, tensor in trace["tensors"]:
        by_activity.setdefault(activity, {})[tensor["name"]] = tensor
    assert set(by_activity) == {
        "TENSOR_QUEUE_INPUT",
        "TENSOR_BACKEND_INPUT",
        "TENSOR_BACKEND_OUTPUT",
    }
    for activity in ("TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_INPUT"):
        assert by_activity[activity]["INPUT0"] == {
            "name": "INPUT0",
            "data": "1,2.5,-3,4",
            "shape": "4",
            "dtype": "FP32",
        }
        assert by_activity[activity]["INPUT1"]["data"] == _csv(B)
    outputs = by_activity["TENSOR_BACKEND_OUTPUT"]
    assert outputs["OUTPUT0"]["data"] == _csv(A + B)
    assert outputs["OUTPUT1"]["data"] == _csv(A - B)
    assert outputs["OUTPUT1"]["shape"] == "4"
    # Written where they happened: inputs before the compute stamps, outputs after.
    order = [
        e.get("activity") or e.get("timestamps", [{}])[0].get("name") for e in _entries(trace_dir)
    ]
    assert order.index("TENSOR_QUEUE_INPUT") < order.index("COMPUTE_START")
    assert (
        order.index("COMPUTE_END")
        < order.index("TENSOR_BACKEND_OUTPUT")
        < order.index("REQUEST_END")
    )


def test_tensors_alone_writes_no_timestamps(
    client: httpclient.InferenceServerClient, trace_dir: Path
) -> None:
    client.update_trace_settings(settings={**ON, "trace_level": ["TENSORS"]})
    _infer(client, "add_sub")
    (trace,) = _traces(trace_dir).values()
    assert trace["stamps"] == {}
    assert len(trace["tensors"]) == 6  # 2 queue inputs, 2 backend inputs, 2 outputs


def test_ensemble_steps_are_child_traces(
    client: httpclient.InferenceServerClient, trace_dir: Path
) -> None:
    client.update_trace_settings(settings={**ON, "trace_level": ["TIMESTAMPS", "TENSORS"]})
    out = _infer(client, "ens")
    np.testing.assert_allclose(out["OUTPUT0"], 2 * A)
    assert len(list(trace_dir.iterdir())) == 1  # log_frequency 1: one trace, its steps with it
    traces = _traces(trace_dir)
    (parent,) = [t for t in traces.values() if t["head"]["model_name"] == "ens"]
    assert "parent_id" not in parent["head"]
    steps = [t for t in traces.values() if t["head"]["model_name"] == "add_sub"]
    assert len(steps) == 2
    for step in steps:
        assert step["head"]["parent_id"] == parent["head"]["id"]
        assert step["head"]["model_version"] == 1
        assert parent["stamps"]["REQUEST_START"] < step["stamps"]["REQUEST_START"]
        assert step["stamps"]["REQUEST_END"] < parent["stamps"]["REQUEST_END"]
        assert "HTTP_RECV_START" not in step["stamps"]  # no transport of its own
    # The data flow: the second step reads what the first one wrote.
    first, second = sorted(steps, key=lambda t: t["stamps"]["REQUEST_START"])
    made = {t["name"]: t["data"] for a, t in first["tensors"] if a == "TENSOR_BACKEND_OUTPUT"}
    read = {t["name"]: t["data"] for a, t in second["tensors"] if a == "TENSOR_QUEUE_INPUT"}
    assert read == {"INPUT0": made["OUTPUT0"], "INPUT1": made["OUTPUT1"]}


def test_bls_call_with_the_request_trace_is_a_child(
    client: httpclient.InferenceServerClient, trace_dir: Path
) -> None:
    client.update_trace_settings(settings=ON)
    _infer(client, "bls_traced")
    traces = _traces(trace_dir)
    (parent,) = [t for t in traces.values() if t["head"]["model_name"] == "bls_traced"]
    # add_sub ran twice; only the call made with trace=request.trace() is traced (Triton's rule).
    (child,) = [t for t in traces.values() if t["head"]["model_name"] == "add_sub"]
    assert child["head"]["parent_id"] == parent["head"]["id"]
    assert parent["stamps"]["QUEUE_START"] < child["stamps"]["REQUEST_START"]
    assert child["stamps"]["REQUEST_END"] < parent["stamps"]["REQUEST_END"]


def test_ensemble_of_a_bls_model_nests_three_deep(
    client: httpclient.InferenceServerClient, trace_dir: Path
) -> None:
    client.update_trace_settings(settings=ON)
    _infer(client, "ens_bls")
    heads = {t["head"]["model_name"]: t["head"] for t in _traces(trace_dir).values()}
    assert set(heads) == {"ens_bls", "bls_traced", "add_sub"}
    assert heads["bls_traced"]["parent_id"] == heads["ens_bls"]["id"]
    assert heads["add_sub"]["parent_id"] == heads["bls_traced"]["id"]


def test_untraced_requests_spawn_no_children(
    client: httpclient.InferenceServerClient, trace_dir: Path
) -> None:
    client.update_trace_settings("add_sub", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    _infer(client, "ens")  # the ensemble's own settings: off, so its steps are not traced
    client.update_trace_settings("add_sub", {})
    assert _traces(trace_dir) == {}


def test_count_exhausted_writes_an_indexed_file_at_once(
    client: httpclient.InferenceServerClient, agent: RunningAgent, trace_dir: Path
) -> None:
    client.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"}
    )
    for _ in range(3):
        _infer(client, "add_sub")
    assert client.get_trace_settings()["trace_count"] == "0"
    assert not agent.dataplane.tracer.active
    # As Triton: the traces a trace_count asked for are written once all are taken.
    (written,) = trace_dir.iterdir()
    assert written.name.startswith("trace.json.")
    assert len(_traces(trace_dir)) == 2


def test_changed_settings_write_their_traces_and_the_file_grows(
    client: httpclient.InferenceServerClient, agent: RunningAgent, trace_dir: Path
) -> None:
    client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    _infer(client, "add_sub")
    _infer(client, "add_sub")
    assert not list(trace_dir.iterdir())  # log_frequency 0: kept
    client.update_trace_settings(settings={"trace_rate": "1"})  # replaced: they are written
    assert len(_traces(trace_dir)) == 2
    _infer(client, "add_sub")
    agent.dataplane.tracer.flush()
    assert [p.name for p in trace_dir.iterdir()] == ["trace.json"]
    assert len(_traces(trace_dir)) == 3  # appended: still one JSON array


def test_model_settings_sample_count_and_write_on_their_own(
    client: httpclient.InferenceServerClient, trace_dir: Path
) -> None:
    client.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "5"}
    )
    doc = client.update_trace_settings("add_sub", {"log_frequency": "1"})
    assert doc["trace_count"] == "5"  # from the global settings, counted down on its own
    _infer(client, "add_sub")
    _infer(client, "add_sub")
    assert client.get_trace_settings("add_sub")["trace_count"] == "3"
    assert client.get_trace_settings()["trace_count"] == "5"
    assert len(list(trace_dir.iterdir())) == 2  # log_frequency 1: each its own file
    _infer(client, "ens")  # global settings: log_frequency 0, kept until they change
    assert len(list(trace_dir.iterdir())) == 2
    assert client.get_trace_settings()["trace_count"] == "4"


def test_grpc_client_sets_and_clears_levels(
    agent: RunningAgent, client: httpclient.InferenceServerClient
) -> None:
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    doc = grpc.update_trace_settings(
        model_name="ens", settings={"trace_level": ["TIMESTAMPS", "TENSORS"]}, as_json=True
    )["settings"]
    assert doc["trace_level"]["value"] == ["TIMESTAMPS", "TENSORS"]
    doc = grpc.update_trace_settings(
        model_name="ens", settings={"trace_level": None}, as_json=True
    )["settings"]
    assert doc["trace_level"]["value"] == ["OFF"]
    assert grpc.get_trace_settings(model_name="ens", as_json=True)["settings"]["trace_level"][
        "value"
    ] == ["OFF"]
    grpc.close()


def test_tensor_entry_formats_every_type() -> None:
    assert tensor_entry("b", "BOOL", np.array([[True, False]])) == {
        "name": "b",
        "data": "1,0",
        "shape": "1,2",
        "dtype": "BOOL",
    }
    assert tensor_entry("i", "INT8", np.array([-1, 7], np.int8))["data"] == "-1,7"
    assert tensor_entry("u", "UINT64", np.array([2**63], np.uint64))["data"] == str(2**63)
    assert tensor_entry("f", "FP64", np.array([0.1, 1e20]))["data"] == "0.1,1e+20"
    assert tensor_entry("s", "BYTES", np.array([b"ab", b"c"], np.object_))["data"] == '"ab","c"'
    assert tensor_entry("e", "FP32", np.zeros((0, 3), np.float32))["shape"] == "0,3"


def test_a_child_that_outlives_its_parent_is_written_on_its_own(tmp_path: Path) -> None:
    tracer = Tracer(str(tmp_path / "t.json"))
    tracer.update(None, ON)
    parent = tracer.start("bls_traced")
    assert parent is not None
    child = tracer.spawn(parent, "add_sub", "call-1")
    early = tracer.spawn(parent, "add_sub")
    for trace in (parent, child, early):
        trace.stamp("REQUEST_START")
    tracer.finish(early)  # waits for its parent
    assert not list(tmp_path.iterdir())
    tracer.finish(parent)
    tracer.finish(child)  # a BLS call left running by its model: written alone, still linked
    first = json.loads((tmp_path / "t.json.0").read_text())
    late = json.loads((tmp_path / "t.json.1").read_text())
    assert [e["id"] for e in first if "model_name" in e] == [parent.id, early.id]
    assert late[0] == {
        "id": child.id,
        "model_name": "add_sub",
        "model_version": 0,
        "request_id": "call-1",
        "parent_id": parent.id,
    }
