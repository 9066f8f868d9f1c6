"""What signed TUF metadata and cache manifests hand to our own code, refused cleanly.

Properties: `group_targets` accepts a target set only when every path lands inside its model
version's folder (else `UnsafeTargetError`); `Manifest.from_bytes` returns a manifest whose paths
are all inside the version, or raises `InvalidVersionError`; `parse_desired` returns policies or
raises `SyncConfigError`. Nothing else escapes, and no accepted path leaves its folder.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from tuf.api.metadata import TargetFile

from model_cache import InvalidVersionError
from model_cache.manifest import Manifest
from sync.errors import SyncConfigError, UnsafeTargetError
from sync.policy import group_targets, parse_desired
from tests.fuzz.budget import FUZZ
from tests.fuzz.strategies import JSON, assert_reason, nested

_CONFIG_SHA = hashlib.sha256(b"config").hexdigest()
_SEGMENTS = st.sampled_from(
    ["resnet", "1", "2", "01", "config.pbtxt", "model.onnx", "..", ".", "", "a\\b", "\x00", "-1",
     "\u0661", "\u00b2", ".tmp-x", "x" * 256, "/"]
) | st.text(max_size=5)  # fmt: skip


def _inside(root: str, rel: str) -> bool:
    joined = posixpath.normpath(posixpath.join(root, rel))
    return joined.startswith(root + "/") and "\x00" not in rel


@st.composite
def _targets(draw: st.DrawFn) -> dict[str, TargetFile]:
    targets: dict[str, TargetFile] = {}
    for _ in range(draw(st.integers(1, 4))):
        path = "/".join(draw(st.lists(_SEGMENTS, min_size=1, max_size=5)))
        if draw(st.booleans()):
            path = draw(st.sampled_from(["resnet/1/config.pbtxt", "resnet/1/model.onnx"]))
        parts = path.split("/")
        version: Any = (
            int(parts[1]) if len(parts) > 1 and parts[1].isascii() and parts[1].isdigit() else 1
        )
        custom: Any = {"model": parts[0], "version": version, "config_sha256": _CONFIG_SHA}
        if draw(st.booleans()):
            custom = draw(
                st.fixed_dictionaries(
                    {}, optional={"model": JSON, "version": JSON, "config_sha256": JSON}
                )
                | JSON
            )
        hashes = {"sha256": _CONFIG_SHA if path.endswith("config.pbtxt") else "ab" * 32}
        targets[path] = TargetFile(draw(st.integers(0, 2**40)), hashes, path, {"custom": custom})
    return targets


@FUZZ
@given(_targets())
def test_signed_targets_land_inside_their_version_or_are_refused(
    targets: dict[str, TargetFile],
) -> None:
    try:
        grouped = group_targets(targets)
    except UnsafeTargetError as exc:
        assert_reason(exc)
        return
    for (model, version), signed in grouped.items():
        root = f"/cache/{model}"
        assert "/" not in model
        assert model not in (".", "..")
        assert version >= 1
        for item in signed.files:
            assert _inside(root, item.rel)
            assert item.rel == "config.pbtxt" or item.rel.startswith(f"{version}/")
        assert len(signed.manifest_digest) == 64


@st.composite
def _manifest(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = {
        "format": draw(st.sampled_from([1, 2, "1", True])),
        "model": draw(st.sampled_from(["resnet", "..", "a/b", ""]) | JSON),
        "version": draw(st.sampled_from([1, 0, -1, True, 10**18, "1"]) | JSON),
        "dirs": draw(
            st.lists(st.sampled_from(["1", "1/sub", "..", "2", "/1"]) | JSON, max_size=3) | JSON
        ),
        "files": draw(
            st.dictionaries(
                st.sampled_from(
                    ["config.pbtxt", "1/model.onnx", "../1/x", "1/../../x", "2/x", "1/.tmp-x"]
                )
                | st.text(max_size=6),
                st.fixed_dictionaries(
                    {
                        "digest": st.sampled_from(["ab" * 32, "AB" * 32, "x"]) | JSON,
                        "size": st.integers(-1, 2**63) | JSON,
                    }
                )
                | JSON,
                max_size=3,
            )
            | JSON
        ),
    }
    for key in draw(st.lists(st.sampled_from(sorted(body)), max_size=1)):
        del body[key]
    return json.dumps(body).encode()


def _manifest_or_refused(data: bytes) -> None:
    try:
        manifest = Manifest.from_bytes(data)
    except InvalidVersionError as exc:
        assert_reason(exc)
        return
    root = f"/cache/{manifest.model}/{manifest.version}-x"
    for entry in manifest.files:
        assert _inside(root, entry.path)
    for folder in manifest.dirs:
        assert _inside(root, folder)


@FUZZ
@given(_manifest())
def test_manifests_list_paths_inside_the_version_or_are_refused(data: bytes) -> None:
    _manifest_or_refused(data)


@FUZZ
@given(st.binary(max_size=200))
@example(nested(100_000).encode())  # found: json.loads raised RecursionError
def test_manifest_bytes_are_parsed_or_refused(data: bytes) -> None:
    _manifest_or_refused(data)


@FUZZ
@given(
    st.lists(
        st.text(max_size=12)
        | st.sampled_from(["*=latest", "m=1,2", "m=0", "=", "m=" + "9" * 5000]),
        max_size=3,
    )
)
def test_desired_entries_are_parsed_or_refused(entries: list[str]) -> None:
    try:
        desired = parse_desired(entries)
    except SyncConfigError as exc:
        assert_reason(exc)
        return
    for policy in desired.values():
        assert all(v >= 1 for v in policy.versions)
