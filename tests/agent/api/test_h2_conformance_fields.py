"""HTTP/2 conformance of the loop gRPC engine, part 2: RFC 9113 §8 (HTTP message semantics and
fields), RFC 7541 (HPACK) and gRPC's mapping onto HTTP/2, over real sockets against a running
engine. Part 1 (`test_h2_conformance.py`) has the framing; its docstring lists what a gRPC-only
server leaves out.

A malformed request (§8.1.1) is a stream error of type PROTOCOL_ERROR and the connection goes
on; a header block HPACK cannot decode is a connection error of type COMPRESSION_ERROR (the
decoding state is lost). Not checked (a SHOULD): that Host and :authority agree (§8.3.1).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import hpack
import pytest

from tests import h2_client as h
from tests.h2_client import H2Client
from tests.h2_probe import ECHO, HOLD, METADATA, STREAM, Probe, probe_server

FieldList = list[tuple[bytes, bytes]]


@pytest.fixture(scope="module")
def probe() -> Iterator[Probe]:
    with probe_server() as running:
        yield running


@pytest.fixture
def conn(probe: Probe) -> Iterator[H2Client]:
    client = H2Client(probe.port)
    client.handshake()
    yield client
    client.close()


def request(path: str = ECHO, **extra: str) -> FieldList:
    return [(k.encode(), v.encode()) for k, v in h.request_fields(path, **extra)]


def send_call(conn: H2Client, sid: int, fields: FieldList, body: bytes = b"hello") -> None:
    conn.send(h.frame(h.HEADERS, h.END_HEADERS, sid, conn.block(fields)))
    conn.send(h.frame(h.DATA, h.END_STREAM, sid, h.grpc_message(body)))


def answered(conn: H2Client, sid: int, body: bytes = b"hello") -> dict[str, str]:
    """The call on `sid` was served with an OK status and `body`; its response headers."""
    headers, data, trailers = conn.response(sid)
    assert trailers["grpc-status"] == "0", trailers
    assert data == h.grpc_message(body)
    return headers


def metadata_of(conn: H2Client, sid: int, fields: FieldList) -> dict[str, str]:
    """What the Metadata method saw of a request with `fields`."""
    send_call(conn, sid, fields, b"")
    _, data, trailers = conn.response(sid)
    assert trailers["grpc-status"] == "0", trailers
    return dict(json.loads(data[5:]))


# §8.1 Request exchange -------------------------------------------------------------------------


def test_8_1_a_second_headers_without_end_stream_is_malformed(conn: H2Client) -> None:
    conn.send(h.frame(h.HEADERS, h.END_HEADERS, 1, conn.block(request(HOLD))))
    conn.send(h.frame(h.HEADERS, h.END_HEADERS, 1, conn.block([(b"x-more", b"1")])))
    conn.stream_error(1, h.PROTOCOL_ERROR)


def test_8_1_trailers_with_a_pseudo_header_are_malformed(conn: H2Client) -> None:
    conn.send(h.frame(h.HEADERS, h.END_HEADERS, 1, conn.block(request(HOLD))))
    trailers = conn.block([(b":path", b"/x"), (b"x-t", b"1")])
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 1, trailers))
    conn.stream_error(1, h.PROTOCOL_ERROR)


@pytest.mark.parametrize(
    ("declared", "served"),
    [("10", True), ("11", False), ("9", False), ("ten", False)],
    ids=["equal", "more-than-sent", "less-than-sent", "not-a-number"],
)
def test_8_1_1_content_length_must_match_the_data(
    conn: H2Client, declared: str, served: bool
) -> None:
    send_call(conn, 1, request(**{"content-length": declared}))  # 5 + len("hello") = 10
    if served:
        answered(conn, 1)
    else:
        conn.stream_error(1, h.PROTOCOL_ERROR)


# §8.2 Fields -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (b"X-Upper", b"1"),
        (b"x y", b"1"),
        (b"x:y", b"1"),
        (b"x\x7f", b"1"),
        (b"", b"no name"),
        (b"x-v", b"a\r\nb"),
        (b"x-v", b"a\x00b"),
        (b"x-v", b" leading"),
        (b"x-v", b"trailing\t"),
    ],
    ids=[
        "upper-case-name",
        "space-in-name",
        "colon-in-name",
        "del-in-name",
        "empty-name",
        "crlf-in-value",
        "nul-in-value",
        "leading-space",
        "trailing-tab",
    ],
)
def test_8_2_1_an_invalid_field_is_malformed(conn: H2Client, name: bytes, value: bytes) -> None:
    send_call(conn, 1, [*request(), (name, value)])
    conn.stream_error(1, h.PROTOCOL_ERROR)
    send_call(conn, 3, request())  # the connection and its HPACK state go on
    answered(conn, 3)


def test_8_2_1_values_may_hold_any_other_octet(conn: H2Client) -> None:
    fields = [*request(METADATA), (b"x-obs", b"caf\xe9 \x01inner\ttab"), (b"x-empty", b"")]
    seen = metadata_of(conn, 1, fields)
    assert seen["x-obs"] == "caf\xe9 \x01inner\ttab"
    assert seen["x-empty"] == ""


@pytest.mark.parametrize(
    "name", [b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"]
)
def test_8_2_2_a_connection_specific_field_is_malformed(conn: H2Client, name: bytes) -> None:
    send_call(conn, 1, [*request(), (name, b"x")])
    conn.stream_error(1, h.PROTOCOL_ERROR)


def test_8_2_2_te_other_than_trailers_is_malformed(conn: H2Client) -> None:
    fields = [(k, b"trailers, gzip" if k == b"te" else v) for k, v in request()]
    send_call(conn, 1, fields)
    conn.stream_error(1, h.PROTOCOL_ERROR)


# §8.3 Pseudo-header fields ----------------------------------------------------------------------


def _without(name: bytes) -> FieldList:
    return [(k, v) for k, v in request() if k != name]


def _twice(name: bytes) -> FieldList:
    fields = request()
    at = next(i for i, (k, _) in enumerate(fields) if k == name)
    return [*fields[: at + 1], fields[at], *fields[at + 1 :]]


@pytest.mark.parametrize(
    "fields",
    [
        [(b":foo", b"bar"), *request()],
        [(b":status", b"200"), *request()],
        [(b":protocol", b"websocket"), *request()],
        [*request()[:2], (b"x-early", b"1"), *request()[2:]],
        [(k, b"" if k == b":path" else v) for k, v in request()],
        _without(b":method"),
        _without(b":scheme"),
        _without(b":path"),
        _twice(b":method"),
        _twice(b":scheme"),
        _twice(b":path"),
        [(b":", b"x"), *request()],
    ],
    ids=[
        "unknown-pseudo-header",
        "response-pseudo-header",
        "extended-connect",
        "pseudo-header-after-a-field",
        "empty-path",
        "no-method",
        "no-scheme",
        "no-path",
        "method-twice",
        "scheme-twice",
        "path-twice",
        "bare-colon",
    ],
)
def test_8_3_bad_pseudo_headers_are_malformed(conn: H2Client, fields: FieldList) -> None:
    send_call(conn, 1, fields)
    conn.stream_error(1, h.PROTOCOL_ERROR)


def test_8_4_a_client_cannot_push(conn: H2Client) -> None:
    promise = (2).to_bytes(4, "big") + conn.block(request())
    conn.send(h.frame(h.PUSH_PROMISE, h.END_HEADERS, 1, promise))
    conn.connection_error(h.PROTOCOL_ERROR)


# RFC 7541 HPACK ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block",
    [
        b"\xc6",  # §2.3.3: indexed field 70 (61 static entries, an empty dynamic table)
        b"\x7f\x1f\x01a",  # §2.3.3: a literal whose name index (94) is past both tables
        b"\x82\x3f\xe1\x1f",  # §4.2: a dynamic table size update after a field
        b"\x00\x01a\x85\x1f\xff\xff\xff\xff",  # §5.2: a Huffman string padded with EOS
        b"\x00\x01a\x82\x1f\xff",  # §5.2: Huffman padding longer than 7 bits
        b"\x00\x01a\x81\x18",  # §5.2: Huffman padding of zeros, not the EOS prefix
        b"\x80",  # §6.1: index 0
        b"\x3f\xe2\x1f",  # §6.3: a table size update (4097) over SETTINGS_HEADER_TABLE_SIZE
    ],
    ids=[
        "index-past-the-tables",
        "name-index-past-the-tables",
        "size-update-not-first",
        "huffman-eos",
        "huffman-long-padding",
        "huffman-zero-padding",
        "index-0",
        "size-update-over-the-setting",
    ],
)
def test_rfc7541_an_undecodable_block_is_a_compression_error(conn: H2Client, block: bytes) -> None:
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 1, block))
    conn.connection_error(h.COMPRESSION_ERROR)


def test_rfc7541_the_dynamic_table_carries_across_blocks_and_streams(conn: H2Client) -> None:
    fields = [*request(METADATA), (b"x-tenant", b"camera-7"), (b"x-request", b"r1")]
    first = conn.block(fields)
    assert not static_only(first)  # literals with incremental indexing
    again = conn.block(fields)
    assert all(b & 0x80 for b in again)  # indexed fields only: the table's entries
    for sid, block in ((1, first), (3, again), (5, again)):
        conn.send(h.frame(h.HEADERS, h.END_HEADERS, sid, block))
        conn.send(h.frame(h.DATA, h.END_STREAM, sid, h.grpc_message(b"")))
        _, data, _ = conn.response(sid)
        seen = dict(json.loads(data[5:]))
        assert (seen["x-tenant"], seen["x-request"]) == ("camera-7", "r1"), sid


def test_rfc7541_size_updates_never_indexed_literals_and_huffman_decode(conn: H2Client) -> None:
    encoder = conn.encoder
    fields = [
        *(hpack.HeaderTuple(k, v) for k, v in request(METADATA)),
        hpack.NeverIndexedHeaderTuple(b"authorization", b"Bearer s3cret"),
        hpack.HeaderTuple(b"x-huffman", b"compressible, " * 4 + b"text"),
    ]
    for sid, table_size in ((1, 0), (3, 4096)):  # empty the table, then let it fill again
        encoder.header_table_size = table_size  # the next block starts with a size update
        block = bytes(encoder.encode(fields, huffman=True))
        assert block[0] & 0xE0 == 0x20
        seen = _read_metadata(conn, sid, block)
        assert seen["authorization"] == "Bearer s3cret"
        assert seen["x-huffman"] == "compressible, " * 4 + "text"
    assert _read_metadata(conn, 5, bytes(encoder.encode(fields)))["x-huffman"]  # indexed now


def _read_metadata(conn: H2Client, sid: int, block: bytes) -> dict[str, str]:
    conn.send(h.frame(h.HEADERS, h.END_HEADERS, sid, block))
    conn.send(h.frame(h.DATA, h.END_STREAM, sid, h.grpc_message(b"")))
    _, data, trailers = conn.response(sid)
    assert trailers["grpc-status"] == "0", trailers
    return dict(json.loads(data[5:]))


def test_rfc7541_a_header_list_that_inflates_past_the_limit_is_cut_off(conn: H2Client) -> None:
    """An HPACK bomb: one 4 KB entry, then a small block naming it 20 times (80 KB decoded, over
    the server's SETTINGS_MAX_HEADER_LIST_SIZE): the connection ends."""
    limit = conn.server_settings[h.MAX_HEADER_LIST_SIZE]
    send_call(conn, 1, [*request(), (b"x-big", b"b" * 4000)])  # the newest entry: index 62
    answered(conn, 1)
    bomb = b"\xbe" * (limit // 4000 + 2)  # index 62, again and again
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 3, bomb))
    conn.connection_error(h.COMPRESSION_ERROR)


