"""Triton's OpenTelemetry trace mode: spans exported over OTLP/HTTP to a collector.

The collector is a tiny OTLP/HTTP receiver on a free loopback port that decodes each
`POST /v1/traces` body with the protobuf messages of `opentelemetry-proto`.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from agent.cli.commands import build_parser
from agent.cli.serve_args import config_flags
from agent.config.choices import TraceMode
from agent.config.loader import load_config
from agent.config.schema import AgentConfig, LogConfig, ModelsConfig, ServerConfig, validate
from agent.errors import AgentConfigError
from agent.tracing.otlp import DEFAULT_RESOURCE, OtlpExporter, parse_resource
from agent.tracing.tracer import Trace, Tracer
from tests.server import agent_on_thread
from tests.trace_models import write_trace_children_repo

MODEL = "mlp_classifier"
ROOT_HTTP = ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"]
REQUEST = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
# W3C trace contexts a client's OpenTelemetry propagator would send: 00-trace id-span id-flags.
HTTP_PARENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"
GRPC_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
COMPUTE = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


class _Collector:
    """Every span received: dicts with the fields the assertions need."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.resources: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()

    def receive(self, path: str, body: bytes) -> None:
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        with self.lock:
            self.paths.append(path)
            for resource_spans in message.resource_spans:
                self.resources.append(_attributes(resource_spans.resource.attributes))
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "kind": span.kind,
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": _attributes(span.attributes),
                                "events": [(e.name, e.time_unix_nano) for e in span.events],
                            }
                        )


def _attributes(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        which = item.value.WhichOneof("value")
        out[item.key] = getattr(item.value, which) if which else None
    return out


@pytest.fixture
def collector() -> Iterator[tuple[_Collector, str]]:
    received = _Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            received.receive(self.path, body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _inputs(module: Any, rows: int) -> list[Any]:
    x = np.zeros((rows, 64), np.float32)
    inp = module.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def _names(events: list[tuple[str, int]]) -> list[str]:
    return [name for name, _ in events]


def test_spans_reach_the_collector(model_repo: Path, collector: tuple[_Collector, str]) -> None:
    received, endpoint = collector
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1, max_request_bytes=1 << 20),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
        log=LogConfig(
            trace_mode=TraceMode.OPENTELEMETRY,
            trace_otlp_url=endpoint,
            trace_otlp_resource=("service.name=edge-test", "test.key=test.value"),
        ),
    )
    with agent_on_thread(config) as running:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{running.agent.http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.agent.grpc_port}")
        served = http.get_model_metadata(MODEL)["versions"]
        settings = http.get_trace_settings()
        assert settings["trace_mode"] == "opentelemetry"
        assert settings["trace_level"] == ["OFF"]
        http.infer(MODEL, _inputs(httpclient, 1))  # tracing off: no span
        http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        http.infer(MODEL, _inputs(httpclient, 2), request_id="req-7")
        http.infer(MODEL, _inputs(httpclient, 1), headers={"traceparent": HTTP_PARENT})
        grpc.infer(MODEL, _inputs(grpcclient, 1), headers={"traceparent": GRPC_PARENT})
        grpc.close()
        http.close()
    # The agent's stop shut the provider down: every queued span was exported by then.
    assert set(received.paths) == {"/v1/traces"}
    assert received.resources
    for resource in received.resources:
        assert resource["service.name"] == "edge-test"
        assert resource["test.key"] == "test.value"
    spans = received.spans
    roots = [s for s in spans if s["name"] == "InferRequest"]
    assert len(roots) == 3  # the request sent before tracing was on is not there
    assert len(spans) == 9
    by_id = {s["span_id"]: s for s in spans}
    transports = []
    parents = {}
    for root in roots:
        parents[root["trace_id"]] = root["parent"]
        assert root["kind"] == 2  # SPAN_KIND_SERVER
        (model,) = [s for s in spans if s["parent"] == root["span_id"]]
        (compute,) = [s for s in spans if s["parent"] == model["span_id"]]
        assert model["name"] == MODEL
        assert compute["name"] == "compute"
        assert {model["trace_id"], compute["trace_id"]} == {root["trace_id"]}
        assert model["attributes"]["triton.model_name"] == MODEL
        assert str(model["attributes"]["triton.model_version"]) in served
        assert model["attributes"]["triton.trace_parent_id"] == 0
        assert model["attributes"]["triton.trace_id"] > 0
        assert _names(model["events"]) == REQUEST
        assert _names(compute["events"]) == COMPUTE
        transports.append(_names(root["events"]))
        # Timestamps: each span's events in order, inside the span, nested in its parent.
        for span in (root, model, compute):
            times = [ns for _, ns in span["events"]]
            assert times == sorted(times)
            assert span["start"] <= times[0]
            assert times[-1] <= span["end"]
            if span is not root:
                parent = by_id[span["parent"]]
                assert parent["start"] <= span["start"] <= span["end"] <= parent["end"]
        root_times = dict(root["events"])
        request_times = dict(model["events"])
        compute_times = dict(compute["events"])
        assert request_times["QUEUE_START"] <= compute_times["COMPUTE_START"]
        assert compute_times["COMPUTE_END"] <= request_times["REQUEST_END"]
        send = root_times.get("HTTP_SEND_START", root_times.get("GRPC_SEND_START", 0))
        assert request_times["REQUEST_END"] <= send
    assert sorted(transports) == sorted(
        [ROOT_HTTP, ROOT_HTTP, ["GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"]]
    )
    # The client's trace context: the request joins the client's trace, under the client's span.
    for header in (HTTP_PARENT, GRPC_PARENT):
        _, trace_id, span_id, _ = header.split("-")
        assert parents.pop(trace_id) == span_id
    assert list(parents.values()) == [""]  # no traceparent: a trace of its own
    request_ids = [s["attributes"].get("triton.request_id") for s in spans if s["name"] == MODEL]
    assert request_ids.count("req-7") == 1
    # Wall-clock nanoseconds (as OpenTelemetry has them), not the monotonic clock's.
    assert min(s["start"] for s in spans) > 1_600_000_000 * 10**9


