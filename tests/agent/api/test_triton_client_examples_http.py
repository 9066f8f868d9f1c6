"""Triton's Python client examples over HTTP (`src/python/examples/simple_http_*.py` and the HTTP
runs of the protocol-neutral ones), each rewritten as a test that makes the example's calls in its
order and checks what it checks, against stand-ins of the models it expects
(tests/triton_example_models.py). One test per example, named after it.

Shared-memory keys carry the process id, so that parallel runs do not share regions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from agent.runtime.daemon import RunningAgent
from tests.triton_example_clients import (
    check_add_sub,
    key,
    reuse_infer_objects,
    run_sequences,
    string_inference,
    string_shm_tensors,
)
from tests.triton_example_models import MODEL_NAMES, example_agent, write_example_repository

EXTRA = ("simple_string_dyna_sequence",)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = write_example_repository(
        tmp_path_factory.mktemp("examples") / "models", MODEL_NAMES + EXTRA
    )
    with example_agent(repo) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(f"localhost:{agent.http_port}")
    try:
        yield c
    finally:
        c.close()


def simple_inputs(
    in0: np.ndarray, in1: np.ndarray, mod: Any = httpclient
) -> list[httpclient.InferInput]:
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(in0, binary_data=False)
    inputs[1].set_data_from_numpy(in1, binary_data=True)
    return inputs


def test_simple_http_health_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live(query_params={"test_1": 1, "test_2": 2})
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.get_server_metadata()["name"] == "triton"
    metadata = client.get_model_metadata("simple", query_params={"test_1": 1, "test_2": 2})
    assert metadata["name"] == "simple"
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("wrong_model_name")
    assert "Request for unknown model" in str(err.value.message())


@pytest.mark.parametrize(
    ("request_compression", "response_compression", "headers"),
    [(None, None, None), ("gzip", "deflate", {"X-Test": "1"}), ("deflate", "gzip", None)],
)
def test_simple_http_infer_client(
    client: httpclient.InferenceServerClient,
    request_compression: str | None,
    response_compression: str | None,
    headers: dict[str, str] | None,
) -> None:
    in0 = np.expand_dims(np.arange(16, dtype=np.int32), axis=0)
    in1 = np.full((1, 16), -1, dtype=np.int32)
    options: dict[str, Any] = {
        "query_params": {"test_1": 1, "test_2": 2},
        "headers": headers,
        "request_compression_algorithm": request_compression,
        "response_compression_algorithm": response_compression,
    }
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    results = client.infer("simple", simple_inputs(in0, in1), outputs=outputs, **options)
    statistics = client.get_inference_statistics(model_name="simple", headers=headers)
    assert len(statistics["model_stats"]) == 1
    check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
    # No outputs named: all of them come back.
    results = client.infer("simple", simple_inputs(in0, in1), outputs=None, **options)
    check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
    with pytest.raises(InferenceServerException) as err:
        client.infer("wrong_model_name", simple_inputs(in0, in1), outputs=outputs, **options)
    assert str(err.value.message()).startswith("Request for unknown model")


def test_simple_http_aio_infer_client(agent: RunningAgent) -> None:
    async def run() -> None:
        client = aiohttpclient.InferenceServerClient(f"localhost:{agent.http_port}")
        try:
            in0 = np.expand_dims(np.arange(16, dtype=np.int32), axis=0)
            in1 = np.full((1, 16), -1, dtype=np.int32)

            async def infer(model: str, outputs: bool) -> Any:
                requested = None
                if outputs:
                    requested = [
                        aiohttpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                        aiohttpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
                    ]
                return await client.infer(
                    model,
                    simple_inputs(in0, in1, aiohttpclient),
                    outputs=requested,
                    query_params={"test_1": 1, "test_2": 2},
                    request_compression_algorithm="gzip",
                    response_compression_algorithm="gzip",
                )

            results = await infer("simple", True)
            statistics = await client.get_inference_statistics(model_name="simple")
            assert len(statistics["model_stats"]) == 1
            check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
            results = await infer("simple", False)
            check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
            with pytest.raises(InferenceServerException) as err:
                await infer("wrong_model_name", True)
            assert str(err.value.message()).startswith("Request for unknown model")
            # Two requests at once.
            first, second = await asyncio.gather(infer("simple", True), infer("simple", True))
            for results in (first, second):
                check_add_sub(in0, in1, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
        finally:
            await client.close()

    asyncio.run(run())


def test_simple_http_async_infer_client(agent: RunningAgent) -> None:
    request_count = 2
    client = httpclient.InferenceServerClient(
        f"localhost:{agent.http_port}", concurrency=request_count
    )
    try:
        in0 = np.expand_dims(np.arange(16, dtype=np.int32), axis=0)
        in1 = np.ones((1, 16), dtype=np.int32)
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(in0, binary_data=True)
        inputs[1].set_data_from_numpy(in1, binary_data=True)
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
        ]
        pending = [
            client.async_infer(model_name="simple", inputs=inputs, outputs=outputs)
            for _ in range(request_count)
        ]
        for request in pending:
            result = request.get_result()
            check_add_sub(in0, in1, result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))
    finally:
        client.close()


def http_identity(client: httpclient.InferenceServerClient, data: np.ndarray, binary: bool) -> None:
    inputs = [httpclient.InferInput("INPUT0", list(data.shape), "BYTES")]
    inputs[0].set_data_from_numpy(data, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    results = client.infer(model_name="simple_identity", inputs=inputs, outputs=outputs)
    if data.dtype != np.object_:  # np.bytes_: compared as the encoded text of the answer
        encoded = np.char.encode(results.as_numpy("OUTPUT0").astype(str))
        assert np.array_equal(data, encoded)
    elif binary:
        assert np.array_equal(data, results.as_numpy("OUTPUT0"))
    else:  # JSON answers strings: the example compares their UTF-8 bytes
        got = [bytes(str(x), encoding="utf-8") for x in results.as_numpy("OUTPUT0").flatten()]
        assert np.array_equal(data, np.array(got, dtype=object).reshape([1, 16]))


def test_simple_http_string_infer_client(client: httpclient.InferenceServerClient) -> None:
    string_inference(client, httpclient)
    null_chars = np.array([b"he\x00llo" for _ in range(16)], dtype=np.object_).reshape([1, 16])
    http_identity(client, null_chars, True)
    http_identity(client, null_chars, False)
    raw = np.array([b"\x00\x01\x02\x03" for _ in range(16)], dtype=np.bytes_).reshape([1, 16])
    http_identity(client, raw, True)
    http_identity(client, raw, False)


def test_simple_http_shm_client(client: httpclient.InferenceServerClient) -> None:
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)
    size = in0.size * in0.itemsize
    out_handle = shm.create_shared_memory_region("output_data", key("output_simple"), size * 2)
    in_handle = shm.create_shared_memory_region("input_data", key("input_simple"), size * 2)
    try:
        client.register_system_shared_memory("output_data", key("output_simple"), size * 2)
        shm.set_shared_memory_region(in_handle, [in0])
        shm.set_shared_memory_region(in_handle, [in1], offset=size)
        client.register_system_shared_memory("input_data", key("input_simple"), size * 2)
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
        ]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        results = client.infer(model_name="simple", inputs=inputs, outputs=outputs)
        out0, out1 = results.get_output("OUTPUT0"), results.get_output("OUTPUT1")
        assert out0 is not None
        assert out1 is not None
        out0_data = shm.get_contents_as_numpy(
            out_handle, utils.triton_to_np_dtype(out0["datatype"]), out0["shape"]
        )
        out1_data = shm.get_contents_as_numpy(
            out_handle, utils.triton_to_np_dtype(out1["datatype"]), out1["shape"], offset=size
        )
        check_add_sub(in0, in1, out0_data, out1_data)
        assert client.get_system_shared_memory_status()  # the example prints it
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def test_simple_http_shm_string_client(client: httpclient.InferenceServerClient) -> None:
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    expected_sum, expected_diff, tensors = string_shm_tensors()
    sizes = {name: utils.serialized_byte_size(t) for name, t in tensors.items()}
    handles = {
        name: shm.create_shared_memory_region(name, key(name), sizes[name]) for name in tensors
    }
    try:
        for name in ("output0_data", "output1_data"):
            client.register_system_shared_memory(name, key(name), sizes[name])
        for name in ("input0_data", "input1_data"):
            shm.set_shared_memory_region(handles[name], [tensors[name]])
            client.register_system_shared_memory(name, key(name), sizes[name])
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "BYTES"),
            httpclient.InferInput("INPUT1", [1, 16], "BYTES"),
        ]
        inputs[0].set_shared_memory("input0_data", sizes["input0_data"])
        inputs[1].set_shared_memory("input1_data", sizes["input1_data"])
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
        ]
        outputs[0].set_shared_memory("output0_data", sizes["output0_data"])
        outputs[1].set_shared_memory("output1_data", sizes["output1_data"])
        results = client.infer(model_name="simple_string", inputs=inputs, outputs=outputs)
        out0, out1 = results.get_output("OUTPUT0"), results.get_output("OUTPUT1")
        assert out0 is not None
        assert out1 is not None
        out0_data = shm.get_contents_as_numpy(
            handles["output0_data"], utils.triton_to_np_dtype(out0["datatype"]), out0["shape"]
        )
        out1_data = shm.get_contents_as_numpy(
            handles["output1_data"], utils.triton_to_np_dtype(out1["datatype"]), out1["shape"]
        )
        for i in range(16):
            assert expected_sum[i] == out0_data[0][i]
            assert expected_diff[i] == out1_data[0][i]
        client.unregister_system_shared_memory()
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_simple_http_sequence_sync_infer_client(
    client: httpclient.InferenceServerClient, dyna: bool
) -> None:
    run_sequences(client, httpclient, dyna)


def test_memory_growth_test_http(agent: RunningAgent) -> None:
    data = np.expand_dims(np.arange(16, dtype=np.int32), axis=0)
    for _ in range(20):  # the example's 100 by default; each with a new client
        client = httpclient.InferenceServerClient(f"localhost:{agent.http_port}")
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(data)
        results = client.infer(
            model_name="custom_identity_int32",
            inputs=inputs,
            outputs=[httpclient.InferRequestedOutput("OUTPUT0")],
        )
        out = results.as_numpy("OUTPUT0")
        assert out.dtype == data.dtype
        assert out.shape == data.shape
        assert np.array_equal(out, data)
        client.close()


def test_reuse_infer_objects_client_http(client: httpclient.InferenceServerClient) -> None:
    reuse_infer_objects(client, httpclient, "http")


def test_simple_http_model_control(tmp_path: Path) -> None:
    """Seven models in the repository, as the HTTP example counts; none loaded at start."""
    repo = write_example_repository(tmp_path / "models", MODEL_NAMES[:7])
    with example_agent(repo, load=()) as running:
        client = httpclient.InferenceServerClient(f"localhost:{running.http_port}")
        try:
            assert len(client.get_model_repository_index()) == 7
            client.load_model("simple")
            assert client.is_model_ready("simple")
            # A config that is not JSON: Triton fails the load.
            with pytest.raises(InferenceServerException) as err:
                client.load_model(
                    "simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}'
                )
            assert "failed to load" in str(err.value.message())
            client.load_model("simple", config='{"max_batch_size":"16"}')
            assert client.get_model_config("simple")["max_batch_size"] == 16
            client.unload_model("simple")
            assert not client.is_model_ready("simple")
            with pytest.raises(InferenceServerException) as err:
                client.load_model("wrong_model_name")
            assert "failed to load" in str(err.value.message())
        finally:
            client.close()
