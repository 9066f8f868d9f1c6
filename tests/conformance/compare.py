"""One request, sent to both servers, and the rule that judges the two answers.

A case is data: a `Http` or `Grpc` call and how to compare (`Case`). `check(case, triton, agent)`
sends the call to each side and asserts: the same status (HTTP status or gRPC code), Triton's
error text with at most our extra context after it, and equal bodies once the fields named in
`ignore` (volatile: timings, versions) are dropped.

A documented deviation (docs/api.md, "Differences from Triton") keeps its case: `deviation` says
why, and the case asserts Triton's answer is still what the table says (`triton_status`) and ours
is what we document (`agent_status`).
"""

from __future__ import annotations

import base64
import http.client
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format, message_factory

from agent.proto import grpc_service_pb2

JSON = Any
_SERVICE = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


@dataclass(frozen=True, slots=True)
class Http:
    """A raw HTTP request: a JSON body (`body`), raw bytes (`raw`) or a binary-data body."""

    method: str
    path: str
    body: JSON = None
    raw: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    binary: Sequence[bytes] = ()  # tensors after the JSON header (Inference-Header-Content-Length)

    def encode(self) -> tuple[bytes | None, dict[str, str]]:
        headers = dict(self.headers)
        if self.raw is not None:
            return self.raw, headers
        if self.body is None:
            return None, headers
        head = json.dumps(self.body).encode()
        if not self.binary:
            headers.setdefault("Content-Type", "application/json")
            return head, headers
        headers["Inference-Header-Content-Length"] = str(len(head))
        headers.setdefault("Content-Type", "application/octet-stream")
        return head + b"".join(self.binary), headers


@dataclass(frozen=True, slots=True)
class Grpc:
    """A gRPC call: `method` of GRPCInferenceService with the request as JSON (bytes: base64).
    `stream`: several requests on ModelStreamInfer."""

    method: str
    request: JSON = None
    stream: Sequence[JSON] = ()


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    area: str
    call: Http | Grpc
    ignore: tuple[str, ...] = ()  # keys dropped anywhere in both bodies before comparing
    text: bool = False  # compare the body as text (metrics lines, see `lines`)
    lines: Callable[[str], list[str]] | None = None  # text bodies: what to compare
    deviation: str = ""  # the reason, as docs/api.md's table gives it
    triton_status: int | str | None = None  # deviations: Triton's answer
    agent_status: int | str | None = None  # deviations: ours
    sort_key: str = ""  # lists in bodies compared as sets by this key (order not promised)
    metrics: bool = False  # sent to the metrics port
    known: str = ""  # a difference not fixed yet (the test is an xfail naming it)
    skip_rows: tuple[str, ...] = ()  # list items (by sort_key) of a documented deviation, dropped


@dataclass(slots=True)
class Reply:
    status: int | str  # HTTP status, or gRPC code name ("OK", "INVALID_ARGUMENT" ...)
    body: JSON  # parsed JSON, a list of them (streams), or text
    error: str | None  # the error text, when there is one


def _split_binary(data: bytes, header_len: int) -> JSON:
    head = json.loads(data[:header_len])
    rest = data[header_len:]
    for output in head.get("outputs", []):
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            output["binary"] = base64.b64encode(rest[:size]).decode()
            rest = rest[size:]
    return head


def send_http(port: int, call: Http) -> Reply:
    body, headers = call.encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(call.method, call.path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        header_len = response.getheader("Inference-Header-Content-Length")
    finally:
        conn.close()
    parsed: JSON
    if header_len is not None:
        parsed = _split_binary(data, int(header_len))
    else:
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = data.decode(errors="replace")
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return Reply(response.status, parsed, error if isinstance(error, str) else None)


def _message(name: str, request: JSON, output: bool = False) -> Any:
    method = _SERVICE.methods_by_name[name]
    kind = message_factory.GetMessageClass(method.output_type if output else method.input_type)
    return json_format.ParseDict(request or {}, kind())


def _to_json(message: Any) -> JSON:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def send_grpc(channel: grpc.Channel, call: Grpc) -> Reply:
    path = f"/inference.GRPCInferenceService/{call.method}"
    method = _SERVICE.methods_by_name[call.method]
    out_kind = message_factory.GetMessageClass(method.output_type)
    try:
        if call.stream:
            stub: Any = channel.stream_stream(
                path,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=out_kind.FromString,
            )
            requests = [_message(call.method, r) for r in call.stream]
            replies = [_to_json(m) for m in stub(iter(requests), timeout=60)]
            return Reply("OK", replies, None)
        unary: Any = channel.unary_unary(
            path,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=out_kind.FromString,
        )
        return Reply("OK", _to_json(unary(_message(call.method, call.request), timeout=60)), None)
    except grpc.RpcError as error:
        code = error.code()
        return Reply(code.name, None, error.details())


def _relative(value: JSON, prefix: str) -> JSON:
    if isinstance(value, str):
        return value.replace(prefix, "")
    if isinstance(value, dict):
        return {k: _relative(v, prefix) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, prefix) for v in value]
    return value


