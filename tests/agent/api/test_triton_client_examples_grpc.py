"""Triton's Python client examples over gRPC (`src/python/examples/simple_grpc_*.py`,
`grpc_client.py`, `grpc_explicit_*_content_client.py` and the gRPC runs of the protocol-neutral
ones), each rewritten as a test that makes the example's calls in its order and checks what it
checks, against stand-ins of the models it expects (tests/triton_example_models.py). One test
per example, named after it.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from agent.runtime.daemon import RunningAgent
from tests.triton_example_clients import (
    VALUES,
    check_add_sub,
    expected_sequences,
    key,
    reuse_infer_objects,
    run_sequences,
    string_inference,
    string_shm_tensors,
)
from tests.triton_example_models import MODEL_NAMES, example_agent, write_example_repository

EXTRA = ("simple_string_dyna_sequence", "densenet_onnx")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("examples") / "models"
    with example_agent(write_example_repository(repo, MODEL_NAMES + EXTRA)) as running:
        yield running


@pytest.fixture
def url(agent: RunningAgent) -> str:
    return f"localhost:{agent.grpc_port}"


@pytest.fixture
def client(url: str) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(url)
    try:
        yield c
    finally:
        c.close()


def simple_request(mod: Any = grpcclient) -> tuple[list[Any], list[Any], np.ndarray, np.ndarray]:
    """`simple`'s inputs as the examples fill them: 0..15 and ones."""
    in0 = np.expand_dims(np.arange(16, dtype=np.int32), axis=0)
    in1 = np.ones((1, 16), dtype=np.int32)
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    return inputs, outputs, in0, in1


def test_grpc_client(url: str) -> None:
    """The raw stubs: health, metadata, config, then an inference of `densenet_onnx`."""
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(service_pb2.ServerLiveRequest()).live
        assert stub.ServerReady(service_pb2.ServerReadyRequest()).ready
        ready = stub.ModelReady(service_pb2.ModelReadyRequest(name="densenet_onnx", version=""))
        assert ready.ready
        assert stub.ServerMetadata(service_pb2.ServerMetadataRequest()).name == "triton"
        meta = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="densenet_onnx"))
        assert meta.name == "densenet_onnx"
        config = stub.ModelConfig(service_pb2.ModelConfigRequest(name="densenet_onnx"))
        assert config.config.name == "densenet_onnx"
        request = service_pb2.ModelInferRequest(
            model_name="densenet_onnx", model_version="", id="my request id"
        )
        tensor = service_pb2.ModelInferRequest().InferInputTensor(
            name="data_0", datatype="FP32", shape=[3, 224, 224]
        )
        request.inputs.extend([tensor])
        request.outputs.extend(
            [service_pb2.ModelInferRequest().InferRequestedOutputTensor(name="fc6_1")]
        )
        request.raw_input_contents.extend([bytes(602112 * "a", "utf-8")])
        response = stub.ModelInfer(request)
        assert response.id == "my request id"
        assert [o.name for o in response.outputs] == ["fc6_1"]


