"""Waiting for a worker's answer while other threads may need the waiter's attention.

While an `execute` runs, its executor thread sleeps until the worker writes, or until another
thread pokes it: a request was cancelled, a BLS call ended. One `Wakeup` per worker, made with
it and kept for its life, so an `execute` costs no descriptors of its own: one poll(2) watches
the worker's socket and a wake-up pipe.

A poke that comes late (a BLS call of an `execute` that already returned) only wakes the next
wait early; every waiter checks what it waits for after waking. After `close`, a poke is a no-op
(never a write to a descriptor number the process has since reused).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading

__all__ = ["Wakeup"]


class Wakeup:
    """Waits on one descriptor (the worker's socket) and a pipe that `poke` writes to."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._poller.register(self._read, select.POLLIN)
        self._lock = threading.Lock()  # `poke` (any thread) against `close`
        self._closed = False

    def poke(self) -> None:
        """Wake the current (or next) `wait` (any thread)."""
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(OSError):  # full (BlockingIOError): a wake is pending
                os.write(self._write, b"\0")

    def wait(self, timeout_s: float) -> bool:
        """Sleep until the descriptor is readable (or hung up), a poke, or `timeout_s`; True
        when the descriptor is readable. Pokes are consumed."""
        readable = False
        for fd, _ in self._poller.poll(max(0.0, timeout_s) * 1000):
            if fd == self._fd:
                readable = True
            else:
                with contextlib.suppress(OSError):
                    os.read(self._read, 4096)
        return readable

    def close(self) -> None:
        """Release the pipe (idempotent); the watched descriptor is its owner's to close."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._read)
            os.close(self._write)
