"""`python -m bench.floor_server --port P`: the cheapest aiohttp server perf_analyzer can drive.

It answers the KServe routes perf_analyzer needs for the benchmark MLP (metadata, config, infer)
with fixed, precomputed bodies: an infer request is read in full and answered with the same
binary-tensor response every time. Its CPU per request is the floor for any aiohttp handler on
this machine, which `bench.cpu_per_request` puts next to the agent's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from aiohttp import web

MODEL = "mlp"
_OUTPUT_BYTES = bytes(4 * 10)  # FP32 [1, 10] zeros
_METADATA = json.dumps(
    {
        "name": MODEL,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 10]}],
    }
).encode()
_SERVER = json.dumps(
    {"name": "floor", "version": "0", "extensions": ["binary_tensor_data"]}
).encode()
_CONFIG = json.dumps(
    {
        "name": MODEL,
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": 32,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [64]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [10]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    }
).encode()
_HEADER = json.dumps(
    {
        "model_name": MODEL,
        "model_version": "1",
        "outputs": [
            {
                "name": "OUTPUT0",
                "datatype": "FP32",
                "shape": [1, 10],
                "parameters": {"binary_data_size": len(_OUTPUT_BYTES)},
            }
        ],
    },
    separators=(",", ":"),
).encode()
_INFER = _HEADER + _OUTPUT_BYTES
_INFER_HEADERS = {"Inference-Header-Content-Length": str(len(_HEADER))}


async def _metadata(request: web.Request) -> web.Response:
    return web.Response(body=_METADATA, content_type="application/json")


async def _server(request: web.Request) -> web.Response:
    return web.Response(body=_SERVER, content_type="application/json")


async def _config(request: web.Request) -> web.Response:
    return web.Response(body=_CONFIG, content_type="application/json")


async def _infer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(
        body=_INFER, content_type="application/octet-stream", headers=_INFER_HEADERS
    )


async def _ready(request: web.Request) -> web.Response:
    return web.Response()


def create_app() -> web.Application:
    app = web.Application()
    app.add_routes(
        [
            web.post(f"/v2/models/{MODEL}/infer", _infer),
            web.post(f"/v2/models/{MODEL}/versions/{{version}}/infer", _infer),
            web.get(f"/v2/models/{MODEL}", _metadata),
            web.get(f"/v2/models/{MODEL}/versions/{{version}}", _metadata),
            web.get(f"/v2/models/{MODEL}/config", _config),
            web.get(f"/v2/models/{MODEL}/ready", _ready),
            web.get("/v2", _server),
            web.get("/v2/health/ready", _ready),
            web.get("/v2/health/live", _ready),
        ]
    )
    return app


async def _serve(port: int) -> None:
    runner = web.AppRunner(create_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"listening on http://127.0.0.1:{bound}", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        import uvloop  # noqa: PLC0415 - the agent runs on uvloop too when it is installed
    except ImportError:
        asyncio.run(_serve(args.port))
        return 0
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
