"""The pure OMS check (`sync.model_signature`) on real bundles made by `model-signing`."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
from model_signing import hashing, signing

from sync.model_signature import (
    SignatureCheck,
    SignaturePolicy,
    TrustedCA,
    compare_files,
    parse_policy,
    parse_trusted_signers,
    verify_signature,
)
from tests.sync.signing_support import (
    SigningKey,
    digests,
    make_certificate_signer,
    make_key,
    sign_folder,
)
from tests.sync.support import make_model, payload


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys")


@pytest.fixture
def signed(tmp_path: Path, key: SigningKey) -> Path:
    folder = make_model(tmp_path / "src", "resnet", 1, payload(1))
    sign_folder(folder, key)
    return folder


def check(folder: Path, key: SigningKey, model: str = "resnet") -> tuple[bool, str]:
    verdict = verify_signature(
        model, (folder / "model.sig").read_bytes(), digests(folder), [key.trusted()]
    )
    return verdict.ok, verdict.reason


def test_a_valid_signature_names_its_signer(signed: Path, key: SigningKey) -> None:
    bundle = (signed / "model.sig").read_bytes()
    verdict = verify_signature("resnet", bundle, digests(signed), [key.trusted()])
    assert verdict.ok, verdict.reason
    assert verdict.signer == key.identity
    assert len(verdict.bundle_sha256) == 64


def test_a_file_changed_after_signing_is_refused(signed: Path, key: SigningKey) -> None:
    (signed / "1" / "model.onnx").write_bytes(b"swapped")
    assert check(signed, key) == (False, "changed after signing: 1/model.onnx")


def test_a_file_added_after_signing_is_refused(signed: Path, key: SigningKey) -> None:
    (signed / "1" / "extra.bin").write_bytes(b"x")
    assert check(signed, key) == (False, "not covered by the signature: 1/extra.bin")


def test_a_file_removed_after_signing_is_refused(signed: Path, key: SigningKey) -> None:
    (signed / "config.pbtxt").unlink()
    assert check(signed, key) == (False, "signed but missing: config.pbtxt")


def test_a_signature_by_an_untrusted_key_is_refused(
    signed: Path, key: SigningKey, tmp_path: Path
) -> None:
    other = make_key(tmp_path / "other", "ops")
    verdict = verify_signature(
        "resnet", (signed / "model.sig").read_bytes(), digests(signed), [other.trusted()]
    )
    assert not verdict.ok
    assert verdict.reason == f"signed by {key.identity}, which is not trusted for resnet"


def test_a_key_trusted_for_other_models_only_is_untrusted(signed: Path, key: SigningKey) -> None:
    check_ = SignatureCheck(SignaturePolicy.REQUIRE, (key.trusted("bert*"),))
    verdict = check_.verdict("resnet", (signed / "model.sig").read_bytes(), digests(signed))
    assert "not trusted for resnet" in verdict.reason


def test_no_bundle_is_refused(signed: Path, key: SigningKey) -> None:
    verdict = verify_signature("resnet", None, digests(signed), [key.trusted()])
    assert (verdict.ok, verdict.reason) == (
        False,
        "no model signature (model.sig) was published with it",
    )


def test_a_bundle_copied_from_another_model_is_refused(
    tmp_path: Path, signed: Path, key: SigningKey
) -> None:
    other = make_model(tmp_path / "other", "bert", 1, payload(1))  # the very same files
    sign_folder(other, key)
    shutil.copy(other / "model.sig", signed / "model.sig")
    assert check(signed, key) == (False, "the signature is for model 'bert', not 'resnet'")


def test_a_tampered_statement_does_not_verify(signed: Path, key: SigningKey) -> None:
    doc = json.loads((signed / "model.sig").read_text())
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "0" * 64
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (signed / "model.sig").write_text(json.dumps(doc))
    ok, reason = check(signed, key)
    assert not ok
    assert reason.startswith("the signature does not verify"), reason


def test_garbage_is_not_a_bundle(signed: Path, key: SigningKey) -> None:
    (signed / "model.sig").write_bytes(b"\x00not json")
    assert check(signed, key) == (False, "model.sig: not a Sigstore bundle (not JSON)")


def test_compare_files_names_a_few_and_counts_the_rest() -> None:
    present = {f"1/f{i}": "a" for i in range(5)}
    assert compare_files({}, present) == [
        "not covered by the signature: 1/f0, 1/f1, 1/f2 and 2 more"
    ]


def test_trusted_signers_and_policy_are_parsed(key: SigningKey, tmp_path: Path) -> None:
    [trusted] = parse_trusted_signers([f"res*={key.public}"])
    assert (trusted.pattern, trusted.identity) == ("res*", key.identity)
    assert parse_policy("Require") is SignaturePolicy.REQUIRE
    with pytest.raises(ValueError, match="must be off, warn or require"):
        parse_policy("strict")
    with pytest.raises(ValueError, match="PATTERN=KEY_FILE"):
        parse_trusted_signers([str(key.public)])
    with pytest.raises(ValueError, match="not a PEM public key"):
        parse_trusted_signers([f"*={key.private}"])
    with pytest.raises(ValueError, match="cannot read"):
        parse_trusted_signers([f"*={tmp_path / 'missing.pub'}"])


def test_certificate_mode_chains_to_a_trusted_ca_and_names_its_signer(tmp_path: Path) -> None:
    team = make_certificate_signer(tmp_path / "team", "ml-team")
    folder = make_model(tmp_path / "src", "resnet", 1, payload(1))
    config = signing.Config().use_certificate_signer(  # type: ignore[no-untyped-call]
        private_key=team.key, signing_certificate=team.certificate, certificate_chain=[team.ca]
    )
    config.set_hashing_config(
        hashing.Config().set_ignored_paths(paths=["model.sig"])  # type: ignore[no-untyped-call]
    )
    config.sign(folder, folder / "model.sig")
    bundle = (folder / "model.sig").read_bytes()
    ca = team.ca.read_bytes()
    verdict = verify_signature("resnet", bundle, digests(folder), [TrustedCA("*", ca)])
    assert (verdict.ok, verdict.signer) == (True, "certificate CN=ml-team"), verdict.reason
    [parsed] = parse_trusted_signers([f"res*={team.ca}#ml-team"])
    assert verify_signature("resnet", bundle, digests(folder), [parsed]).ok
    wrong_name = verify_signature("resnet", bundle, digests(folder), [TrustedCA("*", ca, "ops")])
    assert wrong_name.reason == "signed by certificate CN=ml-team, which is not trusted for resnet"
    other = make_certificate_signer(tmp_path / "other", "ml-team")
    foreign = TrustedCA("*", other.ca.read_bytes())
    refused = verify_signature("resnet", bundle, digests(folder), [foreign])
    assert not refused.ok
    assert "whose certificate does not chain to a trusted CA" in refused.reason
    (folder / "1" / "model.onnx").write_bytes(b"changed")
    changed = verify_signature("resnet", bundle, digests(folder), [TrustedCA("*", ca)])
    assert changed.reason == "changed after signing: 1/model.onnx"
