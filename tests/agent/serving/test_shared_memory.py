"""The shared-memory registry and codec, without sockets: real POSIX shm objects in /dev/shm."""

from __future__ import annotations

import json
import mmap
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from agent.api.http.codec import decode_infer_request, encode_infer_response
from agent.errors import ConflictError, InvalidInputError, SharedMemoryNotFoundError
from agent.serving.shared_memory import SHM_DIR, SharedMemoryRegistry
from agent.tensors.request import (
    InferInput,
    InferRequest,
    InferResponse,
    OutputTensor,
    RequestedOutput,
    SharedMemoryRef,
)


@dataclass
class ShmObject:
    key: str
    mapping: mmap.mmap


@pytest.fixture
def shm() -> Iterator[ShmObject]:
    """A 4 KiB shared-memory object, as a client would create it, unlinked afterwards."""
    if not SHM_DIR.is_dir():
        pytest.skip("no /dev/shm on this system: POSIX shared memory is not available")
    name = f"edge-agent-test-{uuid.uuid4().hex}"
    fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 4096)
        mapping = mmap.mmap(fd, 4096)
    finally:
        os.close(fd)
    yield ShmObject("/" + name, mapping)
    mapping.close()
    (SHM_DIR / name).unlink()


@pytest.fixture
def regions() -> Iterator[SharedMemoryRegistry]:
    registry = SharedMemoryRegistry()
    yield registry
    registry.unregister_all()


def test_register_status_read_write(shm: ShmObject, regions: SharedMemoryRegistry) -> None:
    shm.mapping[1024:1028] = b"abcd"
    status = regions.register("r", shm.key, 1024, 2048)
    assert status.to_json() == {"name": "r", "key": shm.key, "offset": 1024, "byte_size": 2048}
    assert regions.status() == [status]
    assert regions.status("r") == [status]
    assert bytes(regions.read("r", 0, 4)) == b"abcd"
    regions.write("r", 8, b"xyz")
    assert shm.mapping[1032:1035] == b"xyz"  # the client sees what the agent wrote


def test_duplicate_name_is_a_conflict(shm: ShmObject, regions: SharedMemoryRegistry) -> None:
    regions.register("r", shm.key, 0, 16)
    with pytest.raises(ConflictError, match="'r' already in manager"):
        regions.register("r", shm.key, 16, 16)


def test_unknown_key_and_bad_keys_are_refused(regions: SharedMemoryRegistry) -> None:
    with pytest.raises(InvalidInputError, match="unable to open shared memory region"):
        regions.register("r", f"/no-such-{uuid.uuid4().hex}", 0, 16)
    for key in ("", "/", "/a/b", "../etc/passwd", "/.."):
        with pytest.raises(InvalidInputError, match="invalid shared memory key"):
            regions.register("r", key, 0, 16)
    assert regions.status() == []


def test_window_past_the_object_is_refused(shm: ShmObject, regions: SharedMemoryRegistry) -> None:
    with pytest.raises(InvalidInputError, match="past the end"):
        regions.register("r", shm.key, 4000, 100)
    for offset, size in ((-1, 16), (0, 0), (0, -5)):
        with pytest.raises(InvalidInputError, match="must be an integer"):
            regions.register("r", shm.key, offset, size)


def test_symlinks_and_non_files_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 64)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dir").mkdir()
    regions = SharedMemoryRegistry(directory=tmp_path)
    with pytest.raises(InvalidInputError, match="unable to open"):
        regions.register("r", "/link", 0, 16)
    with pytest.raises(InvalidInputError):
        regions.register("r", "/dir", 0, 16)
    regions.register("ok", "/secret", 0, 64)  # a plain file in the directory is fine


