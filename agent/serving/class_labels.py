"""The labels of a model's outputs (`label_filename` in the config, one label per line), read for
the classification extension (`agent.tensors.classification`) and kept until the file changes."""

from __future__ import annotations

import logging
from pathlib import Path

from agent.models.served import ServedModel

logger = logging.getLogger(__name__)


class ClassLabels:
    """Reads each label file once (again when its modification time changes)."""

    def __init__(self) -> None:
        self._read: dict[Path, tuple[int, tuple[str, ...]]] = {}

    def of(self, served: ServedModel, output: str) -> tuple[str, ...]:
        """The labels of `output`, by class index; () when it has none or they cannot be read
        (the classes are then answered without labels)."""
        name = next((o.label_filename for o in served.config.output if o.name == output), "")
        if not name or served.source is None:
            return ()
        path = served.source / name
        try:
            stamp = path.stat().st_mtime_ns
            known = self._read.get(path)
            if known is not None and known[0] == stamp:
                return known[1]
            labels = tuple(path.read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            logger.warning("model %s: labels of output %s unreadable: %s", served.name, output, exc)
            return ()
        self._read[path] = (stamp, labels)
        return labels
