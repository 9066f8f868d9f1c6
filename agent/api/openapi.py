"""The OpenAPI 3 description of the HTTP API, assembled from the JSON files in `openapi/`.

`openapi/base.json` holds the document's header and the shared components (the `Error` body,
the common responses and path parameters). Every other `*.json` file there describes one area of
the API: `{"paths": {...}, "components": {...}}`. To describe a new route, add its path entry to
the area's file, or add a file for a new area; the files are merged in name order. Two files
describing the same method of the same path, or the same component differently, are an error, so
a merge of two branches cannot silently drop a description. A test keeps the paths in step with
the aiohttp router.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

_FOLDER = "openapi"
_BASE = "base.json"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


class OpenApiMergeError(ValueError):
    """Two description files disagree (the same operation or component twice)."""


@functools.cache
def openapi_bytes() -> bytes:
    """The whole document as compact JSON, built once (what GET /v2/openapi.json sends)."""
    return json.dumps(openapi_document(), separators=(",", ":")).encode()


def openapi_document() -> dict[str, Any]:
    """The whole document: `base.json` with every other file's paths and components merged in.

    Raises:
        OpenApiMergeError: an operation or a component is described twice, differently.
    """
    folder = resources.files(__package__).joinpath(_FOLDER)
    doc: dict[str, Any] = json.loads(folder.joinpath(_BASE).read_text(encoding="utf-8"))
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    for name in names:
        if name != _BASE:
            part = json.loads(folder.joinpath(name).read_text(encoding="utf-8"))
            merge(doc, part, name)
    return doc


def merge(doc: dict[str, Any], part: dict[str, Any], source: str) -> None:
    """Merge one area's `paths` and `components` into `doc`, refusing any overlap.

    Raises:
        OpenApiMergeError: `part` describes a method of a path, or a component, that `doc`
            already has (a component repeated identically is accepted).
    """
    unknown = set(part) - {"paths", "components"}
    if unknown:
        raise OpenApiMergeError(
            f"{source}: only 'paths' and 'components' may be given, not {unknown}"
        )
    paths: dict[str, Any] = doc.setdefault("paths", {})
    for path, item in part.get("paths", {}).items():
        have = paths.setdefault(path, {})
        for key, value in item.items():
            if key in have and (key in _METHODS or have[key] != value):
                raise OpenApiMergeError(f"{source}: {key.upper()} {path} is already described")
            have[key] = value
    components: dict[str, Any] = doc.setdefault("components", {})
    for kind, entries in part.get("components", {}).items():
        have = components.setdefault(kind, {})
        for name, value in entries.items():
            if name in have and have[name] != value:
                raise OpenApiMergeError(f"{source}: component {kind}/{name} is already defined")
            have[name] = value