def test_number_of_regions_is_bounded(shm: ShmObject) -> None:
    regions = SharedMemoryRegistry(max_regions=2)
    regions.register("a", shm.key, 0, 16)
    regions.register("b", shm.key, 16, 16)
    with pytest.raises(InvalidInputError, match="2 regions are registered already"):
        regions.register("c", shm.key, 32, 16)
    regions.unregister("a")
    regions.register("c", shm.key, 32, 16)
    regions.unregister_all()


def test_unregister_and_unknown_names(shm: ShmObject, regions: SharedMemoryRegistry) -> None:
    regions.register("a", shm.key, 0, 16)
    regions.register("b", shm.key, 0, 16)
    regions.unregister("nope")  # Triton: not an error
    regions.unregister("a")
    assert [s.name for s in regions.status()] == ["b"]
    with pytest.raises(SharedMemoryNotFoundError, match="'a'"):
        regions.status("a")
    with pytest.raises(SharedMemoryNotFoundError):
        regions.read("a", 0, 4)
    regions.unregister_all()
    assert regions.status() == []


def test_spans_outside_the_region_are_refused(
    shm: ShmObject, regions: SharedMemoryRegistry
) -> None:
    regions.register("r", shm.key, 100, 64)
    with pytest.raises(
        InvalidInputError, match=r"^Invalid offset for shared memory region: 'r' \(offset 64,"
    ):
        regions.read("r", 64, 1)
    with pytest.raises(
        InvalidInputError,
        match=r"^Invalid offset \+ byte size for shared memory region: 'r' \(offset 60 \+ 8 ",
    ):
        regions.read("r", 60, 8)
    with pytest.raises(InvalidInputError, match="Invalid offset \\+ byte size"):
        regions.write("r", 0, b"z" * 65)


def test_unregister_while_a_view_is_alive(shm: ShmObject, regions: SharedMemoryRegistry) -> None:
    shm.mapping[0:4] = b"keep"
    regions.register("r", shm.key, 0, 64)
    view = regions.read("r", 0, 4)
    regions.unregister("r")  # the mapping stays until the view goes: no unmap under a reader
    assert bytes(view) == b"keep"
    assert regions.status() == []


def _request(inputs: tuple[InferInput, ...], outputs: tuple[RequestedOutput, ...]) -> InferRequest:
    return InferRequest(inputs=inputs, outputs=outputs)


def test_inputs_are_copied_out_of_the_region(shm: ShmObject, regions: SharedMemoryRegistry) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    shm.mapping[64 : 64 + x.nbytes] = x.tobytes()
    regions.register("in", shm.key, 0, 1024)
    ref = SharedMemoryRef("in", 64, x.nbytes)
    tensor = InferInput("X", "FP32", (3, 4), np.empty(0, np.float32), ref)
    resolved = regions.resolve_inputs(_request((tensor,), ()))
    got = resolved.inputs[0].data
    np.testing.assert_array_equal(got, x)
    shm.mapping[64 : 64 + x.nbytes] = bytes(x.nbytes)  # the client rewrites its region
    np.testing.assert_array_equal(got, x)  # the request keeps what it was sent
    regions.unregister("in")  # nothing still points into the mapping


def test_input_size_mismatch_names_the_input(shm: ShmObject, regions: SharedMemoryRegistry) -> None:
    regions.register("in", shm.key, 0, 1024)
    tensor = InferInput("X", "FP32", (3, 4), np.empty(0, np.float32), SharedMemoryRef("in", 0, 40))
    with pytest.raises(InvalidInputError, match="input 'X': shared_memory_byte_size 40"):
        regions.resolve_inputs(_request((tensor,), ()))
    missing = InferInput("X", "FP32", (1,), np.empty(0, np.float32), SharedMemoryRef("gone", 0, 4))
    with pytest.raises(SharedMemoryNotFoundError, match=r"^Unable to find .*'gone' \(input 'X'\)"):
        regions.resolve_inputs(_request((missing,), ()))


