"""Triton's Python-backend examples, run unchanged against both servers.

The models are those of python_backend's `examples/` (tests/conformance/examples_repository.py);
each test makes its example client's calls with tritonclient (HTTP, gRPC, gRPC streaming for the
decoupled ones) against Triton and then the agent, asserts the client's own checks on both, and
compares what the two answered (the response as the client library sees it, error texts as
compare.py judges them: Triton's text, ours may only add context after it).
"""

from __future__ import annotations

import queue
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.conformance.compare import Side
from tests.conformance.conftest import Pair, started_pair
from tests.conformance.examples_repository import write_examples

pytestmark = [pytest.mark.e2e, pytest.mark.external]

Answer = Any  # what a check returns for comparison: plain JSON-like data


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with started_pair(tmp_path_factory.mktemp("examples"), write_examples) as started:
        yield started


def _http(side: Side) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{side.http_port}")


def _grpc(side: Side) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{side.grpc_port}")


def _same(pair: Pair, check: Callable[[Side], Answer]) -> None:
    """Run `check` on both servers; both answers must be equal."""
    triton = check(pair.triton)
    agent = check(pair.agent)
    assert agent == triton, f"triton {triton!r}\nagent  {agent!r}"


def _two_inputs(module: Any, seed: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)  # the same "random" inputs for both servers
    a = rng.random(4).astype(np.float32)
    b = rng.random(4).astype(np.float32)
    inputs = [
        module.InferInput("INPUT0", list(a.shape), np_to_triton_dtype(a.dtype)),
        module.InferInput("INPUT1", list(b.shape), np_to_triton_dtype(b.dtype)),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def _outputs(module: Any, *names: str) -> list[Any]:
    return [module.InferRequestedOutput(name) for name in names]


def _http_answer(result: httpclient.InferResult, *names: str) -> Answer:
    arrays = {n: (str(result.as_numpy(n).dtype), result.as_numpy(n).tolist()) for n in names}
    return {"response": result.get_response(), "arrays": arrays}


def _grpc_answer(result: grpcclient.InferResult, *names: str) -> Answer:
    response = result.get_response(as_json=True)
    response.pop("raw_output_contents", None)
    arrays = {n: (str(result.as_numpy(n).dtype), result.as_numpy(n).tolist()) for n in names}
    return {"response": response, "arrays": arrays}


def _add_sub_http(model: str, side: Side) -> Answer:
    inputs, a, b = _two_inputs(httpclient, 1)
    with _http(side) as client:
        result = client.infer(
            model, inputs, request_id="1", outputs=_outputs(httpclient, "OUTPUT0", "OUTPUT1")
        )
    assert np.allclose(a + b, result.as_numpy("OUTPUT0")), f"{side.name}: incorrect sum"
    assert np.allclose(a - b, result.as_numpy("OUTPUT1")), f"{side.name}: incorrect difference"
    return _http_answer(result, "OUTPUT0", "OUTPUT1")


def _add_sub_grpc(model: str, side: Side) -> Answer:
    inputs, a, b = _two_inputs(grpcclient, 2)
    with _grpc(side) as client:
        result = client.infer(
            model, inputs, request_id="1", outputs=_outputs(grpcclient, "OUTPUT0", "OUTPUT1")
        )
    assert np.allclose(a + b, result.as_numpy("OUTPUT0")), f"{side.name}: incorrect sum"
    assert np.allclose(a - b, result.as_numpy("OUTPUT1")), f"{side.name}: incorrect difference"
    return _grpc_answer(result, "OUTPUT0", "OUTPUT1")


@pytest.mark.parametrize("model", ["add_sub", "bls_async", "custom_metrics"])
def test_add_sub_shaped_examples_over_http(examples: Pair, model: str) -> None:
    _same(examples, partial(_add_sub_http, model))


@pytest.mark.parametrize("model", ["add_sub", "bls_async"])
def test_add_sub_shaped_examples_over_grpc(examples: Pair, model: str) -> None:
    _same(examples, partial(_add_sub_grpc, model))


EXPECTED_IO = [
    {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["4"]},
    {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": ["4"]},
]


def _auto_complete(side: Side) -> Answer:
    seen = {}
    with _http(side) as client:
        for model, max_batch in (("nobatch_auto_complete", 0), ("batch_auto_complete", 4)):
            config = client.get_model_config(model)
            assert config["max_batch_size"] == max_batch, f"{side.name}: {model}"
            ios = {io["name"]: (io["data_type"], io["dims"]) for io in config["input"]}
            ios |= {io["name"]: (io["data_type"], io["dims"]) for io in config["output"]}
            for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"):
                assert ios[name] == ("TYPE_FP32", [4]), f"{side.name}: {model} {name}"
            seen[model] = {
                "ios": ios,
                "dynamic_batching": "dynamic_batching" in config,
                "backend": config.get("backend"),
            }
    return seen


def test_auto_complete_configs(examples: Pair) -> None:
    _same(examples, _auto_complete)


def _bls_sync(side: Side) -> Answer:
    inputs, a, b = _two_inputs(httpclient, 3)
    inputs.append(httpclient.InferInput("MODEL_NAME", [1], "BYTES"))
    answers: list[Answer] = []
    with _http(side) as client:
        for target in ("add_sub", "pytorch"):
            inputs[2].set_data_from_numpy(np.array([target], dtype=np.object_))
            result = client.infer(
                "bls_sync",
                inputs,
                request_id="1",
                outputs=_outputs(httpclient, "OUTPUT0", "OUTPUT1"),
            )
            assert np.allclose(a + b, result.as_numpy("OUTPUT0")), f"{side.name}: {target} sum"
            assert np.allclose(a - b, result.as_numpy("OUTPUT1")), f"{side.name}: {target} diff"
            answers.append(_http_answer(result, "OUTPUT0", "OUTPUT1"))
        inputs[2].set_data_from_numpy(np.array(["undefined_model"], dtype=np.object_))
        with pytest.raises(InferenceServerException) as raised:
            client.infer("bls_sync", inputs, request_id="1")
    answers.append({"status": raised.value.status(), "message": raised.value.message()})
    return answers


def test_bls_sync(examples: Pair) -> None:
    triton = _bls_sync(examples.triton)
    agent = _bls_sync(examples.agent)
    assert agent[:2] == triton[:2]
    assert agent[2]["status"] == triton[2]["status"]
    # Triton's text first, ours may add context after it; we name the model file relative to
    # the repository (compare.py's rules)
    want = str(triton[2]["message"]).replace(f"{examples.repo}/", "")
    got = str(agent[2]["message"])
    want_head, _, want_frames = want.partition("\n\nAt:")
    got_head, _, got_frames = got.partition("\n\nAt:")
    assert got_head.startswith(want_head), (want, got)
    assert got_frames == want_frames, (want, got)


def _bls_decoupled(model: str, times: int, side: Side) -> Answer:
    answers = []
    with _http(side) as client:
        for value in (4, 2, 0, 1):
            data = np.array([value], dtype=np.int32)
            inputs = [httpclient.InferInput("IN", list(data.shape), "INT32")]
            inputs[0].set_data_from_numpy(data)
            result = client.infer(
                model, inputs, request_id="1", outputs=_outputs(httpclient, "SUM")
            )
            got = result.as_numpy("SUM")
            assert np.allclose(times * data * data, got), f"{side.name}: {value} -> {got}"
            answers.append(_http_answer(result, "SUM"))
    return answers


# The example sums into np.array([0]), INT64, for an output the config declares INT32: both
# servers answer the INT64 array as it is.
@pytest.mark.parametrize(
    ("model", "times"),
    [
        ("bls_decoupled_sync", 1),
        ("bls_decoupled_async", 2),
    ],
)
def test_bls_decoupled(examples: Pair, model: str, times: int) -> None:
    _same(examples, partial(_bls_decoupled, model, times))


def _stream(side: Side, requests: list[tuple[str, list[Any], list[Any]]], expect: int) -> Answer:
    """Send the (id, inputs, outputs) requests on one stream; collect `expect` responses."""
    received: queue.Queue[Any] = queue.Queue()
    by_id: dict[str, list[Answer]] = {}
    with _grpc(side) as client:
        client.start_stream(callback=lambda result, error: received.put(error or result))
        for request_id, inputs, outputs in requests:
            client.async_stream_infer(
                model_name=MODEL_OF[request_id[0]],
                inputs=inputs,
                request_id=request_id,
                outputs=outputs,
            )
        for _ in range(expect):
            item = received.get(timeout=30)
            if isinstance(item, InferenceServerException):
                raise item
            answer = _grpc_answer(item, "OUT")
            by_id.setdefault(item.get_response().id, []).append(answer)
        client.stop_stream()
    return by_id


MODEL_OF = {"s": "square_int32", "r": "repeat_int32"}


def _square(side: Side) -> Answer:
    values = [4, 2, 0, 1]
    requests = []
    for i, value in enumerate(values):
        inputs = [grpcclient.InferInput("IN", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([value], dtype=np.int32))
        requests.append((f"s{i}", inputs, _outputs(grpcclient, "OUT")))
    by_id = _stream(side, requests, sum(values))
    for i, value in enumerate(values):
        got = by_id.get(f"s{i}", [])
        assert len(got) == value, f"{side.name}: s{i} answered {len(got)} times"
        assert all(a["arrays"]["OUT"] == ("int32", [value]) for a in got), f"{side.name}: {got}"
    return by_id


def test_decoupled_square_int32(examples: Pair) -> None:
    _same(examples, _square)


def _repeat(side: Side) -> Answer:
    values, delays, wait = [4, 2, 0, 1], [1, 2, 3, 4], 5
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(delays)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait], dtype=np.uint32))
    by_id = _stream(side, [("r0", inputs, _outputs(grpcclient, "OUT", "IDX"))], len(values))
    got = [a["arrays"]["OUT"] for a in by_id["r0"]]
    assert got == [("int32", [v]) for v in values], f"{side.name}: {got}"
    return by_id


