"""Transport-agnostic server logic: health, metadata, config, repository index and inference.

HTTP (and later gRPC and MQTT) parse their own wire format into `agent.protocol` types, call this,
and serialize the result. Inference runs on the model's executor, never on the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent import __version__
from agent.errors import ModelNotReadyError
from agent.model_config import config_to_json
from agent.protocol import InferRequest, InferResponse, OutputTensor
from agent.registry import ModelRegistry

SERVER_NAME = "edge-agent"
EXTENSIONS = ("binary_tensor_data", "model_configuration", "model_repository", "parameters")


class DataPlane:
    """The agent's request handling, shared by every transport."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry
        self._ready = False

    def set_ready(self, ready: bool) -> None:
        """Ready once start-up loading is done; not ready again while shutting down."""
        self._ready = ready

    def server_live(self) -> bool:
        return True

    def server_ready(self) -> bool:
        return self._ready

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the addressed model version is READY (raises ModelNotFoundError if unknown)."""
        try:
            self._registry.resolve(name, version)
        except ModelNotReadyError:
            return False
        return True

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """KServe model metadata; -1 marks a dimension of any size."""
        served, _ = self._registry.resolve(name, version)
        sig = served.signature
        versions = [version] if version else [str(v) for v in sorted(served.backends)]
        return {
            "name": served.name,
            "versions": versions,
            "platform": served.config.platform,
            "inputs": [c.metadata(sig.batched) for c in sig.inputs.values()],
            "outputs": [c.metadata(sig.batched) for c in sig.outputs.values()],
        }

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        """The completed config in Triton's JSON form."""
        served, _ = self._registry.resolve(name, version)
        return config_to_json(served.config)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        rows = self._registry.index()
        if ready_only:
            rows = [r for r in rows if r.get("state") == "READY"]
        return rows

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse:
        """Validate a request against the model and run it on the model's executor.

        Raises:
            ModelNotFoundError, ModelNotReadyError: the model or version cannot serve.
            InvalidInputError: the request does not match the model.
            BackendError: the runtime failed.
        """
        served, number = self._registry.resolve(name, version)
        valid = served.signature.validate(request)
        backend = served.backends[number]
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(
            served.executor, backend.run, valid.feeds, valid.output_names
        )
        sig = served.signature
        outputs = tuple(
            OutputTensor(out_name, sig.outputs[out_name].datatype, sig.shape_output(out_name, data))
            for out_name, data in zip(valid.output_names, results, strict=True)
        )
        return InferResponse(served.name, str(number), outputs, request.id)