def _drop(value: JSON, ignore: tuple[str, ...], sort_key: str, skip: tuple[str, ...] = ()) -> JSON:
    if isinstance(value, dict):
        return {k: _drop(v, ignore, sort_key, skip) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        items = [_drop(v, ignore, sort_key, skip) for v in value]
        if sort_key and all(isinstance(v, dict) and sort_key in v for v in items):
            items = [v for v in items if v[sort_key] not in skip]
            items.sort(key=lambda v: json.dumps(v[sort_key], sort_keys=True))
        return items
    return value


def assert_same(case: Case, triton: Reply, agent: Reply, repo: str = "") -> None:
    """Assert the agent answered as Triton did (or as the deviation documents).

    `repo`: the repository folder; the agent names files relative to it in error texts (it
    never tells a client the device's paths: docs/api.md, "Differences from Triton")."""
    if repo:
        prefix = repo.rstrip("/") + "/"
        triton.body = _relative(triton.body, prefix)  # reasons in the repository index
        if triton.error is not None:
            triton.error = triton.error.replace(prefix, "")
    if case.deviation:
        assert triton.status == case.triton_status, (
            f"Triton no longer answers {case.triton_status}: {triton}"
        )
        assert agent.status == case.agent_status, f"documented {case.agent_status}, got {agent}"
        return
    assert agent.status == triton.status, f"status: triton {triton} / agent {agent}"
    if triton.error is not None:
        assert agent.error is not None, f"triton error {triton.error!r}, agent {agent}"
        assert agent.error.startswith(triton.error), (
            f"error text: triton {triton.error!r} / agent {agent.error!r}"
        )
        return
    if case.text:
        want = case.lines(triton.body) if case.lines else triton.body
        got = case.lines(agent.body) if case.lines else agent.body
        assert got == want, f"text: triton {want!r} / agent {got!r}"
        return
    want = _drop(triton.body, case.ignore, case.sort_key, case.skip_rows)
    got = _drop(agent.body, case.ignore, case.sort_key, case.skip_rows)
    if isinstance(want, list) and isinstance(got, list):  # streams: per-response error prefix
        want, got = _prefix_errors(want, got)
    assert got == want, f"body: triton {want!r} / agent {got!r}"


def _prefix_errors(want: list[JSON], got: list[JSON]) -> tuple[list[JSON], list[JSON]]:
    if len(want) != len(got):
        return want, got
    fixed = []
    for w, g in zip(want, got, strict=True):
        tw = w.get("error_message") if isinstance(w, dict) else None
        tg = g.get("error_message") if isinstance(g, dict) else None
        same = isinstance(tw, str) and isinstance(tg, str) and tg.startswith(tw)
        fixed.append({**g, "error_message": tw} if same else g)
    return want, fixed


@dataclass(frozen=True, slots=True)
class Side:
    """One server: its HTTP port and gRPC channel, and a hook to read what a call wrote."""

    name: str
    http_port: int
    channel: grpc.Channel
    metrics_port: int
    grpc_port: int = 0  # for clients that open their own channel (tritonclient)


def send(side: Side, call: Http | Grpc, metrics: bool = False) -> Reply:
    if isinstance(call, Grpc):
        return send_grpc(side.channel, call)
    return send_http(side.metrics_port if metrics else side.http_port, call)


def binary_fp32(values: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)
