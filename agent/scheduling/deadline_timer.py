"""A re-armable event-loop timer with microsecond resolution, for the scheduler's batch deadlines.

The loop's own timers have millisecond resolution (uvloop keeps its clock in whole milliseconds,
epoll waits in milliseconds), so a 300 µs batching delay either waits a whole millisecond or, when
re-armed with a zero delay until the deadline passes, spins the loop. On Linux this timer is a
`timerfd` on CLOCK_MONOTONIC armed with the absolute deadline and watched with `add_reader`: the
kernel wakes the loop at the right microsecond and the loop does nothing until then. Elsewhere
it falls back to the loop's timers with the delay rounded up to whole milliseconds (never early,
never spinning).

Deadlines are `time.monotonic()` seconds (CLOCK_MONOTONIC on Linux, the timerfd's clock).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import math
import os
import sys
import time
import weakref
from collections.abc import Callable

logger = logging.getLogger(__name__)

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or time.get_clock_info("monotonic").implementation != (
        "clock_gettime(CLOCK_MONOTONIC)"
    ):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.timerfd_settime.argtypes = (
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.c_void_p,
        )
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()


class DeadlineTimer:
    """Calls `callback` on the loop once the armed deadline has passed; re-arming replaces it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self._fd = -1
        self._armed = False
        self._finalizer: weakref.finalize[[asyncio.AbstractEventLoop, int], DeadlineTimer] | None
        self._finalizer = None
        if _LIBC is not None:
            fd = int(_LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
            if fd >= 0:
                try:
                    loop.add_reader(fd, self._on_fd)
                except (NotImplementedError, RuntimeError):  # a loop without add_reader
                    os.close(fd)
                else:
                    self._fd = fd
                    self._finalizer = weakref.finalize(self, _close_fd, loop, fd)

    @property
    def precise(self) -> bool:
        """Whether this timer wakes at the microsecond (timerfd), not the next millisecond."""
        return self._fd >= 0

    def arm(self, deadline: float | None) -> None:
        """Fire at `deadline` (monotonic seconds; a past one fires at once); None disarms."""
        if self._fd >= 0:
            self._settime(deadline)
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if deadline is not None:
            delay = math.ceil(max(0.0, deadline - time.monotonic()) * 1000) / 1000
            self._handle = self._loop.call_later(delay, self._fire)

    def close(self) -> None:
        """Disarm for good and release the timerfd; may be called from any thread."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is None:
            return
        self._fd = -1
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop or self._loop.is_closed():
            finalizer()  # runs once: stops watching the fd and closes it
        else:
            self._loop.call_soon_threadsafe(finalizer)

    def _settime(self, deadline: float | None) -> None:
        assert _LIBC is not None
        spec = _Itimerspec()
        if deadline is not None:
            # A zero it_value disarms, so a deadline at or before 0 becomes 1 ns (long past).
            ns = max(1, int(deadline * 1_000_000_000))
            spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        elif not self._armed:
            return
        if _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        self._armed = deadline is not None

    def _on_fd(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed (or disarmed) after it became readable
            return
        self._armed = False
        self._callback()

    def _fire(self) -> None:
        self._handle = None
        self._callback()


def _close_fd(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    if not loop.is_closed():
        loop.remove_reader(fd)
    os.close(fd)