def test_rfc7541_a_header_block_over_the_limit_in_one_frame_is_cut_off(conn: H2Client) -> None:
    block = bytes(conn.encoder.encode([*request(), (b"x-huge", b"h" * 70_000)], huffman=False))
    conn.send(h.frame(h.HEADERS, h.END_HEADERS | h.END_STREAM, 1, block))
    conn.connection_error(h.ENHANCE_YOUR_CALM)


def static_only(block: bytes) -> bool:
    """Whether a header block uses only the static table and literals never added to the
    dynamic one (RFC 7541 §6.1, §6.2.2, §6.2.3): no incremental indexing, no size update."""
    at = 0
    while at < len(block):
        first = block[at]
        if first & 0x80:  # indexed
            index, at = _integer(block, at, 7)
            if not 1 <= index <= 61:
                return False
            continue
        if first & 0xC0 == 0x40 or first & 0xE0 == 0x20:  # incremental indexing, size update
            return False
        index, at = _integer(block, at, 4)
        if index == 0:  # a literal name
            at = _skip_string(block, at)
        elif index > 61:
            return False
        at = _skip_string(block, at)
    return True


def _integer(block: bytes, at: int, prefix: int) -> tuple[int, int]:
    value = block[at] & ((1 << prefix) - 1)
    at += 1
    if value < (1 << prefix) - 1:
        return value, at
    shift = 0
    while True:
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _skip_string(block: bytes, at: int) -> int:
    length, at = _integer(block, at, 7)
    return at + length


