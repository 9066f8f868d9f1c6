"""BLS with decoupled models, as Triton's python_backend has it, against a running agent.

`exec(decoupled=True)` / `await async_exec(decoupled=True)` give an iterator of responses ending
with the final flag; a decoupled model called without `decoupled=True` answers Triton's error.
The models are written to Triton's API; `streamer` is the decoupled test model
(`tests.decoupled_models`).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from agent.runtime.daemon import RunningAgent
from tests.decoupled_models import DECOUPLED_MODEL, decoupled_config
from tests.models import add_sub_model, write_model
from tests.python_models import write_python_model
from tests.server import explicit_agent
from tests.support import free_port

# Calls `streamer` (N responses; MODE 0: the final flag alone, 1: with the last response) and
# answers the sum of the OUT values, how many responses came, and whether the last was empty.
# CALL: 0 exec(decoupled=True), 1 exec() (Triton's error), 2 exec(decoupled=True) on add_sub.
BLS_SYNC = """
import numpy as np
import triton_python_backend_utils as pb_utils


def ints(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0])


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n, mode, call = ints(request, "N"), ints(request, "MODE"), ints(request, "CALL")
            if call == 2:
                x = np.ones(4, np.float32)
                got = list(pb_utils.InferenceRequest(
                    model_name="add_sub",
                    requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)],
                ).exec(decoupled=True))
                if got[0].has_error():
                    raise pb_utils.TritonModelException(got[0].error().message())
                out = pb_utils.get_output_tensor_by_name(got[0], "OUTPUT0")
                total = float(out.as_numpy().sum())
                responses.append(answer(total, len(got), False, ""))
                continue
            stream_request = pb_utils.InferenceRequest(
                model_name="streamer",
                requested_output_names=["OUT"],
                inputs=[
                    pb_utils.Tensor("N", np.array([[n]], np.int32)),
                    pb_utils.Tensor("MODE", np.array([[mode]], np.int32)),
                    pb_utils.Tensor("ERROR_AT", np.array([[-1]], np.int32)),
                ],
            )
            if call == 1:
                single = stream_request.exec()
                text = single.error().message() if single.has_error() else ""
                responses.append(answer(0.0, 0, False, text))
                continue
            total, count, last_empty = 0.0, 0, False
            for response in stream_request.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                count += 1
                last_empty = len(response.output_tensors()) == 0
                if not last_empty:
                    out = pb_utils.get_output_tensor_by_name(response, "OUT")
                    total += float(out.as_numpy().sum())
            responses.append(answer(total, count, last_empty, ""))
        return responses


def answer(total, count, last_empty, error):
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("SUM", np.array([total], np.float32)),
        pb_utils.Tensor("COUNT", np.array([count], np.int32)),
        pb_utils.Tensor("LAST_EMPTY", np.array([last_empty])),
        pb_utils.Tensor("ERROR", np.array([error.encode()], np.object_)),
    ])
"""

# Triton's async pattern: several async_exec(decoupled=True) gathered, then each iterated;
# one with `async for`, the others with `for`.
BLS_ASYNC = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().flat[0])
            awaits = [
                pb_utils.InferenceRequest(
                    model_name="streamer",
                    requested_output_names=["OUT"],
                    inputs=[
                        pb_utils.Tensor("N", np.array([[n + k]], np.int32)),
                        pb_utils.Tensor("MODE", np.array([[k % 2]], np.int32)),
                        pb_utils.Tensor("ERROR_AT", np.array([[-1]], np.int32)),
                    ],
                ).async_exec(decoupled=True)
                for k in range(3)
            ]
            iterators = await asyncio.gather(*awaits)
            first = 0
            async for response in iterators[0]:
                first += len(response.output_tensors())
            counts = [first]
            for iterator in iterators[1:]:
                counts.append(sum(len(r.output_tensors()) for r in iterator))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("COUNTS", np.array(counts, np.int32)),
            ]))
        return responses
"""

# A decoupled model making BLS calls: from `execute` (add_sub, blocking `exec`), then from its
# own thread once `execute` returned (streamer, `exec(decoupled=True)`), passing each on.
RELAY = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = np.full(4, 2.0, np.float32)
            first = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)],
            ).exec()
            if first.has_error():
                raise pb_utils.TritonModelException(first.error().message())
            total = int(pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy().sum())
            sender.send(pb_utils.InferenceResponse([out(total)]))
            returned = threading.Event()
            threading.Thread(target=self.later, args=(request, returned), daemon=True).start()
            returned.set()
        return None

    def later(self, request, returned):
        returned.wait()
        sender = request.get_response_sender()
        n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
        stream = pb_utils.InferenceRequest(
            model_name="streamer",
            requested_output_names=["OUT"],
            inputs=[
                pb_utils.Tensor("N", n),
                pb_utils.Tensor("MODE", np.zeros_like(n)),
                pb_utils.Tensor("ERROR_AT", np.full_like(n, -1)),
            ],
        )
        for response in stream.exec(decoupled=True):
            if response.has_error():
                sender.send(response)
            elif response.output_tensors():
                value = pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
                sender.send(pb_utils.InferenceResponse([out(100 + int(value.flat[0]))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def out(value):
    return pb_utils.Tensor("OUT", np.array([[value]], np.int32))
"""
RELAY_CONFIG = """
name: "relay" backend: "python" max_batch_size: 8
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def bls_config(name: str, inputs: tuple[str, ...], outputs: str) -> str:
    declared = ", ".join(f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ 1 ] }}' for n in inputs)
    return f"""
name: "{name}" backend: "python" max_batch_size: 0
input [ {declared} ]
output [ {outputs} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


SYNC_OUTPUTS = """{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "LAST_EMPTY" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] }"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("repo")
    markers = tmp_path_factory.mktemp("markers")
    write_python_model(repo, "streamer", DECOUPLED_MODEL, decoupled_config("streamer", markers))
    write_model(repo, "add_sub", add_sub_model())
    write_python_model(
        repo, "bls_sync", BLS_SYNC, bls_config("bls_sync", ("N", "MODE", "CALL"), SYNC_OUTPUTS)
    )
    counts = '{ name: "COUNTS" data_type: TYPE_INT32 dims: [ 3 ] }'
    write_python_model(repo, "bls_async", BLS_ASYNC, bls_config("bls_async", ("N",), counts))
    write_python_model(repo, "relay", RELAY, RELAY_CONFIG)
    with explicit_agent(repo, metrics_port=free_port()) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}") as c:
        yield c


