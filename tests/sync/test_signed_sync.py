"""Model signatures through the signed repository: the ML team signs, ops publishes, devices check.

Real parts: OMS bundles made by the `model-signing` library with keys made here, the publisher
signing TUF metadata into a bucket of the S3-protocol server, a device cache syncing from it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from model_cache import ModelCache
from sync.errors import PublishError
from sync.model_signature import SignatureCheck, SignaturePolicy
from sync.provenance import ProvenanceStore
from tests.sync.signing_support import SigningKey, make_key, sign_folder
from tests.sync.support import World, active, make_model, payload


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys")


def folder(world: World, version: int, key: SigningKey | None, model: str = "m") -> Path:
    """Version `version` of a model as the ML team hands it over (signed when `key` is given)."""
    made = make_model(world.sources / f"{model}-v{version}", model, version, payload(version))
    if key is not None:
        sign_folder(made, key)
    return made


def device_sync(world: World, check: SignatureCheck) -> tuple[tuple[str, int, str], ...]:
    """One cycle on the device; activate what it says; return what it refused."""
    report = world.client(signatures=check).sync_once()
    for model, version in report.activate:
        world.cache.activate(model, version)
    return report.refused


def require(key: SigningKey) -> SignatureCheck:
    return SignatureCheck(SignaturePolicy.REQUIRE, (key.trusted("m*"),))


def serving_1_then_publish(world: World, key: SigningKey, version_2: Path) -> None:
    """v1 (valid) serves; then v2 is published as given (the publisher holds no signer key)."""
    world.publisher.publish("m", 1, folder(world, 1, key), signers=[key.trusted()])
    assert device_sync(world, require(key)) == ()
    assert active(world.cache, "m") == 1
    world.publisher.publish("m", 2, version_2)


def assert_refused(world: World, key: SigningKey, why: str) -> None:
    refused = device_sync(world, require(key))
    assert [(m, v) for m, v, _r in refused] == [("m", 2)]
    assert why in refused[0][2], refused
    assert active(world.cache, "m") == 1  # the active version keeps serving
    assert [v.version for v in world.cache.list_versions("m")] == [1]  # v2 never installed
    [rejection] = world.cache.rejections.entries("m")
    assert (rejection.version, rejection.cause.value) == (2, "failed")
    assert rejection.reason.startswith("model signature refused: ")
    assert why in rejection.reason
    assert device_sync(world, require(key)) == ()  # rejected: not downloaded again
    assert active(world.cache, "m") == 1


def test_a_valid_signature_installs_and_records_its_signer(world: World, key: SigningKey) -> None:
    report = world.publisher.publish("m", 1, folder(world, 1, key), signers=[key.trusted()])
    assert report.files == 3  # config, model, model.sig
    targets = world.local("targets").signed.targets
    record = targets["m/1/config.pbtxt"].custom["model_signature"]
    assert record["signer"] == key.identity
    assert record["verified_by_publisher"] is True
    assert record["bundle_sha256"] == targets["m/1/model.sig"].hashes["sha256"]
    assert device_sync(world, require(key)) == ()
    assert active(world.cache, "m") == 1
    served = world.cache.active_version("m")
    assert served is not None
    assert not (served.path / "model.sig").exists()  # checked, not installed
    found = ProvenanceStore(world.work / "provenance").get("m", 1)
    assert found is not None
    assert (found.signer, found.verified, found.policy) == (key.identity, True, "require")


def test_a_file_changed_after_signing_is_refused(world: World, key: SigningKey) -> None:
    v2 = folder(world, 2, key)
    (v2 / "2" / "model.onnx").write_bytes(payload(99))
    serving_1_then_publish(world, key, v2)
    assert_refused(world, key, "changed after signing: 2/model.onnx")


def test_a_file_added_after_signing_is_refused(world: World, key: SigningKey) -> None:
    v2 = folder(world, 2, key)
    (v2 / "2" / "labels.txt").write_text("cat\ndog\n")
    serving_1_then_publish(world, key, v2)
    assert_refused(world, key, "not covered by the signature: 2/labels.txt")


def test_a_file_removed_after_signing_is_refused(world: World, key: SigningKey) -> None:
    v2 = make_model(world.sources / "v2", "m", 2, payload(2))
    (v2 / "2" / "weights.bin").write_bytes(b"w" * 100)
    sign_folder(v2, key)
    (v2 / "2" / "weights.bin").unlink()
    serving_1_then_publish(world, key, v2)
    assert_refused(world, key, "signed but missing: 2/weights.bin")


def test_a_signature_by_an_untrusted_key_is_refused(
    world: World, key: SigningKey, tmp_path: Path
) -> None:
    intruder = make_key(tmp_path / "intruder", "intruder")
    serving_1_then_publish(world, key, folder(world, 2, intruder))
    assert_refused(world, key, f"signed by {intruder.identity}, which is not trusted for m")


def test_a_missing_signature_is_refused_under_require(world: World, key: SigningKey) -> None:
    serving_1_then_publish(world, key, folder(world, 2, None))
    assert_refused(world, key, "no model signature (model.sig) was published with it")


def test_a_bundle_copied_from_another_model_is_refused(world: World, key: SigningKey) -> None:
    other = folder(world, 2, key, model="mx")
    v2 = folder(world, 2, None)
    shutil.copy(other / "model.sig", v2 / "model.sig")
    serving_1_then_publish(world, key, v2)
    assert_refused(world, key, "the signature is for model 'mx', not 'm'")


def test_warn_installs_and_reports(world: World, key: SigningKey, cache: ModelCache) -> None:
    world.publisher.publish("m", 1, folder(world, 1, None))
    warn = SignatureCheck(SignaturePolicy.WARN, (key.trusted(),))
    report = world.client(signatures=warn).sync_once()
    assert report.refused == ()
    assert report.unverified == (("m", 1, "no model signature (model.sig) was published with it"),)
    assert report.activate == (("m", 1),)
    assert cache.rejections.entries() == []
    found = ProvenanceStore(world.work / "provenance").get("m", 1)
    assert found is not None
    assert (found.verified, found.policy) == (False, "warn")
    assert "no model signature" in found.reason


def test_off_records_what_the_publisher_signed(world: World, key: SigningKey) -> None:
    world.publisher.publish("m", 1, folder(world, 1, key), signers=[key.trusted()])
    assert device_sync(world, SignatureCheck()) == ()
    found = ProvenanceStore(world.work / "provenance").get("m", 1)
    assert found is not None
    assert (found.signer, found.verified, found.policy) == (key.identity, False, "off")


def test_publish_requiring_a_signature_refuses_what_is_not_validly_signed(
    world: World, key: SigningKey, tmp_path: Path
) -> None:
    with pytest.raises(PublishError, match=r"no model signature: .*model\.sig is missing"):
        world.publisher.publish(
            "m", 1, folder(world, 1, None), require_signature=True, signers=[key.trusted()]
        )
    tampered = folder(world, 2, key)
    (tampered / "config.pbtxt").write_text('name: "m"\nplatform: "onnxruntime_onnx"\n')
    with pytest.raises(PublishError, match=r"changed after signing: config\.pbtxt"):
        world.publisher.publish("m", 2, tampered, signers=[key.trusted()])
    with pytest.raises(PublishError, match="needs the signers' public keys"):
        world.publisher.publish("m", 3, folder(world, 3, key), require_signature=True)
    other = make_key(tmp_path / "o", "other")
    with pytest.raises(PublishError, match="not trusted for m"):
        world.publisher.publish("m", 4, folder(world, 4, key), signers=[other.trusted()])
    assert not (world.repo / "metadata" / "targets.json").exists()  # nothing was signed