def test_rfc7541_responses_never_touch_the_client_s_dynamic_table(probe: Probe) -> None:
    client = H2Client(probe.port)
    try:
        client.handshake({h.HEADER_TABLE_SIZE: 0})
        for sid, path in ((1, ECHO), (3, "/probe.Probe/Nope")):  # answered, and trailers-only
            send_call(client, sid, request(path))
            blocks = []
            while True:
                item = client.read()
                assert item is not None
                if item.kind == h.HEADERS and item.stream == sid:
                    blocks.append(item.payload)
                    if item.flags & h.END_STREAM:
                        break
            assert blocks
            assert all(static_only(block) for block in blocks), blocks
    finally:
        client.close()


# gRPC over HTTP/2 (gRPC's PROTOCOL-HTTP2.md) ----------------------------------------------------


def test_grpc_a_call_gets_headers_messages_and_trailers(conn: H2Client) -> None:
    send_call(conn, 1, request())
    headers = answered(conn, 1)
    assert headers[":status"] == "200"
    assert headers["content-type"] == "application/grpc"


@pytest.mark.parametrize("ended", [True, False], ids=["request-ended", "request-open"])
def test_grpc_an_unknown_method_is_a_trailers_only_unimplemented(
    conn: H2Client, ended: bool
) -> None:
    flags = h.END_HEADERS | (h.END_STREAM if ended else 0)
    conn.send(h.frame(h.HEADERS, flags, 1, conn.block(request("/probe.Probe/Nope"))))
    headers, data, trailers = conn.response(1)
    assert headers == trailers  # one block: trailers-only
    assert (headers[":status"], trailers["grpc-status"], data) == ("200", "12", b"")
    resets = [f for f in conn.ping() if f.kind == h.RST_STREAM]
    # §8.1: a response before the request ended is followed by RST_STREAM NO_ERROR
    assert [(f.stream, f.code) for f in resets] == ([] if ended else [(1, h.NO_ERROR)])