def call(
    client: httpclient.InferenceServerClient, model: str, **values: int
) -> httpclient.InferResult:
    inputs = []
    for name, value in values.items():
        tensor = httpclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        inputs.append(tensor)
    return client.infer(model, inputs)


@pytest.mark.parametrize(("mode", "last_empty"), [(0, True), (1, False)])
def test_exec_decoupled_iterates_every_response_to_the_final_one(
    client: httpclient.InferenceServerClient, mode: int, last_empty: bool
) -> None:
    result = call(client, "bls_sync", N=4, MODE=mode, CALL=0)
    assert float(result.as_numpy("SUM")[0]) == 0 + 1 + 2 + 3
    # MODE 0 sends the final flag alone: it comes as a last, empty response.
    assert int(result.as_numpy("COUNT")[0]) == 4 + int(last_empty)
    assert bool(result.as_numpy("LAST_EMPTY")[0]) is last_empty


def test_exec_decoupled_with_no_response_but_the_final_flag(
    client: httpclient.InferenceServerClient,
) -> None:
    result = call(client, "bls_sync", N=0, MODE=0, CALL=0)
    assert int(result.as_numpy("COUNT")[0]) == 1
    assert bool(result.as_numpy("LAST_EMPTY")[0])


def test_exec_without_decoupled_on_a_decoupled_model_gives_tritons_error(
    client: httpclient.InferenceServerClient,
) -> None:
    result = call(client, "bls_sync", N=2, MODE=0, CALL=1)
    text = result.as_numpy("ERROR")[0].decode()
    assert text.startswith("Model streamer is using the decoupled. The current BLS request")
    assert "Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls" in text


def test_exec_decoupled_on_an_ordinary_model_gives_its_one_response(
    client: httpclient.InferenceServerClient,
) -> None:
    result = call(client, "bls_sync", N=0, MODE=0, CALL=2)
    assert int(result.as_numpy("COUNT")[0]) == 1
    assert float(result.as_numpy("SUM")[0]) == 8.0  # (1 + 1) * 4


def test_async_exec_decoupled_gathered_then_iterated(
    client: httpclient.InferenceServerClient,
) -> None:
    result = call(client, "bls_async", N=2)
    # streamer k: N = 2 + k responses with OUT; MODE k % 2 == 0 adds an empty final response.
    assert result.as_numpy("COUNTS").tolist() == [2, 3, 4]


def test_first_response_histogram_counts_each_decoupled_request(
    agent: RunningAgent, client: httpclient.InferenceServerClient
) -> None:
    family = "nv_inference_first_response_histogram_ms"

    def samples() -> dict[tuple[str, str, str], float]:
        """(sample name, model, le) -> value for Triton's first-response histogram."""
        url = f"http://127.0.0.1:{agent.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return {
            (s.name, s.labels["model"], s.labels.get("le", "")): s.value
            for metric in text_string_to_metric_families(text)
            if metric.name == family
            for s in metric.samples
        }

    before = samples().get((f"{family}_count", "streamer", ""), 0.0)
    for _ in range(3):
        call(client, "bls_sync", N=2, MODE=1, CALL=0)
    after = samples()
    assert after[(f"{family}_count", "streamer", "")] == before + 3
    assert after[(f"{family}_bucket", "streamer", "+Inf")] == before + 3
    assert {le for name, _, le in after if name.endswith("_bucket")} == {
        "100", "500", "2000", "5000", "+Inf",
    }  # fmt: skip
    assert after[(f"{family}_sum", "streamer", "")] > 0
    assert {model for _, model, _ in after} == {"streamer"}  # only decoupled models have one


def test_a_decoupled_model_makes_bls_calls_from_execute_and_after_it_returned(
    agent: RunningAgent,
) -> None:
    async def stream(n: int) -> list[Any]:
        url = f"http://127.0.0.1:{agent.http_port}/v2/models/relay/generate_stream"
        async with aiohttp.ClientSession() as session, session.post(url, json={"N": n}) as got:
            assert got.status == 200
            return [
                json.loads(line[len(b"data: ") :])
                async for line in got.content
                if line.startswith(b"data: ")
            ]

    async def main() -> list[list[Any]]:
        return await asyncio.gather(*(stream(n) for n in (2, 3, 0)))

    for n, events in zip((2, 3, 0), asyncio.run(main()), strict=True):
        assert [event["OUT"] for event in events] == [16] + [100 + i for i in range(n)]
