"""The agent ↔ worker wire: every datatype round-trips as raw buffers, deadlines, a closed pipe."""

from __future__ import annotations

import json
import multiprocessing
import os
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from agent.backends.python import ipc
from agent.backends.python.worker.mailbox import Mailbox
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


def frame(header: bytes, data: bytes = b"") -> bytearray:
    return bytearray(struct.pack("<IQ", len(header), len(data)) + header + data)


def test_malformed_header_is_refused() -> None:
    ours, theirs = multiprocessing.Pipe()
    os.write(ours.fileno(), frame(b'{"kind": "result"}'))
    with pytest.raises(ipc.WireError, match="kind, meta and tensors"):
        ipc.receive(theirs)


def test_a_header_larger_than_the_cap_is_refused_before_it_is_read() -> None:
    with pytest.raises(ipc.WireError, match="exceeds"):
        ipc.frame_lengths(struct.pack("<IQ", ipc.MAX_HEADER_BYTES + 1, 0))


def test_a_frame_is_its_prefix_header_and_aligned_data() -> None:
    a = np.arange(3, dtype=np.int8)
    b = np.arange(2, dtype=np.float64)
    buffers = ipc.encode(ipc.Message(ipc.RESULT, {"x": 1}, [("A", a), ("B", b)]))
    raw = b"".join(bytes(x) for x in buffers)
    header, data = ipc.frame_lengths(raw[:12])
    assert header % 16 == 0
    assert data == 16 + 16  # A's 3 bytes padded to 16, then B's 16
    body = bytearray(raw[12:])
    assert len(body) == header + data
    got = ipc.decode(body, header)
    assert got.meta == {"x": 1}
    assert got.tensors[0][1].tolist() == [0, 1, 2]
    assert got.tensors[1][1].tolist() == [0.0, 1.0]
    assert got.tensors[1][1].ctypes.data % 8 == 0  # aligned for its dtype


def test_decode_refuses_tensors_that_overrun_the_frame() -> None:
    header = json.dumps(
        {
            "kind": "result",
            "meta": {},
            "tensors": [{"name": "A", "datatype": "FP32", "shape": [4], "nbytes": 16}],
        }
    ).encode()
    with pytest.raises(ipc.WireError, match="overrun"):
        ipc.decode(bytearray(header + bytes(8)), len(header))


def test_a_non_blocking_end_sends_large_messages_and_reads_at_the_deadline() -> None:
    ours, theirs = multiprocessing.Pipe()
    os.set_blocking(ours.fileno(), False)
    os.set_blocking(theirs.fileno(), False)
    big = np.arange(2 * 1024 * 1024, dtype=np.float32)  # far more than the socket buffer
    got: list[ipc.Message] = []
    reader = threading.Thread(target=lambda: got.append(ipc.receive(theirs)))
    reader.start()
    ipc.send(ours, ipc.Message(ipc.RESULT, tensors=[("Y", big)]))
    reader.join(timeout=30)
    np.testing.assert_array_equal(got[0].tensors[0][1], big)
    with pytest.raises(TimeoutError):
        ipc.receive(theirs, time.monotonic() + 0.05)


def test_a_reader_never_takes_the_next_message() -> None:
    ours, theirs = multiprocessing.Pipe()
    ipc.send(ours, ipc.Message(ipc.LOG, {"n": 1}))
    ipc.send(ours, ipc.Message(ipc.LOG, {"n": 2}))
    assert ipc.receive(theirs).meta == {"n": 1}
    assert theirs.poll(0)  # the second is still in the socket, where a poll sees it
    assert ipc.receive(theirs).meta == {"n": 2}


