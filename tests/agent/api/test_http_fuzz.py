"""Schemathesis against the running agent, from the OpenAPI description it serves.

Every operation gets a bounded number of generated requests (valid and invalid per the schema,
some aimed at real models): none may crash the agent or get a 5xx other than a documented 503,
every error must be the documented JSON body, and every response must match its schema. The
agent must still answer a known-good inference afterwards. EDGE_AGENT_FUZZ_EXAMPLES=N runs N
examples per operation (default 10, derandomized; `make fuzz` runs a longer, random run).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agent.api.openapi import openapi_document
from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.models import build_test_repository
from tests.server import running_agent

_ENV = "EDGE_AGENT_FUZZ_EXAMPLES"
_DATATYPES = ("BOOL", "UINT8", "INT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BYTES")
_EXAMPLES = int(os.environ.get(_ENV, "10"))
_SCHEMA = schemathesis.openapi.from_dict(openapi_document())


def _operations() -> dict[str, schemathesis.APIOperation[Any, Any, Any, Any]]:
    found = {}
    for result in _SCHEMA.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # the description is broken: test_openapi.py says where
        found[result.ok().label] = result.ok()
    return found


_OPERATIONS = _operations()
# Real names, so that generated requests also reach the models behind the routes. Model control
# may load and unload these; "mlp_classifier" is left to the canary routes and the final check.
_MODELS = ("mixed_add", "identity_all", "flat")
_CANARY_MODEL = "mlp_classifier"
_INPUT_NAMES = ("A", "B", "X", "INPUT0", "IN_BYTES")
# Names that must not reach outside the repository (a 404, never a load from elsewhere).
_HOSTILE_MODELS = ("..", ".", "../..", ".hidden", "mixed_add/../flat")
# "²" is a digit to str.isdigit() but not to int().
_VERSIONS = ("1", "2", "\u00b2", "0", "01", "-1", "99999999999999999999")
# A shared-memory object and a region on it, registered at start, for the requests to aim at.
_SHM_KEY = f"/edge-agent-fuzz-{os.getpid()}"
_SHM_REGION = "fuzz"
_SHM_BYTES = 64
# An infer body, its headers and its media type.
_Body = tuple[Any, dict[str, str], str]
_COUNTS: dict[str, Counter[int]] = {}
_CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = build_test_repository(tmp_path_factory.mktemp("fuzz") / "models")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1, max_request_bytes=1 << 20),
        models=ModelsConfig(
            repository=repo,
            intra_op_threads=1,
            exit_on_error=False,
            control_mode=ModelControlMode.EXPLICIT,
            load_models=("*",),
        ),
    )
    shm = Path("/dev/shm") / _SHM_KEY.lstrip("/")
    shm.write_bytes(bytes(_SHM_BYTES))
    try:
        with running_agent(config) as running:
            base = f"http://127.0.0.1:{running.http_port}"
            logging_before = _get(base + "/v2/logging")
            register = {"key": _SHM_KEY, "offset": 0, "byte_size": _SHM_BYTES}
            _post(base + f"/v2/systemsharedmemory/region/{_SHM_REGION}/register", register)
            try:
                yield running
            finally:
                # /v2/logging sets this process's root logger: put it back for later tests.
                logging_before.pop("log_file")
                _post(base + "/v2/logging", logging_before)
    finally:
        shm.unlink()


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None or not _COUNTS:
        return
    with capture.global_and_fixture_disabled():  # shown without -s as well
        print(f"\nschemathesis examples per operation ({_ENV}={_EXAMPLES}):")
        for label, statuses in sorted(_COUNTS.items()):
            by_status = ", ".join(f"{k}: {n}" for k, n in sorted(statuses.items()))
            print(f"  {statuses.total():5d}  {label}  ({by_status})")


def _strategy(label: str) -> st.SearchStrategy[Any]:
    """Schemathesis' own cases (valid and invalid per the schema), then cases aimed at real
    models: those reach the decoders and the models, where random names stop at a 404."""
    op = _OPERATIONS[label]
    strategies = [op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE)]
    names = {p.name for p in op.path_parameters}
    if label.endswith("/register"):
        # (a URL cannot carry a lone surrogate: the client could not send it)
        regions = st.one_of(st.sampled_from([_SHM_REGION, "r1", "r2"]), st.text(max_size=4))
        strategies.append(
            st.tuples(regions, _register_bodies()).flatmap(
                lambda rb: op.as_strategy(path_parameters={"region": rb[0]}, body=rb[1])
            )
        )
    if "model" not in names:
        return st.one_of(strategies)
    models: tuple[str, ...] = (*_MODELS, *_HOSTILE_MODELS)
    if "canary" in label:
        models = (_CANARY_MODEL, *_MODELS)
    elif label.endswith("/infer"):
        models = ("mixed_add",)
    fixed = st.fixed_dictionaries(
        {"model": st.sampled_from(models)}
        | ({"version": st.sampled_from(_VERSIONS)} if "version" in names else {})
    )

    def cases(mode: GenerationMode) -> st.SearchStrategy[Any]:
        return fixed.flatmap(lambda p: op.as_strategy(mode, path_parameters=p))

    def with_body(params: dict[str, str], body: _Body) -> st.SearchStrategy[Any]:
        doc, headers, media_type = body
        return op.as_strategy(
            path_parameters=params, body=doc, headers=headers, media_type=media_type
        )

    strategies += [cases(mode) for mode in GenerationMode]
    if label.endswith("/infer"):
        bodies = st.one_of(_mixed_add_documents(), _binary_infer_bodies(), _infer_documents())
        strategies.append(st.tuples(fixed, bodies).flatmap(lambda pb: with_body(*pb)))
    return st.one_of(strategies)


# Text as JSON can carry it, lone surrogates ("\ud800") included.
_hostile_text = st.one_of(
    st.text(max_size=4), st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2)
)
_json_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    _hostile_text,
    st.none(),
)


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=5)


_tensor_data = st.recursive(_json_scalars, _nested, max_leaves=24)
_counts = st.one_of(st.integers(-1, _SHM_BYTES + 1), st.integers(-(2**70), 2**70))


def _register_bodies() -> st.SearchStrategy[dict[str, Any]]:
    keys = st.one_of(st.sampled_from([_SHM_KEY, "/", "/..", "//x", "/dev/shm/x"]), _hostile_text)
    return st.fixed_dictionaries({"key": keys, "byte_size": _counts}, optional={"offset": _counts})


@st.composite
def _input_tensor(draw: st.DrawFn) -> dict[str, Any]:
    shape = draw(st.lists(st.integers(min_value=0, max_value=6), min_size=0, max_size=3))
    return {
        "name": draw(st.sampled_from(_INPUT_NAMES)),
        "datatype": draw(st.sampled_from([*_DATATYPES, "BF16", "fp32", ""])),
        "shape": shape,
        "data": draw(_tensor_data),
    }


def _infer_documents() -> st.SearchStrategy[_Body]:
    """JSON requests with the models' input names and plausible, often wrong, tensors."""
    outputs = st.lists(
        st.fixed_dictionaries(
            {"name": st.sampled_from(("SUM", "DIFF", "Y", "OUTPUT0", "nope"))},
            optional={
                "parameters": st.fixed_dictionaries({}, optional={"binary_data": st.booleans()})
            },
        ),
        max_size=2,
    )
    doc = st.fixed_dictionaries(
        {"inputs": st.lists(_input_tensor(), min_size=1, max_size=3)},
        optional={
            "id": st.text(max_size=4),
            "outputs": outputs,
            "parameters": st.fixed_dictionaries(
                {},
                optional={
                    "binary_data_output": st.booleans(),
                    "priority": st.integers(-1, 2**64),
                    "timeout": st.integers(-1, 2**64),
                },
            ),
        },
    )
    return doc.map(lambda d: (d, {}, "application/json"))