def explicit_request(model: str, datatype: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for name in ("INPUT0", "INPUT1"):
        tensor = service_pb2.ModelInferRequest().InferInputTensor(
            name=name, datatype=datatype, shape=[1, 16]
        )
        request.inputs.extend([tensor])
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.extend(
            [service_pb2.ModelInferRequest().InferRequestedOutputTensor(name=name)]
        )
    return request


def test_grpc_explicit_byte_content_client(url: str) -> None:
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = explicit_request("simple_string", "BYTES")
        for i in range(16):
            request.inputs[0].contents.bytes_contents.append(str(i).encode("utf-8"))
            request.inputs[1].contents.bytes_contents.append(b"1")
        response = stub.ModelInfer(request)
        results = []
        for index, output in enumerate(response.outputs):
            values = utils.deserialize_bytes_tensor(response.raw_output_contents[index])
            results.append(np.resize(values, list(output.shape)))
        assert len(results) == 2
        for i in range(16):
            assert i + 1 == int(results[0][0][i])
            assert i - 1 == int(results[1][0][i])


@pytest.mark.parametrize(
    ("example", "model", "datatype", "dtype"),
    [
        ("grpc_explicit_int_content_client", "simple", "INT32", np.int32),
        ("grpc_explicit_int8_content_client", "simple_int8", "INT8", np.int8),
    ],
)
def test_grpc_explicit_int_content_clients(
    url: str, example: str, model: str, datatype: str, dtype: type
) -> None:
    in0 = list(range(16))
    in1 = [1] * 16
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = explicit_request(model, datatype)
        request.inputs[0].contents.int_contents[:] = in0
        request.inputs[1].contents.int_contents[:] = in1
        response = stub.ModelInfer(request)
        results = []
        for index, output in enumerate(response.outputs):
            values: np.ndarray = np.frombuffer(response.raw_output_contents[index], dtype=dtype)
            results.append(np.resize(values, list(output.shape)))
        assert len(results) == 2
        for i in range(16):
            assert in0[i] + in1[i] == results[0][0][i]
            assert in0[i] - in1[i] == results[1][0][i]
        if example == "grpc_explicit_int_content_client":
            # Half the input as raw bytes, half as contents: refused in Triton's words.
            mixed = explicit_request(model, datatype)
            mixed.raw_input_contents.extend([np.array(in0[0:8]).tobytes()])
            mixed.inputs[0].contents.int_contents[:] = in0[8:]
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(mixed)
            assert (
                "contents field must not be specified when using "
                "raw_input_contents for 'INPUT0' for model 'simple'" in str(err.value)
            )
        request.model_version = "wrong_specification"
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request)
        assert (
            "failed to get model version from specified version string 'wrong_specification'"
            in str(err.value)
        )


def test_simple_grpc_health_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live(headers={"test": "1", "dummy": "2"})
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.get_server_metadata().name == "triton"
    assert client.get_model_metadata("simple", headers={"test": "1", "dummy": "2"}).name == "simple"
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("wrong_model_name")
    assert "Request for unknown model" in str(err.value.message())
    assert client.get_model_config("simple").config.name == "simple"


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_simple_grpc_infer_client(
    client: grpcclient.InferenceServerClient, compression: str | None
) -> None:
    inputs, outputs, in0, in1 = simple_request()
    results = client.infer(
        model_name="simple",
        inputs=inputs,
        outputs=outputs,
        client_timeout=30,
        headers={"test": "1"},
        compression_algorithm=compression,
    )
    assert len(client.get_inference_statistics(model_name="simple").model_stats) == 1
    check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
    results = client.infer(
        model_name="simple", inputs=inputs, outputs=None, compression_algorithm=compression
    )
    check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))


def test_simple_grpc_aio_infer_client(url: str) -> None:
    async def run() -> None:
        client = aiogrpcclient.InferenceServerClient(url)
        try:
            inputs, outputs, in0, in1 = simple_request(aiogrpcclient)
            results = await client.infer(
                model_name="simple",
                inputs=inputs,
                outputs=outputs,
                client_timeout=30,
                headers={"test": "1"},
                compression_algorithm="gzip",
            )
            statistics = await client.get_inference_statistics(model_name="simple")
            assert len(statistics.model_stats) == 1
            check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
            first, second = await asyncio.gather(
                client.infer(model_name="simple", inputs=inputs, outputs=outputs),
                client.infer(model_name="simple", inputs=inputs, outputs=outputs),
            )
            for results in (first, second):
                check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
        finally:
            await client.close()

    asyncio.run(run())


def test_simple_grpc_async_infer_client(client: grpcclient.InferenceServerClient) -> None:
    inputs, outputs, in0, in1 = simple_request()
    completed: queue.Queue[Any] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        completed.put(error if error else result)

    client.async_infer(
        model_name="simple", inputs=inputs, callback=callback, outputs=outputs, client_timeout=30
    )
    result = completed.get(timeout=30)
    assert not isinstance(result, InferenceServerException), result
    check_add_sub(in0, in1, result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))


