"""What a Python model's workers send besides answers: log lines, custom metrics, metric queries.

A worker may send these at any time, before any answer (`agent.backends.python.worker.main` says
when): `pb_utils.Logger` lines (LOG) go to the agent's log with the model's name; custom metrics
(METRICS, `pb_utils.MetricFamily`) go to the agent's `CustomMetricStore`, under a source per
worker process, released when that worker ends; `Metric.value()` (METRIC_VALUE) is answered from
that store, the total of every instance.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from agent.backends.python import ipc
from agent.backends.python.custom_metrics import CustomMetricStore
from agent.backends.python.process import Worker

# The Python backend's logger: model log lines are under its name, where operators filter them.
logger = logging.getLogger("agent.backends.python.backend")

# pb_utils.Logger levels → the agent's log levels (Triton's VERBOSE is our DEBUG).
_LOG_LEVELS = {
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "VERBOSE": logging.DEBUG,
}


class SideMessages:
    """Handles the side messages of one model version's workers."""

    def __init__(
        self,
        name: str,
        version: int,
        custom_metrics: CustomMetricStore | None,
        send: Callable[[Worker, ipc.Message], None],
    ) -> None:
        """`send` answers a worker (a metric query), through its decoupled channel if any."""
        self._name = name
        self._version = version
        self._custom_metrics = custom_metrics
        self._send = send

    def receive(self, worker: Worker, deadline: float | None) -> ipc.Message:
        """The worker's next answer, read from its pipe; side messages before it are handled.

        Raises:
            TimeoutError, EOFError, OSError, ipc.WireError: as `ipc.receive`.
        """
        while True:
            message = self.receive_one(worker, deadline)
            if message is not None:
                return message

    def receive_one(self, worker: Worker, deadline: float | None) -> ipc.Message | None:
        """The worker's next message; None when it was a log line, metrics or a metric query
        (handled here).

        Raises:
            TimeoutError, EOFError, OSError, ipc.WireError: as `ipc.receive`.
        """
        message = ipc.receive(worker.conn, deadline)
        return None if self.handle(worker, message) else message

    def handle(self, worker: Worker, message: ipc.Message) -> bool:
        """Handle a LOG, METRICS, METRIC_VALUE or PONG message (True); any other is for the
        caller."""
        if message.kind == ipc.PONG:
            number = message.meta.get("n")
            if isinstance(number, int) and number > worker.pongs:
                worker.pongs = number
        elif message.kind == ipc.METRICS:
            self._apply_metrics(worker, message)
        elif message.kind == ipc.METRIC_VALUE:
            self._answer_metric_value(worker, message)
        elif message.kind != ipc.LOG:
            return False
        else:
            meta = message.meta
            logger.log(
                _LOG_LEVELS.get(str(meta.get("level")), logging.INFO),
                "python model %s (%s, %s:%s): %s",
                self._name,
                worker.name,
                os.path.basename(str(meta.get("file", ""))),
                meta.get("line", 0),
                meta.get("message", ""),
                extra={"model": self._name, "version": self._version},
            )
        return True

    def release(self, worker: Worker) -> None:
        """Drop the worker's custom metric series (it ended), as Triton does."""
        if self._custom_metrics is not None:
            self._custom_metrics.release(self._metrics_source(worker))

    def _metrics_source(self, worker: Worker) -> str:
        return f"{self._name}/{self._version}/{worker.name}/{worker.process.pid}"

    def _apply_metrics(self, worker: Worker, message: ipc.Message) -> None:
        """Custom metrics (pb_utils.MetricFamily) from a worker go to the agent's store."""
        if self._custom_metrics is None:
            return
        for problem in self._custom_metrics.apply(self._metrics_source(worker), message.meta):
            logger.warning(
                "python model %s (%s): %s",
                self._name,
                worker.name,
                problem,
                extra={"model": self._name, "version": self._version},
            )

    def _answer_metric_value(self, worker: Worker, message: ipc.Message) -> None:
        """`Metric.value()` in a worker: the total of every instance, from the agent's store."""
        meta = message.meta
        value = None
        labels = meta.get("labels")
        if self._custom_metrics is not None and isinstance(labels, dict):
            value = self._custom_metrics.value(str(meta.get("family", "")), labels)
        reply = {"id": meta.get("id"), "value": value}
        self._send(worker, ipc.Message(ipc.METRIC_VALUE_RESULT, reply))