@st.composite
def _mixed_add_documents(draw: st.DrawFn) -> _Body:
    """Requests for mixed_add (A: FP32 [n, 4], B: INT32 [n, 4]) right in form, with edge values."""
    rows = draw(st.integers(min_value=1, max_value=3))
    a = draw(
        st.lists(
            st.floats(width=32, allow_nan=False, allow_infinity=False),
            min_size=rows * 4,
            max_size=rows * 4,
        )
    )
    b = draw(st.lists(st.integers(-(2**31), 2**31), min_size=rows * 4, max_size=rows * 4))
    first: dict[str, Any] = {"name": "A", "datatype": "FP32", "shape": [rows, 4], "data": a}
    if draw(st.booleans()):  # A from the registered region instead
        del first["data"]
        first["parameters"] = {
            "shared_memory_region": draw(st.sampled_from([_SHM_REGION, "nope"])),
            "shared_memory_byte_size": draw(st.sampled_from([rows * 16, 16, 0, 65])),
            "shared_memory_offset": draw(_counts),
        }
    doc: dict[str, Any] = {
        "inputs": [
            first,
            {"name": "B", "datatype": "INT32", "shape": [rows, 4], "data": b},
        ],
        "outputs": [{"name": "SUM", "parameters": {"binary_data": draw(st.booleans())}}],
    }
    return doc, {}, "application/json"