def test_large_messages_cross_both_ways_at_once_without_deadlock() -> None:
    # The agent writes a 16 MB result nobody waits for (an abandoned BLS call), then reads; the
    # worker writes its own 16 MB answer meanwhile. Each alone overflows the socket buffer: only
    # the worker's reader thread keeps both writes moving.
    agent_end, worker_end = multiprocessing.Pipe(duplex=True)
    mailbox = Mailbox(worker_end)
    mailbox.start()
    big = np.arange(4 * 1024 * 1024, dtype=np.float32)
    expected = mailbox.expect(2)
    received: list[ipc.Message] = []

    def agent_side() -> None:
        ipc.send(agent_end, ipc.Message(ipc.BLS_RESULT, {"id": 1}, [("Y", big)]))  # abandoned
        ipc.send(agent_end, ipc.Message(ipc.BLS_RESULT, {"id": 2}, [("Y", big[:3])]))
        received.append(ipc.receive(agent_end, time.monotonic() + 30))

    def worker_side() -> None:
        ipc.send(worker_end, ipc.Message(ipc.RESULT, {"responses": []}, [("Y", big)]))

    threads = [threading.Thread(target=agent_side), threading.Thread(target=worker_side)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "both sides stuck writing"
    assert received[0].kind == ipc.RESULT
    np.testing.assert_array_equal(received[0].tensors[0][1], big)
    assert expected.result(timeout=5).tensors[0][1].tolist() == [0.0, 1.0, 2.0]
    # Control messages still reach the main loop, in order; a closed pipe ends it.
    ipc.send(agent_end, ipc.Message(ipc.FINALIZE))
    assert mailbox.receive().kind == ipc.FINALIZE
    waiting = mailbox.expect(3)
    agent_end.close()
    with pytest.raises(EOFError):
        mailbox.receive()
    with pytest.raises(EOFError):  # and every receive after it
        mailbox.receive()
    assert "the agent is gone" in str(waiting.result(timeout=5).meta["error"])


def test_the_main_loop_gets_every_message_sent_before_the_pipe_closed_first() -> None:
    agent_end, worker_end = multiprocessing.Pipe(duplex=True)
    mailbox = Mailbox(worker_end)
    ipc.send(agent_end, ipc.Message(ipc.EXECUTE, {"seq": 1}))
    ipc.send(agent_end, ipc.Message(ipc.FINALIZE))
    agent_end.close()
    mailbox.start()
    assert mailbox.receive().meta == {"seq": 1}
    assert mailbox.receive().kind == ipc.FINALIZE
    with pytest.raises(EOFError):
        mailbox.receive()


def test_a_frame_reader_takes_messages_read_together_apart_and_large_ones_whole() -> None:
    ours, theirs = multiprocessing.Pipe()
    big = np.arange(100_000, dtype=np.float64)  # 800 kB: more than the reader's buffer
    ipc.send(ours, ipc.Message(ipc.PING, {"n": 1}))
    ipc.send(ours, ipc.Message(ipc.EXECUTE, {"seq": 1}, [("X", np.arange(3, dtype=np.int32))]))
    # It fills the socket: it is read while it is written.
    sender = threading.Thread(
        target=ipc.send, args=(ours, ipc.Message(ipc.BLS_RESULT, {"id": 2}, [("Y", big)]))
    )
    sender.start()
    reader = ipc.FrameReader(theirs)
    assert reader.receive().meta == {"n": 1}
    assert reader.receive().tensors[0][1].tolist() == [0, 1, 2]
    assert reader.receive().tensors[0][1].tolist() == big.tolist()
    sender.join(timeout=30)
    ipc.send(ours, ipc.Message(ipc.FINALIZE))
    assert reader.receive().kind == ipc.FINALIZE
    ours.close()
    with pytest.raises(EOFError):
        reader.receive()


def test_names_that_need_escaping_and_strided_arrays_of_any_size_round_trip() -> None:
    ours, theirs = multiprocessing.Pipe()
    small = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # not contiguous
    large = np.arange(40_000, dtype=np.int64).reshape(200, 200)[::2, 1::3]
    names = ['quote " and \\', "\u00e9t\u00e9", "plain"]
    scalar = np.full((), 3.5)
    tensors: list[tuple[str, np.ndarray]] = [
        (names[0], small),
        (names[1], large),
        (names[2], scalar),
    ]
    ipc.send(ours, ipc.Message(ipc.RESULT, {"\u00e9": "\u00e9"}, tensors))
    got = ipc.receive(theirs, time.monotonic() + 5)
    assert got.meta == {"\u00e9": "\u00e9"}
    assert [n for n, _ in got.tensors] == names
    for (_, sent), (_, back) in zip(tensors, got.tensors, strict=True):
        assert back.shape == sent.shape
        np.testing.assert_array_equal(back, sent)


def test_receive_waiting_reads_one_whole_frame_or_nothing_without_waiting() -> None:
    ours, theirs = multiprocessing.Pipe()
    os.set_blocking(theirs.fileno(), False)
    assert ipc.receive_waiting(theirs) is None  # nothing waits: no wait either
    ipc.send(ours, ipc.Message(ipc.LOG, {"n": 1}))
    ipc.send(ours, ipc.Message(ipc.RESULT, {"n": 2}, [("Y", np.arange(3))]))
    first = ipc.receive_waiting(theirs)
    assert isinstance(first, ipc.Message)
    assert first.meta == {"n": 1}
    assert theirs.poll(0)  # the next one is still in the socket, where a poll sees it
    second = ipc.receive_waiting(theirs)
    assert isinstance(second, ipc.Message)
    assert second.tensors[0][1].tolist() == [0, 1, 2]
    assert ipc.receive_waiting(theirs) is None
    ours.close()
    with pytest.raises(EOFError):
        ipc.receive_waiting(theirs)


@pytest.mark.parametrize("cut", [5, ipc.PREFIX_BYTES, ipc.PREFIX_BYTES + 20])
def test_receive_waiting_leaves_the_rest_of_a_frame_to_a_reader_that_may_wait(cut: int) -> None:
    ours, theirs = multiprocessing.Pipe()
    os.set_blocking(theirs.fileno(), False)
    raw = b"".join(
        bytes(b) for b in ipc.encode(ipc.Message(ipc.RESULT, {"n": 1}, [("Y", np.arange(3))]))
    )
    os.write(ours.fileno(), raw[:cut])
    rest = ipc.receive_waiting(theirs)
    assert callable(rest)
    with pytest.raises(TimeoutError):  # the rest has not come: it waits up to its deadline
        rest(time.monotonic() + 0.05)
    os.write(ours.fileno(), raw[cut:])
    ipc.send(ours, ipc.Message(ipc.LOG, {"n": 2}))
    message = rest(time.monotonic() + 5)
    assert message.meta == {"n": 1}
    assert message.tensors[0][1].tolist() == [0, 1, 2]
    following = ipc.receive_waiting(theirs)  # never read into the next frame
    assert isinstance(following, ipc.Message)
    assert following.meta == {"n": 2}


def test_receive_waiting_hands_a_frame_cut_short_to_the_reader_as_eof() -> None:
    ours, theirs = multiprocessing.Pipe()
    os.set_blocking(theirs.fileno(), False)
    raw = b"".join(bytes(b) for b in ipc.encode(ipc.Message(ipc.RESULT, {"n": 1})))
    os.write(ours.fileno(), raw[:-3])
    ours.close()
    rest = ipc.receive_waiting(theirs)
    assert callable(rest)
    with pytest.raises(EOFError):
        rest(time.monotonic() + 5)


def _thread_state(tid: int) -> tuple[str, int]:
    """(state letter, voluntary context switches) of one of this process's threads."""
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines()
    )
    return fields["State"].split()[0], int(fields["voluntary_ctxt_switches"])


