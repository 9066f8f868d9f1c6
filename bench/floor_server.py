"""`python -m bench.floor_server --port P`: the cheapest aiohttp server perf_analyzer can drive.

It answers the KServe routes perf_analyzer needs for a benchmark model (metadata, config, infer;
`--model mlp`, the default, or `cnn`) with fixed, precomputed bodies: an infer request is read
in full and answered with the same binary-tensor response every time. Its CPU per request is
the floor for any aiohttp handler on this machine, which `bench.cpu_per_request` puts next to
the agent's (and `python -m bench` next to the agent's per CNN inference).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys

from aiohttp import web

from bench.models import MODELS, BenchModel

_SERVER = json.dumps(
    {"name": "floor", "version": "0", "extensions": ["binary_tensor_data"]}
).encode()


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class _Bodies:
    """The fixed answers for one benchmark model (bench.models): metadata, config, infer."""

    def __init__(self, model: BenchModel) -> None:
        self.name = model.served_name
        inputs, outputs = list(model.input_dims), list(model.output_dims)
        self.metadata = _json(
            {
                "name": self.name,
                "versions": ["1"],
                "platform": "onnxruntime_onnx",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, *inputs]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, *outputs]}],
            }
        )
        self.config = _json(
            {
                "name": self.name,
                "platform": "onnxruntime_onnx",
                "backend": "onnxruntime",
                "max_batch_size": 32,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": inputs}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": outputs}],
                "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
            }
        )
        output = bytes(4 * math.prod(outputs))  # FP32 zeros, batch 1
        header = _json(
            {
                "model_name": self.name,
                "model_version": "1",
                "outputs": [
                    {
                        "name": "OUTPUT0",
                        "datatype": "FP32",
                        "shape": [1, *outputs],
                        "parameters": {"binary_data_size": len(output)},
                    }
                ],
            }
        )
        self.infer = header + output
        self.infer_headers = {"Inference-Header-Content-Length": str(len(header))}


async def _server(request: web.Request) -> web.Response:
    return web.Response(body=_SERVER, content_type="application/json")


async def _ready(request: web.Request) -> web.Response:
    return web.Response()


def create_app(model: BenchModel = MODELS["mlp"]) -> web.Application:
    bodies = _Bodies(model)

    async def metadata(request: web.Request) -> web.Response:
        return web.Response(body=bodies.metadata, content_type="application/json")

    async def config(request: web.Request) -> web.Response:
        return web.Response(body=bodies.config, content_type="application/json")

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(
            body=bodies.infer, content_type="application/octet-stream", headers=bodies.infer_headers
        )

    name = bodies.name
    app = web.Application(client_max_size=64 * 1024 * 1024)  # a batch-32 CNN request: 19 MB
    app.add_routes(
        [
            web.post(f"/v2/models/{name}/infer", infer),
            web.post(f"/v2/models/{name}/versions/{{version}}/infer", infer),
            web.get(f"/v2/models/{name}", metadata),
            web.get(f"/v2/models/{name}/versions/{{version}}", metadata),
            web.get(f"/v2/models/{name}/config", config),
            web.get(f"/v2/models/{name}/ready", _ready),
            web.get("/v2", _server),
            web.get("/v2/health/ready", _ready),
            web.get("/v2/health/live", _ready),
        ]
    )
    return app


async def _serve(port: int, model: BenchModel) -> None:
    runner = web.AppRunner(create_app(model), access_log=None)
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
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    args = parser.parse_args()
    model = MODELS[args.model]
    try:
        import uvloop  # noqa: PLC0415 - the agent runs on uvloop too when it is installed
    except ImportError:
        asyncio.run(_serve(args.port, model))
        return 0
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(args.port, model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