def test_output_spans_are_checked_before_inference(
    shm: ShmObject, regions: SharedMemoryRegistry
) -> None:
    regions.register("out", shm.key, 0, 16)
    x = InferInput("X", "FP32", (1,), np.zeros(1, np.float32))
    bad = RequestedOutput("Y", None, SharedMemoryRef("out", 8, 16))
    with pytest.raises(InvalidInputError, match="output 'Y'"):
        regions.resolve_inputs(_request((x,), (bad,)))


def test_outputs_are_written_and_checked(shm: ShmObject, regions: SharedMemoryRegistry) -> None:
    regions.register("out", shm.key, 0, 256)
    y = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    outputs = (OutputTensor("Y", "FP32", y), OutputTensor("Z", "FP32", y))
    regions.place_outputs(outputs, {"Y": SharedMemoryRef("out", 32, 12)})
    np.testing.assert_array_equal(np.frombuffer(shm.mapping[32:44], np.float32), y.ravel())
    with pytest.raises(InvalidInputError, match="output 'Y' \\(8 bytes\\) should be at least 12"):
        regions.place_outputs(outputs, {"Y": SharedMemoryRef("out", 0, 8)})


def _body(doc: dict[str, object]) -> bytes:
    return json.dumps(doc).encode()


def test_http_codec_reads_shared_memory_parameters() -> None:
    params = {"shared_memory_region": "in", "shared_memory_byte_size": 48}
    request = decode_infer_request(
        _body(
            {
                "inputs": [
                    {"name": "X", "datatype": "FP32", "shape": [3, 4], "parameters": params}
                ],
                "outputs": [
                    {
                        "name": "Y",
                        "parameters": {
                            "shared_memory_region": "out",
                            "shared_memory_byte_size": 64,
                            "shared_memory_offset": 16,
                        },
                    }
                ],
            }
        )
    )
    assert request.inputs[0].shm == SharedMemoryRef("in", 0, 48)
    assert request.outputs is not None
    assert request.outputs[0].shm == SharedMemoryRef("out", 16, 64)


@pytest.mark.parametrize(
    ("params", "extra", "message"),
    [
        ({"shared_memory_region": "in"}, {}, "must be given together"),
        ({"shared_memory_byte_size": 4}, {}, "must be given together"),
        ({"shared_memory_offset": 4}, {"data": [1.0]}, "without shared_memory_region"),
        ({"shared_memory_region": 3, "shared_memory_byte_size": 4}, {}, "non-empty string"),
        ({"shared_memory_region": "in", "shared_memory_byte_size": -4}, {}, "non-negative"),
        ({"shared_memory_region": "in", "shared_memory_byte_size": 4}, {"data": [1.0]}, "also"),
    ],
)
def test_http_codec_refuses_bad_shared_memory_parameters(
    params: dict[str, object], extra: dict[str, object], message: str
) -> None:
    raw = {"name": "X", "datatype": "FP32", "shape": [1], "parameters": params, **extra}
    with pytest.raises(InvalidInputError, match=message):
        decode_infer_request(_body({"inputs": [raw]}))


def test_http_response_has_no_data_for_outputs_in_shared_memory() -> None:
    y = np.ones((2, 3), np.float32)
    request = InferRequest(
        inputs=(),
        outputs=(
            RequestedOutput("Y", True, SharedMemoryRef("out", 8, 100)),
            RequestedOutput("Z", True),
        ),
    )
    response = InferResponse("m", "1", (OutputTensor("Y", "FP32", y), OutputTensor("Z", "FP32", y)))
    body, header_length = encode_infer_response(response, request)
    assert header_length is not None
    doc = json.loads(body[:header_length])
    # As Triton: name, datatype and shape only (its C++ client reads any output "parameters"
    # as binary data).
    assert doc["outputs"][0] == {"name": "Y", "datatype": "FP32", "shape": [2, 3]}
    assert doc["outputs"][1]["parameters"] == {"binary_data_size": 24}
    assert len(body) == header_length + 24  # only Z's bytes follow the header