@st.composite
def _binary_infer_bodies(draw: st.DrawFn) -> _Body:
    """Binary-extension requests for mixed_add: sizes that add up, or not; a header length that
    is right, or not."""
    sizes = [draw(st.sampled_from([16, 0, 4, 17, 32])) for _ in range(2)]
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": size},
                }
                for name, datatype, size in zip(("A", "B"), ("FP32", "INT32"), sizes, strict=True)
            ],
            "parameters": {"binary_data_output": draw(st.booleans())},
        }
    ).encode()
    raw = draw(
        st.binary(min_size=sum(sizes), max_size=sum(sizes) + draw(st.sampled_from([0, 0, 3])))
    )
    length = draw(st.sampled_from([len(header), len(header), len(header) - 1, len(header) + 1, -1]))
    return (
        header + raw,
        {"Inference-Header-Content-Length": str(length)},
        "application/octet-stream",
    )


def _documented_without_error_body(label: str, status: int) -> bool:
    """The probes' 503s: no body, or {"ready": false}, not the Error body."""
    response = _OPERATIONS[label].definition.raw["responses"].get(str(status), {})
    return "$ref" not in response and "Error" not in json.dumps(response)


# Triton answers a load of a model the repository does not have with INTERNAL (500) "failed to
# poll from model repository"; the agent matches it on purpose (agent/api/model_load.py).
_TRITON_500 = {"POST /v2/repository/models/{model}/load": "failed to poll from model repository"}


def _check_error_body(label: str, response: schemathesis.Response) -> None:
    status = response.status_code
    expected_500 = status == 500 and _TRITON_500.get(label, "\0") in response.text
    assert status < 500 or status == 503 or expected_500, f"{label}: {status} {response.text[:500]}"
    if status < 400 or _documented_without_error_body(label, status):
        return
    content_type = response.headers.get("content-type", [""])[0]
    assert content_type.startswith("application/json"), (label, status, response.text[:500])
    body = response.json()
    assert isinstance(body, dict), body
    assert set(body) == {"error"}, body
    assert isinstance(body["error"], str), body


@pytest.mark.parametrize("label", sorted(_OPERATIONS))
def test_operation_survives_generated_requests(agent: RunningAgent, label: str) -> None:
    base = f"http://127.0.0.1:{agent.http_port}"
    session = requests.Session()
    _COUNTS[label] = Counter()

    @hypothesis.settings(
        max_examples=_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=_ENV not in os.environ,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate, hypothesis.Phase.shrink],
    )
    @hypothesis.given(case=_strategy(label))
    def run(case: schemathesis.Case[Any]) -> None:
        response = case.call(base_url=base, session=session, timeout=30)
        _COUNTS[label][response.status_code] += 1
        hypothesis.note(f"reproduce with: {_curl(case)}")
        _check_error_body(label, response)
        case.validate_response(response, checks=_CHECKS)

    try:
        run()
    finally:
        session.close()


def test_agent_still_infers_after_the_run(agent: RunningAgent) -> None:
    # Named last in the file: pytest runs it after every fuzzed operation.
    base = f"http://127.0.0.1:{agent.http_port}"
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]
    }
    doc = _post(base + "/v2/models/mlp_classifier/versions/1/infer", body)
    assert doc["outputs"][0]["shape"] == [1, 10]
    assert len(doc["outputs"][0]["data"]) == 10


def _curl(case: schemathesis.Case[Any]) -> str:
    try:
        return case.as_curl_command()
    except UnicodeEncodeError:  # a lone surrogate in the path or a header
        return repr(case)


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def _post(url: str, doc: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
        return json.loads(body) if body else None
