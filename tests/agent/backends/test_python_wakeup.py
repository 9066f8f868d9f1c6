"""The executor's wait on a worker's pipe: readable, poked, timed out, closed."""

from __future__ import annotations

import os

from agent.backends.python.wakeup import Wakeup


def test_a_readable_descriptor_ends_the_wait_with_true() -> None:
    read, write = os.pipe()
    wakeup = Wakeup(read)
    os.write(write, b"x")
    assert wakeup.wait(5.0) is True
    wakeup.close()
    os.close(read)
    os.close(write)


def test_a_poke_ends_the_wait_with_false_and_is_consumed() -> None:
    read, write = os.pipe()
    wakeup = Wakeup(read)
    wakeup.poke()
    wakeup.poke()  # several pokes before a wait: one wake
    assert wakeup.wait(5.0) is False
    assert wakeup.wait(0.0) is False  # nothing left: returns at the (zero) timeout
    wakeup.close()
    os.close(read)
    os.close(write)


def test_a_hung_up_descriptor_counts_as_readable() -> None:
    read, write = os.pipe()
    wakeup = Wakeup(read)
    os.close(write)  # the reader then sees EOF
    assert wakeup.wait(5.0) is True
    wakeup.close()
    os.close(read)


def test_a_poke_after_close_writes_nothing() -> None:
    read, write = os.pipe()
    wakeup = Wakeup(read)
    wakeup.close()
    wakeup.close()  # idempotent
    wakeup.poke()  # no error, and no write to a descriptor reused since
    os.close(read)
    os.close(write)
