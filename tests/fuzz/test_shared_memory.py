"""Shared-memory registration and tensor spans on hostile offsets, sizes, keys and shapes.

Properties: registering answers a region or `InvalidInputError`/`ConflictError`, and a key never
reaches a file outside the shared-memory folder; reading, writing and resolving tensors answer the
bytes inside the region or `InvalidInputError`/`SharedMemoryNotFoundError`, never another
exception and never bytes outside the registered window.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.errors import ConflictError, InvalidInputError, SharedMemoryNotFoundError
from agent.serving.shared_memory import SharedMemoryRegistry
from agent.tensors.request import (
    InferInput,
    InferRequest,
    OutputTensor,
    RequestedOutput,
    SharedMemoryRef,
    tensor_to_bytes,
)
from tests.fuzz.budget import FUZZ
from tests.fuzz.strategies import DATATYPES, DIMS, assert_reason

OBJECT_BYTES = 256
WINDOW = (16, 128)  # the registered window: offset, byte size

_OFFSETS = st.integers(-3, OBJECT_BYTES + 3) | st.sampled_from([2**31, 2**63, 2**64, -(2**63)])
_JUNK = st.none() | st.booleans() | st.floats() | st.text(max_size=3)


@pytest.fixture(scope="module")
def shm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder standing in for /dev/shm with one object, and a file beside it (not inside)."""
    root = tmp_path_factory.mktemp("shm")
    folder = root / "shm"
    folder.mkdir()
    (folder / "obj").write_bytes(bytes(range(256)) * (OBJECT_BYTES // 256))
    (root / "outside").write_bytes(b"secret")
    (folder / "link").symlink_to(root / "outside")
    return folder


@pytest.fixture(scope="module")
def registry(shm_dir: Path) -> Iterator[SharedMemoryRegistry]:
    regions = SharedMemoryRegistry(shm_dir)
    regions.register("r", "/obj", *WINDOW)
    yield regions
    regions.unregister_all()


@FUZZ
@given(
    key=st.sampled_from(["/obj", "obj", "/link", "../outside", "/../outside", "//obj", "/."])
    | st.text(max_size=12),
    offset=_OFFSETS | _JUNK,
    byte_size=_OFFSETS | _JUNK,
)
@example(key="/\ud800", offset=0, byte_size=1)  # found: os.open raised UnicodeEncodeError
def test_register_maps_a_window_inside_the_folder_or_refuses(
    shm_dir: Path, key: str, offset: object, byte_size: object
) -> None:
    regions = SharedMemoryRegistry(shm_dir)
    try:
        status = regions.register("x", key, offset, byte_size)  # type: ignore[arg-type]
    except (InvalidInputError, ConflictError) as exc:
        assert_reason(exc)
        return
    finally:
        regions.unregister_all()
    assert key.lstrip("/") == "obj"  # nothing else in the folder is a regular file
    assert isinstance(offset, int)
    assert isinstance(byte_size, int)
    assert offset + byte_size <= OBJECT_BYTES
    assert status.byte_size == byte_size


@FUZZ
@given(offset=_OFFSETS, byte_size=_OFFSETS, region=st.sampled_from(["r", "nope"]))
def test_reads_and_writes_stay_inside_the_window(
    registry: SharedMemoryRegistry, offset: int, byte_size: int, region: str
) -> None:
    try:
        view = registry.read(region, offset, byte_size)
    except (InvalidInputError, SharedMemoryNotFoundError):
        pass
    else:
        assert len(view) == byte_size
        assert offset >= 0
        assert offset + byte_size <= WINDOW[1]
        start = WINDOW[0] + offset
        assert bytes(view) == bytes(range(256))[start : start + byte_size]
        del view
    data = np.zeros(max(0, min(byte_size, 512)), dtype=np.uint8)
    before = bytes(registry.read("r", 0, WINDOW[1]))
    try:
        registry.write(region, offset, data.tobytes())
    except (InvalidInputError, SharedMemoryNotFoundError):
        assert bytes(registry.read("r", 0, WINDOW[1])) == before
    else:  # written where asked, inside the window
        assert 0 <= offset <= offset + len(data) <= WINDOW[1]
        assert bytes(registry.read("r", offset, len(data))) == data.tobytes()
        registry.write(region, offset, before[offset : offset + len(data)])  # put it back


@st.composite
def _shm_request(draw: st.DrawFn) -> InferRequest:
    inputs = []
    for number in range(draw(st.integers(1, 3))):
        datatype = draw(st.sampled_from(DATATYPES))
        shape = tuple(draw(st.lists(DIMS.filter(lambda d: d >= 0), max_size=3)))
        ref = SharedMemoryRef(draw(st.sampled_from(["r", "gone"])), draw(_OFFSETS), draw(_OFFSETS))
        empty = np.empty(0, dtype=np.float32)
        inputs.append(InferInput(f"in{number}", datatype, shape, empty, ref))
    outputs = tuple(
        RequestedOutput(f"out{n}", None, SharedMemoryRef("r", draw(_OFFSETS), draw(_OFFSETS)))
        for n in range(draw(st.integers(0, 2)))
    )
    return InferRequest(inputs=tuple(inputs), outputs=outputs or None)


@FUZZ
@given(_shm_request())
@example(
    InferRequest(
        inputs=(InferInput("x", "FP32", (0, 2**62), np.empty(0), SharedMemoryRef("r", 0, 0)),)
    )
)  # found: a zero-element tensor with a huge dimension reached numpy (ValueError)
def test_resolved_inputs_have_their_shapes_or_are_refused(
    registry: SharedMemoryRegistry, request_: InferRequest
) -> None:
    try:
        resolved = registry.resolve_inputs(request_)
    except (InvalidInputError, SharedMemoryNotFoundError) as exc:
        assert_reason(exc)
        return
    for tensor in resolved.inputs:
        assert tensor.data.shape == tensor.shape


@FUZZ
@given(
    st.lists(st.integers(0, 200), min_size=1, max_size=3),
    _OFFSETS,
    _OFFSETS,
    st.sampled_from(["FP32", "UINT8", "BYTES"]),
)
def test_outputs_are_placed_inside_the_window_or_refused(
    registry: SharedMemoryRegistry, lengths: list[int], offset: int, byte_size: int, datatype: str
) -> None:
    outputs = tuple(
        OutputTensor(
            f"o{n}",
            datatype,
            np.array([b"ab"] * length, dtype=object)
            if datatype == "BYTES"
            else np.zeros(length, dtype=np.float32 if datatype == "FP32" else np.uint8),
        )
        for n, length in enumerate(lengths)
    )
    wanted = {"o0": SharedMemoryRef("r", offset, byte_size)}
    before = bytes(registry.read("r", 0, WINDOW[1]))
    try:
        registry.place_outputs(outputs, wanted)
    except (InvalidInputError, SharedMemoryNotFoundError) as exc:
        assert_reason(exc)
        assert bytes(registry.read("r", 0, WINDOW[1])) == before
    else:
        written = tensor_to_bytes(outputs[0].data, datatype)
        assert bytes(registry.read("r", offset, len(written))) == written
    registry.write("r", 0, before)
