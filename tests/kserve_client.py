"""KServe's Python SDK against a running agent; run with the interpreter of `.venv-kserve`.

    python tests/kserve_client.py HTTP_URL GRPC_HOST:PORT MODEL FACTOR

KServe's own clients (InferenceRESTClient, InferenceGRPCClient) check health, readiness and
inference with JSON and with binary tensors; metadata is read with the SDK's own REST data models
and gRPC stub, the Open Inference Protocol's definitions. MODEL takes X (FP32 [1, 4]) and answers
Y = FACTOR * X. Prints one line per check; exits non-zero on the first failure. It imports nothing
of the agent: the SDK's dependencies do not fit beside the agent's, so it runs in its own venv.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from typing import Any

try:  # all from the SDK's venv
    import grpc
    import numpy as np
    from kserve import (
        InferenceGRPCClient,
        InferenceRESTClient,
        InferInput,
        InferRequest,
        RESTConfig,
    )
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
    from kserve.protocol.rest.v2_datamodels import (
        ModelMetadataResponse,
        ModelReadyResponse,
        ServerLiveResponse,
        ServerMetadataResponse,
        ServerReadyResponse,
    )
except ImportError as exc:  # the venv is not there or broken: the test skips with this reason
    print(f"kserve cannot be imported: {exc}", flush=True)
    sys.exit(3)  # tests/agent/api/test_kserve_sdk.py reads this status as "skip"


def check(what: str, ok: bool, detail: object = "") -> None:
    if not ok:
        print(f"FAIL {what} {detail}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.loads(reply.read())


def request(model: str, x: np.ndarray, *, binary: bool) -> InferRequest:
    tensor = InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return InferRequest(model_name=model, infer_inputs=[tensor], request_id="kserve-sdk")


async def rest(url: str, model: str, x: np.ndarray, expected: np.ndarray) -> None:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    check("rest is_server_live", await client.is_server_live(url) is True)
    check("rest is_server_ready", await client.is_server_ready(url) is True)
    check("rest is_model_ready", await client.is_model_ready(url, model) is True)
    # Not ready is a 4xx (the protocol's words; Triton's 400): the SDK reads False.
    check("rest not ready", await client.is_model_ready(url, "no_such_model") is False)
    check(
        "rest version not ready", await client.is_model_ready(url, f"{model}/versions/9") is False
    )
    ServerLiveResponse.model_validate(get_json(f"{url}/v2/health/live"))
    ServerReadyResponse.model_validate(get_json(f"{url}/v2/health/ready"))
    ready = ModelReadyResponse.model_validate(get_json(f"{url}/v2/models/{model}/ready"))
    check("rest model ready body", ready.name == model and ready.ready, ready)
    server = ServerMetadataResponse.model_validate(get_json(f"{url}/v2"))
    check("rest server metadata", bool(server.name and server.version), server)
    meta = ModelMetadataResponse.model_validate(get_json(f"{url}/v2/models/{model}"))
    names = [t.name for t in meta.inputs], [t.name for t in meta.outputs]
    check("rest model metadata", meta.name == model and names == (["X"], ["Y"]), meta)
    for binary in (False, True):
        answer = await client.infer(url, request(model, x, binary=binary), model_name=model)
        got = answer.outputs[0].as_numpy()
        check(f"rest infer binary={binary}", np.allclose(got, expected), got)
    await client._client.aclose()  # the SDK offers no public close of its HTTP client


async def grpc_checks(url: str, model: str, x: np.ndarray, expected: np.ndarray) -> None:
    client = InferenceGRPCClient(url, retries=0, timeout=30)
    check("grpc is_server_live", await client.is_server_live() is True)
    check("grpc is_server_ready", await client.is_server_ready() is True)
    check("grpc is_model_ready", await client.is_model_ready(model) is True)
    check("grpc not ready", await client.is_model_ready("no_such_model") is False)
    answer = await client.infer(request(model, x, binary=True))
    got = answer.outputs[0].as_numpy()
    check("grpc infer", np.allclose(got, expected), got)
    await client.close()
    async with grpc.aio.insecure_channel(url) as channel:
        stub = GRPCInferenceServiceStub(channel)
        server = await stub.ServerMetadata(pb.ServerMetadataRequest())
        check("grpc server metadata", bool(server.name and server.version), server)
        meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name=model))
        names = [t.name for t in meta.inputs], [t.name for t in meta.outputs]
        check("grpc model metadata", meta.name == model and names == (["X"], ["Y"]), meta)


def main() -> None:
    http_url, grpc_url, model, factor = sys.argv[1:5]
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    expected = x * float(factor)
    asyncio.run(rest(http_url, model, x, expected))
    asyncio.run(grpc_checks(grpc_url, model, x, expected))
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
