"""The agent ↔ worker wire: every datatype round-trips as raw buffers, deadlines, a closed pipe."""

from __future__ import annotations

import multiprocessing
import time

import numpy as np
import pytest

from agent.backends import python_ipc as ipc
from tests.models import IDENTITY_TYPES


def sample(kind: str) -> np.ndarray:
    if kind == "BYTES":
        return np.array([[b"", b"abc"], [b"\x00\x01", "\u00e9".encode()]], dtype=np.object_)
    if kind == "BOOL":
        return np.array([[True, False], [False, True]])
    dtype = np.dtype(kind.lower().replace("fp", "float"))
    return (np.arange(4).reshape(2, 2) + 1).astype(dtype)


def test_every_datatype_round_trips_and_arrives_writable() -> None:
    ours, theirs = multiprocessing.Pipe()
    tensors = [(f"T_{k}", sample(k)) for k in IDENTITY_TYPES]
    tensors.append(("EMPTY", np.zeros((0, 3), dtype=np.float32)))
    ipc.send(ours, ipc.Message(ipc.EXECUTE, {"outputs": ["A"]}, tensors))
    got = ipc.receive(theirs, time.monotonic() + 5)
    assert got.kind == ipc.EXECUTE
    assert got.meta == {"outputs": ["A"]}
    assert [n for n, _ in got.tensors] == [n for n, _ in tensors]
    for (_, sent), (name, back) in zip(tensors, got.tensors, strict=True):
        assert back.shape == sent.shape, name
        assert back.dtype == sent.dtype, name
        assert back.tolist() == sent.tolist(), name
        assert back.flags.writeable, name


def test_str_arrays_travel_as_bytes() -> None:
    ours, theirs = multiprocessing.Pipe()
    ipc.send(ours, ipc.Message(ipc.RESULT, tensors=[("S", np.array(["ab", "c"]))]))
    (_, back), *_ = ipc.receive(theirs).tensors
    assert back.dtype == np.object_
    assert back.tolist() == [b"ab", b"c"]


def test_receive_times_out_at_the_deadline() -> None:
    _, theirs = multiprocessing.Pipe()
    with pytest.raises(TimeoutError):
        ipc.receive(theirs, time.monotonic() + 0.05)


def test_receive_reports_a_closed_pipe() -> None:
    ours, theirs = multiprocessing.Pipe()
    ours.close()
    with pytest.raises(EOFError):
        ipc.receive(theirs, time.monotonic() + 5)


def test_malformed_header_is_refused() -> None:
    ours, theirs = multiprocessing.Pipe()
    ours.send_bytes(b'{"kind": "result"}')
    with pytest.raises(ipc.WireError, match="kind, meta and tensors"):
        ipc.receive(theirs)