def _asleep(tid: int) -> int:
    """Wait until the thread sleeps; its voluntary context switches then."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state, switches = _thread_state(tid)
        if state == "S":
            return switches
        time.sleep(0.001)
    raise AssertionError("the reader never went to sleep")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_a_waiting_frame_reader_sleeps_through_the_other_side_reading_what_it_wrote() -> None:
    # A reader asleep in read(2) would wake (and the other side's read pay for the wake-up)
    # each time the other side reads a message this end wrote.
    ours, theirs = multiprocessing.Pipe()
    reader = ipc.FrameReader(theirs)
    tids: list[int] = []
    got: list[ipc.Message] = []

    def read() -> None:
        tids.append(threading.get_native_id())
        got.append(reader.receive())

    thread = threading.Thread(target=read)
    thread.start()
    while not tids:
        time.sleep(0.001)
    before = _asleep(tids[0])
    for n in range(20):
        ipc.send(theirs, ipc.Message(ipc.RESULT, {"n": n}))
        assert ipc.receive(ours).meta == {"n": n}
    after = _asleep(tids[0])
    ipc.send(ours, ipc.Message(ipc.FINALIZE))
    thread.join(timeout=10)
    assert got[0].kind == ipc.FINALIZE
    # 20 when woken by every read; a few stray switches may happen (the thread getting the GIL
    # on its way into the wait)
    assert after - before < 10
