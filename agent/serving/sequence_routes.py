"""Which loaded version a live sequence belongs to, so that it ends where it started.

A hot swap routes new requests to the new build at once; a sequence started on the old build
keeps its slot and state there until it ends or idles out (the old build drains meanwhile). Its
START request records the version here; its later requests look it up before the usual routing.
Only a scheduler that declares it keeps sequences (`Scheduler.sequences`) is asked.
"""

from __future__ import annotations

from agent.models.served import ServedModel
from agent.scheduling.protocol import Scheduler
from agent.scheduling.sequence_policy import CorrelationId, SequenceRequest

_SWEEP_ABOVE = 4096  # routes kept before the stale ones (idled-out sequences) are swept


class SequenceRoutes:
    """(model, correlation id) → the served model and version number its sequence runs on."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, CorrelationId], tuple[ServedModel, int]] = {}

    def __len__(self) -> int:
        return len(self._routes)

    def find(self, name: str, sequence: SequenceRequest | None) -> tuple[ServedModel, int] | None:
        """The version a continuing request of a live sequence must go to, if it is known."""
        if sequence is None or sequence.start:
            return None
        key = (name, sequence.correlation_id)
        route = self._routes.get(key)
        if route is None:
            return None
        served, number = route
        loaded = served.versions.get(number)
        if loaded is None or not _owns(loaded.scheduler, sequence.correlation_id):
            del self._routes[key]
            return None
        return route

    def started(
        self, name: str, sequence: SequenceRequest | None, served: ServedModel, number: int
    ) -> None:
        """Remember where a sequence started (or forget it when it ended)."""
        if sequence is None:
            return
        key = (name, sequence.correlation_id)
        if sequence.end:
            self._routes.pop(key, None)
        elif sequence.start:
            self._routes[key] = (served, number)
            if len(self._routes) > _SWEEP_ABOVE:
                self._sweep()

    def _sweep(self) -> None:
        for key, (served, number) in list(self._routes.items()):
            loaded = served.versions.get(number)
            if loaded is None or not _owns(loaded.scheduler, key[1]):
                del self._routes[key]


def _owns(scheduler: Scheduler, corrid: CorrelationId) -> bool:
    """Whether the sequence lives on this scheduler (one that declares it keeps sequences)."""
    sequences = scheduler.sequences
    return sequences is not None and sequences.owns(corrid)
