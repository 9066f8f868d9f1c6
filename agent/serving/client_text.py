"""Keeps the device's own paths out of what clients read.

Load failures carry the file a runtime refused (`onnxruntime cannot load /srv/models/m/1/...`),
which is what the log needs and what a remote client must not learn. Before a message leaves
over HTTP or gRPC, each private root (the repository, the model cache) is cut from it, leaving
the path inside the repository (`m/1/model.onnx`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


class PathScrubber:
    """Removes the given directories (as written and as resolved) from messages."""

    def __init__(self, roots: Iterable[Path]) -> None:
        spelled: set[str] = set()
        for root in roots:
            for form in (str(root), os.path.realpath(root)):
                if form not in ("", "/", "."):
                    spelled.add(form.rstrip("/"))
        # The longest first: a root inside another is cut whole.
        self._roots = sorted(spelled, key=len, reverse=True)

    def __call__(self, message: str) -> str:
        for root in self._roots:
            if root in message:
                message = message.replace(root + "/", "").replace(root, "<repository>")
        return message
