"""Pure rules: signed version shape, desired state, plans."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from tuf.api.metadata import TargetFile

from sync.errors import SyncConfigError, UnsafeTargetError
from sync.policy import (
    CachedVersion,
    Choice,
    Desired,
    Kind,
    SignedVersion,
    choose,
    group_targets,
    parse_desired,
    plan,
)


def _target(
    path: str, data: bytes, model: str = "m", version: int = 1, config: str = ""
) -> TargetFile:
    info = TargetFile(len(data), {"sha256": hashlib.sha256(data).hexdigest()}, path)
    cfg = config or hashlib.sha256(b"cfg").hexdigest()
    info.unrecognized_fields = {
        "custom": {"model": model, "version": version, "config_sha256": cfg}
    }
    return info


def _version(model: str, version: int) -> dict[str, TargetFile]:
    files = {
        f"{model}/{version}/config.pbtxt": _target(
            f"{model}/{version}/config.pbtxt", b"cfg", model, version
        ),
        f"{model}/{version}/{version}/model.onnx": _target(
            f"{model}/{version}/{version}/model.onnx", b"w%d" % version, model, version
        ),
    }
    return files


def test_parse_desired() -> None:
    assert parse_desired(["*=latest", "a=3", "b=2,1"]) == {
        "*": Desired(Kind.LATEST),
        "a": Desired(Kind.PINNED, (3,)),
        "b": Desired(Kind.LIST, (1, 2)),
    }


@pytest.mark.parametrize("entry", ["a", "a=", "a=x", "a=0", "../x=latest", "a=-1"])
def test_parse_desired_refuses(entry: str) -> None:
    with pytest.raises(SyncConfigError):
        parse_desired([entry])


def test_group_targets_builds_versions() -> None:
    grouped = group_targets({**_version("m", 1), **_version("m", 2)})
    assert sorted(grouped) == [("m", 1), ("m", 2)]
    assert [f.rel for f in grouped[("m", 2)].files] == ["config.pbtxt", "2/model.onnx"]
    assert grouped[("m", 1)].manifest_digest != grouped[("m", 2)].manifest_digest


@pytest.mark.parametrize(
    "path",
    [
        "m/1/../../x",
        "/m/1/1/model.onnx",
        "m/1/1//model.onnx",
        "m/1/./model.onnx",
        "m/01/01/model.onnx",
        "m/1/2/model.onnx",
        "m/1/other.txt",
        "m\\1\\1\\model.onnx",
        "m/1",
    ],
)
def test_unsafe_paths_are_refused(path: str) -> None:
    targets = _version("m", 1)
    targets[path] = _target(path, b"x")
    with pytest.raises(UnsafeTargetError):
        group_targets(targets)


def test_custom_fields_must_match_the_path() -> None:
    targets = _version("m", 1)
    targets["m/1/1/extra.bin"] = _target("m/1/1/extra.bin", b"x", model="other")
    with pytest.raises(UnsafeTargetError, match="custom model/version"):
        group_targets(targets)


def test_config_digest_must_match_the_signed_config() -> None:
    targets = _version("m", 1)
    targets["m/1/1/extra.bin"] = _target("m/1/1/extra.bin", b"x", config="0" * 64)
    with pytest.raises(UnsafeTargetError, match="config digests"):
        group_targets(targets)


def test_plan_latest_pinned_and_list() -> None:
    signed = group_targets({**_version("m", 1), **_version("m", 2), **_version("n", 4)})
    todo = plan(signed, parse_desired(["*=latest", "n=4"]), {})
    assert [(v.model, v.version) for v in todo.fetch] == [("m", 2), ("n", 4)]
    assert todo.activate == (("m", 2), ("n", 4))
    todo = plan(signed, parse_desired(["m=1,2"]), {})
    assert [(v.model, v.version) for v in todo.fetch] == [("m", 1), ("m", 2)]
    assert todo.activate == (("m", 2),)


def test_plan_skips_what_the_cache_serves() -> None:
    signed = group_targets(_version("m", 1))
    cached = {"m": [CachedVersion(1, signed[("m", 1)].manifest_digest, active=True)]}
    todo = plan(signed, parse_desired(["m=latest"]), cached)
    assert todo.fetch == ()
    assert todo.activate == ()


def test_plan_activates_a_retained_version_without_fetching() -> None:
    signed = group_targets({**_version("m", 1), **_version("m", 2)})
    digest = signed[("m", 1)].manifest_digest
    cached = {"m": [CachedVersion(1, digest, active=False)]}
    todo = plan(signed, parse_desired(["m=1"]), cached)
    assert todo.fetch == ()
    assert todo.activate == (("m", 1),)


def test_plan_refuses_unsigned_and_foreign_versions() -> None:
    signed = group_targets(_version("m", 1))
    todo = plan(signed, parse_desired(["m=5", "x=latest"]), {})
    assert todo.fetch == ()
    assert [m for m, _r in todo.errors] == ["m", "x"]
    foreign = {"m": [CachedVersion(1, "f" * 64, active=True)]}
    todo = plan(signed, parse_desired(["m=1"]), foreign)
    assert todo.fetch == ()
    assert "not the signed one" in todo.errors[0][1]


def _signed(*versions: int) -> dict[tuple[str, int], SignedVersion]:
    targets: dict[str, TargetFile] = {}
    for version in versions:
        targets.update(_version("m", version))
    return group_targets(targets)


def _cached(signed: dict[tuple[str, int], SignedVersion], active: int, *held: int) -> Any:
    return {
        "m": [
            CachedVersion(v, signed[("m", v)].manifest_digest, active=v == active)
            for v in sorted({active, *held})
        ]
    }


def test_latest_skips_a_rejected_newest_and_serves_the_one_below() -> None:
    signed = _signed(1, 2)
    todo = plan(signed, parse_desired(["*=latest"]), _cached(signed, 1), {"m": {2: "bad"}})
    assert todo.fetch == ()
    assert todo.activate == ()  # version 1 already serves: nothing to do, nothing to retry
    assert todo.errors == ()
    [choice] = todo.choices
    assert (choice.model, choice.version) == ("m", 1)
    assert "version(s) [2] rejected; 2: bad" in choice.why


def test_latest_fetches_the_fallback_a_fresh_device_lacks() -> None:
    signed = _signed(1, 2, 3)
    rejected = {"m": {3: "does not load", 2: "rolled back"}}
    todo = plan(signed, parse_desired(["m=latest"]), {}, rejected)
    assert [(v.model, v.version) for v in todo.fetch] == [("m", 1)]
    assert todo.activate == (("m", 1),)


def test_a_newer_version_is_not_blocked_by_an_older_rejection() -> None:
    signed = _signed(1, 2, 3)
    todo = plan(signed, parse_desired(["*=latest"]), _cached(signed, 1, 2), {"m": {2: "bad"}})
    assert [v.version for v in todo.fetch] == [3]
    assert todo.activate == (("m", 3),)
    assert todo.choices[0].why == "the newest signed version"


def test_a_rejected_active_version_is_replaced_by_the_choice() -> None:
    signed = _signed(1, 2)
    todo = plan(signed, parse_desired(["*=latest"]), _cached(signed, 2, 1), {"m": {2: "x"}})
    assert todo.activate == (("m", 1),)


def test_every_version_rejected_is_an_error_and_changes_nothing() -> None:
    signed = _signed(1, 2)
    todo = plan(signed, parse_desired(["*=latest"]), _cached(signed, 2), {"m": {1: "a", 2: "b"}})
    assert (todo.fetch, todo.activate, todo.choices) == ((), (), ())
    assert todo.errors == (
        (
            "m",
            "every signed version of m is rejected on this device (newest, 2: b); "
            "clear a rejection to serve it",
        ),
    )


def test_pinned_and_lists_never_fall_back_to_unnamed_versions() -> None:
    signed = _signed(1, 2, 3)
    todo = plan(signed, parse_desired(["m=3"]), {}, {"m": {3: "bad"}})
    assert (todo.fetch, todo.activate) == ((), ())
    assert "version(s) [3] of m are rejected" in todo.errors[0][1]
    todo = plan(signed, parse_desired(["m=1,3"]), {}, {"m": {3: "bad"}})
    assert [v.version for v in todo.fetch] == [1]
    assert todo.activate == (("m", 1),)
    assert todo.choices[0].why.endswith("(version(s) [3] rejected)")


def test_choose_is_the_rule_on_its_own() -> None:
    latest = Desired(Kind.LATEST)
    assert choose("m", latest, [1, 2, 3], {}) == ((3,), Choice("m", 3, "the newest signed version"))
    picked = choose("m", latest, [1, 2, 3], {3: "x", 1: "y"})
    assert not isinstance(picked, str)
    assert (picked[0], picked[1].version) == ((2,), 2)
    assert isinstance(choose("m", latest, [1], {1: "x"}), str)
