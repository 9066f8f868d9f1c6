"""The OpenAPI description (agent/api/openapi/) is valid and in step with the aiohttp router."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate

from agent.api.http.app import create_app
from agent.api.openapi import OpenApiMergeError, merge, openapi_document
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from tests.server import running_agent

_METHODS = {"get", "put", "post", "delete", "patch"}


def _router_operations() -> set[tuple[str, str]]:
    # The router is built from a data plane that is never called: only its routes are read.
    app = create_app(None, max_request_bytes=1)  # type: ignore[arg-type]
    ops = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue  # aiohttp adds HEAD to every GET
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert isinstance(path, str)
        ops.add((route.method.lower(), path))
    return ops


def _spec_operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method, path)
        for path, item in doc["paths"].items()
        for method in item
        if method in _METHODS
    }


def test_the_document_is_valid_openapi() -> None:
    validate(openapi_document())


def test_every_route_is_described_and_every_described_path_is_a_route() -> None:
    routes = _router_operations()
    described = _spec_operations(openapi_document())
    assert routes - described == set(), "routes missing from agent/api/openapi/"
    assert described - routes == set(), "described in agent/api/openapi/ but not routed"


def test_every_error_response_has_the_json_error_body() -> None:
    doc = openapi_document()
    shared = doc["components"]["responses"]
    for path, item in doc["paths"].items():
        for method in _METHODS & set(item):
            for status, entry in item[method]["responses"].items():
                if not status.startswith(("4", "5")):
                    continue
                response = shared[entry["$ref"].rsplit("/", 1)[1]] if "$ref" in entry else entry
                if (method, path, status) == ("get", "/v2/health/ready", "400"):
                    assert "content" not in response  # Triton's not ready: no body at all
                    continue
                if status == "503" and "Error" not in json.dumps(response):
                    continue  # the liveness probe: {"live": false}
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)


def test_path_parameters_are_declared_for_every_templated_path() -> None:
    doc = openapi_document()
    params = doc["components"]["parameters"]
    for path, item in doc["paths"].items():
        names = set(re.findall(r"{(\w+)}", path))
        declared = {params[p["$ref"].rsplit("/", 1)[1]]["name"] for p in item.get("parameters", [])}
        assert declared == names, path


def test_a_second_description_of_an_operation_is_refused() -> None:
    doc = openapi_document()
    part = {"paths": {"/v2": {"get": {"responses": {"200": {"description": "again"}}}}}}
    with pytest.raises(OpenApiMergeError, match="GET /v2 is already described"):
        merge(doc, part, "extra.json")


def test_a_component_redefined_differently_is_refused() -> None:
    doc = openapi_document()
    part = {"components": {"schemas": {"Error": {"type": "string"}}}}
    with pytest.raises(OpenApiMergeError, match="schemas/Error"):
        merge(doc, part, "extra.json")


def test_a_new_area_merges_alongside_the_others() -> None:
    doc = openapi_document()
    op = {"post": {"responses": {"200": {"description": "ok"}}}}
    merge(doc, {"paths": {"/v2/models/{model}/explain": op}}, "explain.json")
    assert doc["paths"]["/v2/models/{model}/explain"] == op
    assert "get" in doc["paths"]["/v2/models/{model}"]


def test_the_agent_serves_the_document(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(repository=tmp_path / "models"),
    )
    with running_agent(config) as agent:
        url = f"http://127.0.0.1:{agent.http_port}/v2/openapi.json"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.headers["Content-Type"].startswith("application/json")
            served = json.loads(response.read())
    assert served == openapi_document()
