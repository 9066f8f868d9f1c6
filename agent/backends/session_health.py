"""The health of an in-process session (ONNX Runtime, TensorRT): one that fails at run time is
rebuilt, with the same back-off and restart limit as a Python model's workers.

A run that raises says little by itself: the request's own data may be what the model cannot
take (an index out of range, a shape the engine's profile refuses). So a failed run is judged by
a probe: one run of the model on zeros of its smallest shape. The probe is known to work when
it passed once at load; a model whose probe never passed has its run failures counted as the
requests' own (logged, never a restart: nothing can tell them apart).

* The probe passes: the request failed alone (it gets its error); the session is healthy. A
  failure within `PROBE_EVERY_S` of a probe that passed is taken as its request's own too.
* The probe fails too: the session is DOWN (`agent.backends.health.VersionHealth`, one instance
  named "session"): the version is not ready, runs wait for the rebuild (at most
  `REBUILD_WAIT_S`), and after the back-off the backend builds a new session and probes it. One
  that passes serves; one that fails is one more failure in a row, up to the restart limit,
  after which the version gives up (UNAVAILABLE, with the reason).

Thread-safe: the executor's threads run and report; one probe runs at a time (a failure while
another thread probes waits for its verdict); the rebuild runs on a thread of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agent.backends.health import (
    ChangeKind,
    HealthChange,
    HealthListener,
    HealthState,
    RestartPolicy,
    VersionHealth,
)
from agent.errors import AgentError, ModelNotReadyError

__all__ = ["REBUILD_WAIT_S", "SessionGuard"]

logger = logging.getLogger(__name__)

REBUILD_WAIT_S = 30.0  # a run waits this long for a session being rebuilt, then fails (503)
# A failure this soon after a probe that passed is taken as its request's own without probing
# again: a client sending bad inputs in a loop costs one probe a second, not one each.
PROBE_EVERY_S = 1.0


class SessionGuard:
    """Judges the run failures of one session and rebuilds it (module docstring)."""

    def __init__(
        self,
        label: str,
        policy: RestartPolicy,
        *,
        probe: Callable[[], None],
        rebuild: Callable[[], None],
        listener: HealthListener | None = None,
        probe_ok: bool = True,
    ) -> None:
        """`probe` runs the model on zeros (raises on failure); `rebuild` replaces the session
        (raises AgentError); `probe_ok`: the probe passed at load (else failures are the
        requests' own)."""
        self._label = label  # "model 'm' version 1 (onnxruntime)"
        self._probe = probe
        self._rebuild = rebuild
        self._listener = listener
        self._probe_ok = probe_ok
        self._health = VersionHealth(["session"], policy, time.monotonic())
        self._cond = threading.Condition()
        self._probing = threading.Lock()
        self._closed = False
        self._timer: threading.Thread | None = None
        self._passed_at = -PROBE_EVERY_S  # when a probe last passed (`time.monotonic()`)

    @property
    def state(self) -> HealthState:
        return self._health.state

    def baseline(self, probe_ok: bool) -> None:
        """Whether the probe passed at load (set once the session can run)."""
        self._probe_ok = probe_ok

    def wait_ready(self) -> None:
        """Before a run: return at once while the session serves; wait (bounded) while it is
        rebuilt.

        Raises:
            ModelNotReadyError: it is not back within `REBUILD_WAIT_S`, it gave up, or the
                backend closed.
        """
        state = self._health.state
        if state.ready:
            return
        deadline = time.monotonic() + REBUILD_WAIT_S
        with self._cond:
            while not self._health.state.ready:
                state = self._health.state
                left = deadline - time.monotonic()
                if state.gave_up or self._closed or left <= 0:
                    raise ModelNotReadyError(f"{self._label} is not serving: {state.reason}")
                self._cond.wait(left)

    def failed(self, error: BaseException) -> None:
        """A run raised `error` (the caller re-raises it): probe the session, and take it out
        if the probe fails too."""
        if not self._probe_ok or self._closed:
            return
        with self._probing:  # one probe at a time; the others wait for its verdict
            if not self._health.state.ready:
                return  # another thread's probe found it broken
            if time.monotonic() - self._passed_at < PROBE_EVERY_S:
                return
            try:
                self._probe()
            except Exception as exc:  # noqa: BLE001 - any failure of the probe is the verdict
                reason = (
                    f"a run failed ({_text(error)}) and the health probe failed too ({_text(exc)})"
                )
                with self._cond:
                    change = self._health.failed(0, reason, time.monotonic())
                self._tell(change)
                self._schedule()
            else:
                self._passed_at = time.monotonic()

    def close(self) -> None:
        """No more rebuilds; runs waiting for one fail."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _schedule(self) -> None:
        with self._cond:
            due = self._health.next_due()
        if due is None or self._closed:
            return
        self._timer = threading.Thread(
            target=self._rebuild_at, args=(due,), name=f"rebuild-{self._label}", daemon=True
        )
        self._timer.start()

    def _rebuild_at(self, due: float) -> None:
        with self._cond:
            while not self._closed and time.monotonic() < due:
                self._cond.wait(max(0.0, due - time.monotonic()))
            if self._closed or not self._health.due(time.monotonic()):
                return
        try:
            self._rebuild()
            self._probe()
        except Exception as exc:  # noqa: BLE001 - a rebuild that fails in any way is a failure
            text = exc.message if isinstance(exc, AgentError) else _text(exc)
            with self._cond:
                change = self._health.restart_failed(0, text, time.monotonic())
                self._cond.notify_all()
            self._tell(change)
            self._schedule()
            return
        with self._cond:
            change = self._health.restarted(0, time.monotonic())
            self._cond.notify_all()
        self._tell(change)

    def _tell(self, change: HealthChange | None) -> None:
        if change is None:
            return
        if change.kind is ChangeKind.FAILED:
            logger.error(
                "%s: %s; rebuilding the session in %.1f s",
                self._label,
                change.reason,
                change.restart_in_s or 0.0,
            )
        elif change.kind is ChangeKind.RESTARTED:
            logger.info("%s: the session was rebuilt and serves again", self._label)
        else:
            logger.error("%s: %s", self._label, change.reason)
        if self._listener is not None:
            try:
                self._listener(change)
            except Exception:  # a listener's bug must not stop the rebuild
                logger.exception("%s: health listener failed", self._label)


def _text(exc: BaseException) -> str:
    return exc.message if isinstance(exc, AgentError) else f"{type(exc).__name__}: {exc}"