def test_decoupled_repeat_int32(examples: Pair) -> None:
    _same(examples, _repeat)


METRIC_LINES = (
    "# HELP requests_process_latency_ns Cumulative time spent processing requests",
    "# TYPE requests_process_latency_ns counter",
    'requests_process_latency_ns{model="custom_metrics",version="1"}',
)


@pytest.fixture(scope="module")
def scraped(examples: Pair) -> dict[str, str]:
    """Each side's metrics text after one request to the custom_metrics example."""
    texts = {}
    for side in (examples.triton, examples.agent):
        _add_sub_http("custom_metrics", side)
        url = f"http://127.0.0.1:{side.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            texts[side.name] = response.read().decode()
    return texts


@pytest.mark.parametrize("line", METRIC_LINES)
def test_custom_metrics(scraped: dict[str, str], line: str) -> None:
    assert line in scraped["triton"]  # the example client's own check, on Triton
    assert line in scraped["agent"]


def _instance_kind(side: Side) -> Answer:
    batch = np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    inputs = [httpclient.InferInput("INPUT", list(batch.shape), "FP32")]
    inputs[0].set_data_from_numpy(batch)
    with _http(side) as client:
        result = client.infer("resnet50", inputs, outputs=_outputs(httpclient, "OUTPUT", "DEVICE"))
    assert np.allclose(result.as_numpy("OUTPUT"), batch.sum(axis=(2, 3))), side.name
    assert result.as_numpy("DEVICE").tolist() == [[b"cpu:0"]] * 2, side.name
    return _http_answer(result, "OUTPUT", "DEVICE")


def test_instance_kind(examples: Pair) -> None:
    _same(examples, _instance_kind)


def _bls_error_codes(side: Side) -> Answer:
    received = {}
    with _http(side) as client:
        for code in (2, 3, 4, 5, 7):  # the example's: none is the default INTERNAL (1)
            inputs = [httpclient.InferInput("ERROR_CODE", [1], "INT32")]
            inputs[0].set_data_from_numpy(np.array([code], dtype=np.int32))
            result = client.infer("bls_error_caller", inputs)
            message = result.as_numpy("ERROR_MESSAGE")[0]
            received[code] = (int(result.as_numpy("RECEIVED_CODE")[0]), message.decode())
    return received


def test_bls_error_code(examples: Pair) -> None:
    _same(examples, _bls_error_codes)