def _pair(module: Any) -> list[Any]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        inputs.append(tensor)
    return inputs


def test_ensemble_steps_and_bls_calls_are_child_spans(
    tmp_path: Path, collector: tuple[_Collector, str]
) -> None:
    received, endpoint = collector
    repo = write_trace_children_repo(tmp_path / "models")
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=-1),
        models=ModelsConfig(repository=repo, intra_op_threads=1),
        log=LogConfig(trace_mode=TraceMode.OPENTELEMETRY, trace_otlp_url=endpoint),
    )
    with agent_on_thread(config) as running:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{running.agent.http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.agent.grpc_port}")
        http.update_trace_settings(
            settings={"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1"}
        )
        http.infer("ens", _pair(httpclient))
        grpc.infer("ens_bls", _pair(grpcclient), headers={"traceparent": GRPC_PARENT})
        grpc.close()
        http.close()
    spans = received.spans
    by_id = {s["span_id"]: s for s in spans}

    def children(span: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
        found = [s for s in spans if s["parent"] == span["span_id"]]
        return sorted(
            (s for s in found if name is None or s["name"] == name), key=lambda s: s["start"]
        )

    def tree(span: dict[str, Any]) -> Any:
        return [span["name"], [tree(child) for child in children(span)]]

    roots = {s["trace_id"]: s for s in spans if s["name"] == "InferRequest"}
    assert len(roots) == 2
    trees = sorted(tree(root) for root in roots.values())
    compute: list[Any] = ["compute", []]
    step: list[Any] = ["add_sub", [compute]]
    assert trees == [
        ["InferRequest", [["ens", [compute, step, step]]]],
        ["InferRequest", [["ens_bls", [compute, ["bls_traced", [compute, step]]]]]],
    ]
    for span in spans:
        assert span["trace_id"] in roots  # one trace per request, children included
        if span["name"] in ("InferRequest", "compute"):
            continue
        parent = by_id[span["parent"]]
        # A model span's triton.trace_parent_id is its parent model span's triton.trace_id.
        expected = parent["attributes"].get("triton.trace_id", 0)
        assert span["attributes"]["triton.trace_parent_id"] == expected
        assert parent["start"] <= span["start"] <= span["end"] <= parent["end"]
    (bls_root,) = [r for r in roots.values() if r["parent"]]
    assert bls_root["trace_id"] == GRPC_PARENT.split("-")[1]  # joined the client's trace


def test_a_late_child_span_still_joins_its_parent(collector: tuple[_Collector, str]) -> None:
    received, endpoint = collector
    exporter = OtlpExporter(endpoint)
    tracer = Tracer(mode="opentelemetry", exporter=exporter)
    tracer.update(None, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    parent = tracer.start("bls_traced")
    assert parent is not None
    child = tracer.spawn(parent, "add_sub")
    for name in ("HTTP_RECV_START", "REQUEST_START"):
        parent.stamp(name)
    child.stamp("REQUEST_START")
    for name in ("REQUEST_END", "HTTP_SEND_END"):
        parent.stamp(name)
    tracer.finish(parent)
    child.stamp("REQUEST_END")
    tracer.finish(child)  # after its parent was exported
    tracer.close()
    spans = {s["name"]: s for s in received.spans}
    assert set(spans) == {"InferRequest", "bls_traced", "add_sub"}
    assert spans["add_sub"]["parent"] == spans["bls_traced"]["span_id"]
    assert spans["add_sub"]["trace_id"] == spans["InferRequest"]["trace_id"]
    assert spans["add_sub"]["attributes"]["triton.trace_parent_id"] == parent.id


def test_tracer_hands_traces_to_the_exporter_only_in_opentelemetry_mode() -> None:
    class Sink:
        def __init__(self) -> None:
            self.traces: list[Trace] = []
            self.stopped = False

        def export(self, trace: Trace) -> None:
            self.traces.append(trace)

        def shutdown(self) -> None:
            self.stopped = True

    sink = Sink()
    tracer = Tracer(mode="opentelemetry", exporter=sink)
    assert tracer.settings()["trace_mode"] == "opentelemetry"
    assert not tracer.active  # level OFF
    tracer.update(None, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert tracer.active
    trace = tracer.start(MODEL)
    assert trace is not None
    tracer.finish(trace)
    assert sink.traces == [trace]
    tracer.close()
    assert sink.stopped
    idle = Tracer(mode="opentelemetry")
    idle.update(None, {"trace_level": ["TIMESTAMPS"]})
    assert not idle.active
    with pytest.raises(ValueError, match="unknown trace mode"):
        Tracer(mode="jaeger")


def test_resource_pairs() -> None:
    assert parse_resource([]) == DEFAULT_RESOURCE
    assert parse_resource(["service.name=a", "k=v=w"]) == {"service.name": "a", "k": "v=w"}
    with pytest.raises(ValueError, match="key"):
        parse_resource(["novalue"])


@pytest.mark.parametrize(
    ("log", "message"),
    [
        (LogConfig(trace_otlp_url="http://c:4318/v1/traces"), 'trace_mode = "opentelemetry"'),
        (LogConfig(trace_otlp_resource=("a=b",)), 'trace_mode = "opentelemetry"'),
        (
            LogConfig(trace_mode=TraceMode.OPENTELEMETRY, trace_otlp_url="c:4318"),
            "http:// or https://",
        ),
        (
            LogConfig(trace_mode=TraceMode.OPENTELEMETRY, trace_otlp_resource=("ab",)),
            "<key>=<value>",
        ),
        (
            LogConfig(trace_mode=TraceMode.OPENTELEMETRY, trace_file=Path("/tmp/t.json")),
            "log.trace_file is for",
        ),
    ],
)
def test_config_refuses(log: LogConfig, message: str) -> None:
    with pytest.raises(AgentConfigError, match=message):
        validate(AgentConfig(log=log), serving=False)


def test_cli_flags_reach_the_config() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--trace-mode",
            "opentelemetry",
            "--trace-otlp-url",
            "http://collector:4318/v1/traces",
            "--trace-otlp-resource",
            "service.name=edge",
            "--trace-otlp-resource",
            "site=7",
        ]
    )
    flags = config_flags(args)
    assert flags["log.trace_mode"] == "opentelemetry"
    assert flags["log.trace_otlp_url"] == "http://collector:4318/v1/traces"
    assert flags["log.trace_otlp_resource"] == ("service.name=edge", "site=7")


def test_toml_and_environment_reach_the_config(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        '[log]\ntrace_mode = "opentelemetry"\n'
        'trace_otlp_resource = ["service.name=edge", "site=7"]\n',
        encoding="utf-8",
    )
    env = {"EDGE_AGENT_LOG_TRACE_OTLP_URL": "https://collector:4318/v1/traces"}
    config = load_config(path, {}, env, serving=False)
    assert config.log.trace_mode == "opentelemetry"
    assert config.log.trace_otlp_url == "https://collector:4318/v1/traces"
    assert config.log.trace_otlp_resource == ("service.name=edge", "site=7")


def test_triton_mode_starts_no_opentelemetry(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from agent.config.schema import AgentConfig, LogConfig\n"
        "from agent.runtime.tracing import build_tracer\n"
        f"log = LogConfig(trace_file={str(tmp_path / 'trace.json')!r})\n"
        "tracer = build_tracer(AgentConfig(log=log))\n"
        "tracer.update(None, {'trace_level': ['TIMESTAMPS'], 'trace_rate': '1'})\n"
        "tracer.finish(tracer.start('m'))\n"
        "tracer.close()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout) == []