def infer_simple_with_header(client: grpcclient.InferenceServerClient) -> None:
    inputs, outputs, in0, in1 = simple_request()
    results = client.infer(
        model_name="simple", inputs=inputs, outputs=outputs, headers={"test": "1"}
    )
    check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))


def test_simple_grpc_custom_args_client(url: str) -> None:
    channel_args = [
        ("grpc.max_send_message_length", 1024 * 1024),
        ("grpc.max_receive_message_length", 1024 * 1024),
        ("grpc.keepalive_time_ms", 2**31 - 1),
        ("grpc.keepalive_timeout_ms", 20000),
        ("grpc.keepalive_permit_without_calls", False),
        ("grpc.http2.max_pings_without_data", 2),
        ("grpc.dns_enable_srv_queries", 1),
    ]
    with grpcclient.InferenceServerClient(url, channel_args=channel_args) as client:
        infer_simple_with_header(client)


def test_simple_grpc_keepalive_client(url: str) -> None:
    keepalive = grpcclient.KeepAliveOptions(
        keepalive_time_ms=2**31 - 1,
        keepalive_timeout_ms=20000,
        keepalive_permit_without_calls=False,
        http2_max_pings_without_data=2,
    )
    with grpcclient.InferenceServerClient(url, keepalive_options=keepalive) as client:
        infer_simple_with_header(client)


def grpc_identity(client: grpcclient.InferenceServerClient, data: np.ndarray) -> None:
    inputs = [grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")]
    inputs[0].set_data_from_numpy(data)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
    results = client.infer(model_name="simple_identity", inputs=inputs, outputs=outputs)
    if data.dtype == np.object_:
        assert np.array_equal(data, results.as_numpy("OUTPUT0"))
    else:
        assert np.array_equal(data, np.char.encode(results.as_numpy("OUTPUT0").astype(str)))


def test_simple_grpc_string_infer_client(client: grpcclient.InferenceServerClient) -> None:
    string_inference(client, grpcclient)
    grpc_identity(client, np.array([b"he\x00llo"] * 16, dtype=np.object_).reshape([1, 16]))
    grpc_identity(client, np.array([b"\x00\x01\x02\x03"] * 16, dtype=np.bytes_).reshape([1, 16]))


def test_simple_grpc_shm_client(client: grpcclient.InferenceServerClient) -> None:
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)
    size = in0.size * in0.itemsize
    out_handle = shm.create_shared_memory_region("output_data", key("g_output"), size * 2)
    in_handle = shm.create_shared_memory_region("input_data", key("g_input"), size * 2)
    try:
        client.register_system_shared_memory("output_data", key("g_output"), size * 2)
        shm.set_shared_memory_region(in_handle, [in0])
        shm.set_shared_memory_region(in_handle, [in1], offset=size)
        client.register_system_shared_memory("input_data", key("g_input"), size * 2)
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [
            grpcclient.InferRequestedOutput("OUTPUT0"),
            grpcclient.InferRequestedOutput("OUTPUT1"),
        ]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        results = client.infer(model_name="simple", inputs=inputs, outputs=outputs)
        out0, out1 = results.get_output("OUTPUT0"), results.get_output("OUTPUT1")
        assert out0 is not None
        assert out1 is not None
        out0_data = shm.get_contents_as_numpy(
            out_handle, utils.triton_to_np_dtype(out0.datatype), out0.shape
        )
        out1_data = shm.get_contents_as_numpy(
            out_handle, utils.triton_to_np_dtype(out1.datatype), out1.shape, offset=size
        )
        check_add_sub(in0, in1, out0_data, out1_data)
        assert client.get_system_shared_memory_status().regions  # the example prints it
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def test_simple_grpc_shm_string_client(client: grpcclient.InferenceServerClient) -> None:
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    expected_sum, expected_diff, tensors = string_shm_tensors()
    sizes = {name: utils.serialized_byte_size(t) for name, t in tensors.items()}
    handles = {n: shm.create_shared_memory_region(n, key(f"g_{n}"), sizes[n]) for n in tensors}
    try:
        for name in ("output0_data", "output1_data"):
            client.register_system_shared_memory(name, key(f"g_{name}"), sizes[name])
        for name in ("input0_data", "input1_data"):
            shm.set_shared_memory_region(handles[name], [tensors[name]])
            client.register_system_shared_memory(name, key(f"g_{name}"), sizes[name])
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "BYTES"),
            grpcclient.InferInput("INPUT1", [1, 16], "BYTES"),
        ]
        inputs[0].set_shared_memory("input0_data", sizes["input0_data"])
        inputs[1].set_shared_memory("input1_data", sizes["input1_data"])
        outputs = [
            grpcclient.InferRequestedOutput("OUTPUT0"),
            grpcclient.InferRequestedOutput("OUTPUT1"),
        ]
        outputs[0].set_shared_memory("output0_data", sizes["output0_data"])
        outputs[1].set_shared_memory("output1_data", sizes["output1_data"])
        results = client.infer(model_name="simple_string", inputs=inputs, outputs=outputs)
        got = []
        for name, region in (("OUTPUT0", "output0_data"), ("OUTPUT1", "output1_data")):
            output = results.get_output(name)
            assert output is not None
            dtype = utils.triton_to_np_dtype(output.datatype)
            got.append(shm.get_contents_as_numpy(handles[region], dtype, output.shape))
        for i in range(16):
            assert expected_sum[i] == got[0][0][i]
            assert expected_diff[i] == got[1][0][i]
        client.unregister_system_shared_memory()
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


