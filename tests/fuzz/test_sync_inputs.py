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


_MANIFEST_FILES = st.dictionaries(
    st.sampled_from(
        ["config.pbtxt", "1/model.onnx", "../1/x", "1/../../x", "2/x", "1/.tmp-x", "/1/x", "1//x"]
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
# What a hostile or broken publisher could put in each field.
_HOSTILE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "format": st.sampled_from([2, "1", True, None]) | JSON,
    "model": st.sampled_from(["..", ".", "a/b", "", "a\\b"]) | JSON,
    "version": st.sampled_from([0, -1, True, 10**18, "1", 1.5]) | JSON,
    "dirs": st.lists(st.sampled_from(["1", "1/sub", "..", "2", "/1", "1/../.."]) | JSON, max_size=3)
    | JSON,
    "files": _MANIFEST_FILES | JSON,
}


@st.composite
def _manifest(draw: st.DrawFn) -> bytes:
    """A manifest a publisher writes (version folder, config, files with digests and sizes),
    then up to two fields replaced by hostile values or left out: about half stay valid, so
    the accepted branch of the property is exercised too."""
    version = draw(st.integers(1, 3))
    inside = st.sampled_from(["config.pbtxt", f"{version}/model.onnx", f"{version}/sub/w.bin"])
    body: dict[str, Any] = {
        "format": 1,
        "model": draw(st.sampled_from(["resnet", "m-1", "a.b_c"])),
        "version": version,
        "dirs": draw(st.lists(st.sampled_from([str(version), f"{version}/sub"]), unique=True)),
        "files": draw(
            st.dictionaries(
                inside,
                st.fixed_dictionaries(
                    {"digest": st.just("ab" * 32), "size": st.integers(0, 2**40)}
                ),
                max_size=3,
            )
        ),
    }
    for key in draw(st.lists(st.sampled_from(sorted(body)), max_size=2, unique=True)):
        if draw(st.booleans()):
            del body[key]
        else:
            body[key] = draw(_HOSTILE_FIELDS[key])
    return json.dumps(body).encode()


def _manifest_or_refused(data: bytes) -> None:
    try:
        manifest = Manifest.from_bytes(data)
    except InvalidVersionError as exc:
        assert_reason(exc)
        return
    root = f"/cache/{manifest.model}/{manifest.version}-x"
    for path in [entry.path for entry in manifest.files] + list(manifest.dirs):
        assert _inside(root, path), path
        assert path == "config.pbtxt" or path.split("/")[0] == str(manifest.version), path
    assert all(entry.size >= 0 for entry in manifest.files)


_PUBLISHED = json.dumps(
    {
        "format": 1,
        "model": "resnet",
        "version": 1,
        "dirs": ["1"],
        "files": {
            "config.pbtxt": {"digest": "ab" * 32, "size": 7},
            "1/model.onnx": {"digest": "cd" * 32, "size": 9},
        },
    }
).encode()


@FUZZ
@given(_manifest())
@example(_PUBLISHED)  # accepted: the paths are checked on every run
@example(_PUBLISHED.replace(b'"1/model.onnx"', b'"2/model.onnx"'))  # another version's folder
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
