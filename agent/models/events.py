"""Model events and the sinks they go to (the cache's state database, the fleet link, the log).

Invariants:
    * Recording an event never raises into its caller: a hot swap, a canary verdict or a cache
      GC goes on whatever a sink does (outbox full, disk full, SQLite error, a bug). `EventTee`
      calls every sink in turn; one that raises is logged with its traceback and kept as failing,
      with the reason, until it records an event again. Listeners (the fleet link, which then
      reports `degraded`) hear every change of that set.
    * Fault events (`FAULT_EVENTS`: the agent hit a fault and serves on without it) are kept,
      the last `REPLAYED` of them, and replayed to a sink added later, so a fleet link attached
      after start-up still hears about a corrupt canary state file.
    * Thread-safe: events may be recorded from worker threads (a cache GC runs in one).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

logger = logging.getLogger(__name__)

# Faults the agent survives and the fleet must hear about.
CANARY_STATE_CORRUPT = "canary_state_corrupt"
CANARY_STATE_WRITE_FAILED = "canary_state_write_failed"
CACHE_GC_FAILED = "cache_gc_failed"
FAULT_EVENTS = frozenset({CANARY_STATE_CORRUPT, CANARY_STATE_WRITE_FAILED, CACHE_GC_FAILED})
REPLAYED = 32

_Event = tuple[str, int | None, str, Mapping[str, object]]


class EventSink(Protocol):
    """Where model events go (the cache's state database, MQTT, the log)."""

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None: ...


@runtime_checkable
class SinkHealthListener(Protocol):
    """A sink that wants to know which of its fellow sinks fail (see `EventTee`)."""

    def sinks_failing(self, failing: Mapping[str, str]) -> None:
        """The failing sinks (name: reason), told on every change; empty when all recovered.

        May be called from any thread.
        """


class LogEvents:
    """An event sink that only logs."""

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        logger.info("event %s model=%s version=%s %s", kind, model, version, dict(detail))


class EventTee:
    """An `EventSink` that forwards each event to several sinks, defensively (module docstring)."""

    def __init__(self, *sinks: EventSink) -> None:
        self._sinks = list(sinks)
        self._lock = threading.Lock()
        self._failing: dict[int, tuple[str, str]] = {}  # id(sink): (name, reason)
        self._faults: deque[_Event] = deque(maxlen=REPLAYED)

    def add(self, sink: EventSink) -> None:
        """Forward to one more sink (the link is built after the model manager).

        The sink is told the fault events recorded so far, and, when it is a
        `SinkHealthListener`, which sinks fail now.
        """
        with self._lock:
            self._sinks.append(sink)
            replay = list(self._faults)
            failing = self._failing_names()
        if isinstance(sink, SinkHealthListener):
            sink.sinks_failing(failing)
        for event in replay:
            self._deliver(sink, *event)

    def remove(self, sink: EventSink) -> None:
        """Stop forwarding to a sink (e.g. a stopped link)."""
        with self._lock:
            self._sinks.remove(sink)
            changed = self._failing.pop(id(sink), None) is not None
        if changed:
            self._tell_listeners()

    def failing(self) -> dict[str, str]:
        """The sinks whose last `record` raised: name (class name) to reason."""
        with self._lock:
            return self._failing_names()

    def record(
        self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
    ) -> None:
        """Record the event in every sink, in order; never raises (see module docstring)."""
        with self._lock:
            if kind in FAULT_EVENTS:
                self._faults.append((model, version, kind, dict(detail)))
            sinks = list(self._sinks)
        for sink in sinks:
            self._deliver(sink, model, version, kind, detail)

    def _deliver(
        self,
        sink: EventSink,
        model: str,
        version: int | None,
        kind: str,
        detail: Mapping[str, object],
    ) -> None:
        name = type(sink).__name__
        try:
            sink.record(model, version, kind, detail)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            with self._lock:
                before = self._failing.get(id(sink))
                self._failing[id(sink)] = (name, reason)
            if before is None:
                logger.exception("event sink %s failed (event %s of %s)", name, kind, model)
            else:
                logger.warning(
                    "event sink %s still fails (event %s of %s): %s", name, kind, model, reason
                )
            if before != (name, reason):
                self._tell_listeners()
            return
        with self._lock:
            recovered = self._failing.pop(id(sink), None) is not None
        if recovered:
            logger.info("event sink %s records events again", name)
            self._tell_listeners()

    def _tell_listeners(self) -> None:
        with self._lock:
            listeners = [s for s in self._sinks if isinstance(s, SinkHealthListener)]
            failing = self._failing_names()
        for listener in listeners:
            try:
                listener.sinks_failing(failing)
            except Exception:
                logger.exception("sink health listener %s failed", type(listener).__name__)

    def _failing_names(self) -> dict[str, str]:
        return dict(self._failing.values())


def guarded(sink: EventSink | None) -> EventTee:
    """`sink` behind an `EventTee` (itself when it is one), so recording never raises."""
    if isinstance(sink, EventTee):
        return sink
    return EventTee(sink if sink is not None else LogEvents())