def test_simple_grpc_custom_repeat(url: str) -> None:
    """The decoupled `repeat_int32`: one request on a stream, ten responses."""
    repeat_count, data_offset = 10, 100
    values = np.arange(data_offset, data_offset + repeat_count, dtype=np.int32)
    inputs = [
        grpcclient.InferInput("IN", [repeat_count], "INT32"),
        grpcclient.InferInput("DELAY", [repeat_count], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(np.ones([repeat_count], dtype=np.uint32) * 1000)
    inputs[2].set_data_from_numpy(np.array([1000], dtype=np.uint32))
    outputs = [grpcclient.InferRequestedOutput("OUT")]
    completed: queue.Queue[Any] = queue.Queue()
    results = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: completed.put(error or result))
        client.async_stream_infer(model_name="repeat_int32", inputs=inputs, outputs=outputs)
        for _ in range(repeat_count):
            item = completed.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item
            results.append(item.as_numpy("OUT"))
    expected = data_offset
    for result in results:
        assert len(result) == 1
        assert result[0] == expected
        expected += 1


def test_simple_grpc_model_control(tmp_path: Path) -> None:
    """Eight models in the repository, as the gRPC example counts; none loaded at start."""
    repo = write_example_repository(tmp_path / "models")
    with (
        example_agent(repo, load=()) as running,
        grpcclient.InferenceServerClient(f"localhost:{running.grpc_port}") as client,
    ):
        assert len(client.get_model_repository_index().models) == 8
        client.load_model("simple")
        assert client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as err:
            client.load_model(
                "simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}'
            )
        assert "failed to load" in str(err.value.message())
        client.load_model("simple", config='{"max_batch_size":"16"}')
        assert client.get_model_config("simple").config.max_batch_size == 16
        client.unload_model("simple")
        assert not client.is_model_ready("simple")
        # A file name longer than NAME_MAX: refused, and the server lives on.
        with pytest.raises(InferenceServerException) as err:
            client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
        assert err.value.status() == "StatusCode.INTERNAL"
        assert "failed to poll from model repository" in str(err.value.message())
        assert str(repo) not in str(err.value.message())
        assert client.is_server_live()
        with pytest.raises(InferenceServerException) as err:
            client.load_model("wrong_model_name")
        assert "failed to load" in str(err.value.message())


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_simple_grpc_sequence_sync_infer_client(
    client: grpcclient.InferenceServerClient, dyna: bool
) -> None:
    run_sequences(client, grpcclient, dyna)


def stream_requests(dyna: bool) -> tuple[list[dict[str, Any]], tuple[int, int, int | str]]:
    """The stream examples' three sequences as request keyword sets, ids "<sequence>_<n>"."""
    int_model = "simple_dyna_sequence" if dyna else "simple_sequence"
    string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
    ids: tuple[int, int, int | str] = (1000, 1001, "1002" if dyna else "a-uuid-like-id")
    requests = []
    for sequence_id, model, values in (
        (ids[0], int_model, [0, *VALUES]),
        (ids[1], int_model, [100] + [-v for v in VALUES]),
        (ids[2], string_model, [20] + [-v for v in VALUES]),
    ):
        for count, value in enumerate(values, start=1):
            data = np.full([1, 1], value, dtype=np.int32)
            inputs = [grpcclient.InferInput("INPUT", list(data.shape), "INT32")]
            inputs[0].set_data_from_numpy(data)
            requests.append(
                {
                    "model_name": model,
                    "inputs": inputs,
                    "outputs": [grpcclient.InferRequestedOutput("OUTPUT")],
                    "request_id": f"{sequence_id}_{count}",
                    "sequence_id": sequence_id,
                    "sequence_start": count == 1,
                    "sequence_end": count == len(values),
                }
            )
    return requests, ids


def check_stream_results(results: list[Any], dyna: bool, ids: tuple[int, int, int | str]) -> None:
    """Sort the responses by the sequence in their id, then compare as the examples do."""
    lists: dict[str, list[np.ndarray]] = {str(i): [] for i in ids}
    for result in results:
        assert not isinstance(result, InferenceServerException), result
        lists[result.get_response().id.split("_")[0]].append(result.as_numpy("OUTPUT"))
    seq0, seq1, text = (lists[str(i)] for i in ids)
    rows = zip(seq0, seq1, text, strict=True)
    got = [(int(a[0][0]), int(b[0][0]), int(c[0][0])) for a, b, c in rows]
    assert got == expected_sequences(dyna, ids, text)


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_simple_grpc_sequence_stream_infer_client(url: str, dyna: bool) -> None:
    requests, ids = stream_requests(dyna)
    completed: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(
            callback=partial(lambda q, result, error: q.put(error or result), completed),
            stream_timeout=30,
        )
        for request in requests:
            client.async_stream_infer(**request)
        results = [completed.get(timeout=30) for _ in requests]
    check_stream_results(results, dyna, ids)


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_simple_grpc_aio_sequence_stream_infer_client(url: str, dyna: bool) -> None:
    requests, ids = stream_requests(dyna)

    async def run() -> list[Any]:
        async with aiogrpcclient.InferenceServerClient(url) as client:

            async def request_iterator() -> AsyncIterator[dict[str, Any]]:
                for request in requests:
                    yield request

            results = []
            async for result, error in client.stream_infer(
                inputs_iterator=request_iterator(), stream_timeout=30
            ):
                results.append(error or result)
            return results

    results = asyncio.run(run())
    assert len(results) == len(requests)
    check_stream_results(results, dyna, ids)


def test_memory_growth_test_grpc(url: str) -> None:
    data = np.expand_dims(np.arange(16, dtype=np.int32), axis=0)
    for _ in range(20):  # the example's 100 by default; each with a new client
        with grpcclient.InferenceServerClient(url) as client:
            inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(data)
            results = client.infer(
                model_name="custom_identity_int32",
                inputs=inputs,
                outputs=[grpcclient.InferRequestedOutput("OUTPUT0")],
            )
            out = results.as_numpy("OUTPUT0")
            assert out.dtype == data.dtype
            assert out.shape == data.shape
            assert np.array_equal(out, data)


def test_reuse_infer_objects_client_grpc(client: grpcclient.InferenceServerClient) -> None:
    reuse_infer_objects(client, grpcclient, "grpc")