@pytest.mark.parametrize("content_type", [b"text/plain", None])
def test_grpc_a_request_that_is_not_grpc_gets_http_415(
    conn: H2Client, content_type: bytes | None
) -> None:
    fields = [(k, v) for k, v in request() if k != b"content-type"]
    if content_type is not None:
        fields.append((b"content-type", content_type))
    conn.send(h.frame(h.HEADERS, h.END_HEADERS, 1, conn.block(fields)))
    headers, _, _ = conn.response(1)
    assert headers[":status"] == "415"
    reset, _ = conn.until(h.RST_STREAM, 1)
    assert reset.code == h.NO_ERROR
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(b"late")))  # ignored: reset
    conn.ignored()


def test_grpc_a_call_past_its_grpc_timeout_is_deadline_exceeded(conn: H2Client) -> None:
    send_call(conn, 1, request(HOLD, **{"grpc-timeout": "50m"}))
    _, _, trailers = conn.response(1)
    assert trailers["grpc-status"] == "4"


def test_grpc_calls_interleaved_on_one_connection_each_get_their_own_answer(
    conn: H2Client,
) -> None:
    sids = (1, 3, 5)
    for sid in sids:
        conn.send(h.frame(h.HEADERS, h.END_HEADERS, sid, conn.block(request())))
    messages = {sid: h.grpc_message(f"call {sid}".encode()) for sid in sids}
    for at in range(len(messages[1])):  # a byte of each in turn
        for sid in sids:
            flags = h.END_STREAM if at == len(messages[sid]) - 1 else 0
            conn.send(h.frame(h.DATA, flags, sid, messages[sid][at : at + 1]))
    for sid in sids:
        _, data, trailers = conn.response(sid)
        assert (data, trailers["grpc-status"]) == (messages[sid], "0")


def test_grpc_a_request_written_one_byte_at_a_time_is_served(probe: Probe) -> None:
    client = H2Client(probe.port)
    try:
        client.send(h.PREFACE + h.settings())
        wire = h.frame(h.HEADERS, h.END_HEADERS, 1, client.block(request()))
        wire += h.frame(h.DATA, h.END_STREAM, 1, h.grpc_message(b"hello"))
        for at in range(len(wire)):
            client.send(wire[at : at + 1])
        answered(client, 1)
    finally:
        client.close()


def test_grpc_a_streaming_call_answers_each_message_as_it_comes(conn: H2Client) -> None:
    conn.send(h.frame(h.HEADERS, h.END_HEADERS, 1, conn.block(request(STREAM))))
    for word in (b"one", b"two"):
        conn.send(h.frame(h.DATA, 0, 1, h.grpc_message(word)))
        data, _ = conn.until(h.DATA, 1)  # answered before the client's next message
        assert data.payload == h.grpc_message(word)
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, b""))
    _, rest, trailers = conn.response(1)
    assert (rest, trailers["grpc-status"]) == (b"", "0")


def test_grpc_a_gzip_message_is_inflated(conn: H2Client) -> None:
    packed = gzip.compress(b"inflate me " * 50)
    conn.send(
        h.frame(h.HEADERS, h.END_HEADERS, 1, conn.block(request(**{"grpc-encoding": "gzip"})))
    )
    message = b"\x01" + len(packed).to_bytes(4, "big") + packed
    conn.send(h.frame(h.DATA, h.END_STREAM, 1, message))
    answered(conn, 1, b"inflate me " * 50)


def test_grpc_metadata_reaches_the_method_as_sent(conn: H2Client) -> None:
    fields = [*request(METADATA), (b"x-trace", b"abc"), (b"x-key-bin", b"AAEC")]
    seen = metadata_of(conn, 1, fields)
    assert (seen["x-trace"], seen["x-key-bin"]) == ("abc", "AAEC")
    assert not [k for k in seen if k.startswith(":") or k in ("te", "content-type")]
