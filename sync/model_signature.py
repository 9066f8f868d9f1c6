"""OpenSSF Model Signing (OMS): who produced a model version's files, checked against a trust list.

TUF (the rest of this package) proves that a version comes from the fleet's publisher and is the
newest; an OMS signature proves who made the files: an ML team signs its Triton model folder
(`edge-agent sign-model`, the `model-signing` library), and the detached bundle (`model.sig`, a
Sigstore bundle holding a DSSE-signed in-toto statement that lists every file's SHA-256) is
published next to the files as the target `MODEL/VERSION/model.sig`.

    trusted = parse_trusted_signers(["resnet*=/etc/edge-agent/ml-team.pub"])
    verdict = verify_signature("resnet", bundle_bytes, {"config.pbtxt": "ab12...", ...},
                               trusted_for("resnet", trusted))
    verdict.ok, verdict.signer, verdict.reason

`verify_signature` is pure: it takes the bundle's bytes and the files' SHA-256 digests (on a
device, the digests python-tuf has just verified the downloads against; nothing is read again)
and returns a `Verdict`. The signature itself is checked by the `model-signing` library's own
verifier; this module only decides what counts as a match.

Rules (all must hold for `Verdict.ok`):
    * a bundle is there, parses, and is signed by a key trusted for this model (a signer's
      patterns are shell-style, as `sync.desired`'s `*`); its identity is `key sha256:HEX`, the
      SHA-256 of the public key's PEM (OMS's own key hint);
    * the signature verifies (DSSE over the in-toto statement);
    * the statement names this model (the folder's name is the model's name: a bundle copied
      from another model is refused even when the files happen to agree);
    * it uses OMS's `files` serialization with SHA-256, and lists exactly the version's files:
      none changed, none added, none missing (the bundle itself is not one of them).
"""

from __future__ import annotations

import base64
import enum
import fnmatch
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cryptography import x509

# cryptography (~8 MiB of RSS) is imported by the functions that read keys and certificates:
# the config loader imports this module for every agent, most of which check no signature.

SIGNATURE_NAME = "model.sig"  # OMS's default name for the detached bundle
MAX_BUNDLE_BYTES = 4 * 1024 * 1024  # one resource line per file: 10,000 files fit easily
_SHOWN = 3  # file names quoted in a refusal


class SignaturePolicy(enum.Enum):
    """What a device does with a version whose OMS signature is missing, invalid or untrusted."""

    OFF = "off"  # not checked (the publisher's record is still reported)
    WARN = "warn"  # checked; a failure is logged and reported, the version installed anyway
    REQUIRE = "require"  # checked; a failure refuses the version


@dataclass(frozen=True, slots=True)
class TrustedKey:
    """A public key trusted to sign the models whose names match `pattern`."""

    pattern: str
    public_pem: bytes  # SubjectPublicKeyInfo PEM, as `edge-agent sign-model` users publish it
    source: str = ""  # where it was read from, for messages

    @property
    def identity(self) -> str:
        """The signer's identity: `key sha256:HEX` (OMS's key hint)."""
        return key_identity(self.public_pem)


@dataclass(frozen=True, slots=True)
class TrustedCA:
    """CA certificates trusted to certify signers of the models whose names match `pattern`.

    A bundle signed in certificate mode is trusted when its signing certificate chains to one of
    them (and may sign: key usage), and, when `identity` is set, names that signer: its subject
    (RFC 4514, e.g. `CN=ml-team,O=Example`) or its common name.
    """

    pattern: str
    ca_pem: bytes
    identity: str = ""
    source: str = ""

    def admits(self, subject: str, common_name: str) -> bool:
        """Whether a signing certificate with this subject is one this entry names."""
        return not self.identity or self.identity in (subject, common_name)


#: One entry of the trust list: a public key, or CA certificates (with an optional identity).
TrustedSigner = TrustedKey | TrustedCA


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking one version's OMS signature."""

    ok: bool
    reason: str = ""  # why not ok (one line); empty when ok
    signer: str = ""  # `key sha256:HEX` once the bundle names a key (even an untrusted one)
    bundle_sha256: str = ""  # SHA-256 of the bundle's bytes; empty without a bundle

    def to_json(self) -> dict[str, Any]:
        """The fields as plain JSON values."""
        return {
            "ok": self.ok,
            "reason": self.reason,
            "signer": self.signer,
            "bundle_sha256": self.bundle_sha256,
        }


def key_identity(public_pem: bytes) -> str:
    """A public key's identity as OMS records it in a bundle (`key sha256:HEX`).

    Args:
        public_pem: The key in SubjectPublicKeyInfo PEM.

    Returns:
        `key sha256:` and the SHA-256 of the PEM bytes.
    """
    return f"key sha256:{hashlib.sha256(public_pem).hexdigest()}"


def load_public_key(data: bytes, source: str) -> bytes:
    """Check a trusted signer's public key and return it in OMS's canonical PEM form.

    Args:
        data: PEM bytes (an EC public key on P-256, P-384 or P-521, as OMS signs with).
        source: Where it came from, for the message.

    Raises:
        ValueError: Not a PEM public key, or not a curve OMS signs with.

    Returns:
        The key as SubjectPublicKeyInfo PEM (what OMS hashes into its key hint).
    """
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - see the imports
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise ValueError(f"trusted_model_signers: {source}: not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in (
        "secp256r1",
        "secp384r1",
        "secp521r1",
    ):
        raise ValueError(f"trusted_model_signers: {source}: OMS keys are EC P-256, P-384 or P-521")
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def parse_trusted_signers(entries: Iterable[str]) -> tuple[TrustedSigner, ...]:
    """Read the `[sync] trusted_model_signers` list.

    Args:
        entries: `PATTERN=PUBLIC_KEY_FILE` (`resnet*=/etc/edge-agent/ml-team.pub`), or
            `PATTERN=CA_FILE[#IDENTITY]` for certificate-mode signers (a PEM file of CA
            certificates; IDENTITY: the signing certificate's RFC 4514 subject or common name).
            A model may match several patterns: any of their signers is trusted for it.

    Raises:
        ValueError: A malformed entry, or a file that cannot be read or is neither an OMS
            public key nor PEM certificates.

    Returns:
        The trusted signers, in the order given.
    """
    trusted: list[TrustedSigner] = []
    for entry in entries:
        pattern, sep, rest = (part.strip() for part in entry.partition("="))
        path, _hash, identity = (part.strip() for part in rest.partition("#"))
        if not sep or not pattern or not path:
            raise ValueError(f"trusted_model_signers entry {entry!r} must be PATTERN=KEY_FILE")
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"trusted_model_signers: cannot read {path}: {exc.strerror}") from None
        if b"-----BEGIN CERTIFICATE-----" in data:
            from cryptography import x509  # noqa: PLC0415 - see the imports

            try:
                x509.load_pem_x509_certificates(data)
            except ValueError:
                raise ValueError(f"trusted_model_signers: {path}: bad PEM certificates") from None
            trusted.append(TrustedCA(pattern, data, identity, path))
        elif identity:
            raise ValueError(f"trusted_model_signers: {path}: #IDENTITY goes with CA certificates")
        else:
            trusted.append(TrustedKey(pattern, load_public_key(data, path), path))
    return tuple(trusted)


def trusted_for(model: str, trusted: Sequence[TrustedSigner]) -> tuple[TrustedSigner, ...]:
    """The keys trusted to sign `model` (its name matches their pattern)."""
    return tuple(t for t in trusted if fnmatch.fnmatchcase(model, t.pattern))


def bundle_signer(bundle: bytes) -> str:
    """The identity a bundle claims (`key sha256:HEX`), without verifying anything.

    Args:
        bundle: The bundle's bytes.

    Raises:
        ValueError: Not an OMS bundle signed with a key or a certificate.

    Returns:
        The claimed signer: `key sha256:HEX`, or `certificate SUBJECT` (RFC 4514).
    """
    doc = _bundle_json(bundle)
    hint = doc["verificationMaterial"].get("publicKey", {}).get("hint")
    if isinstance(hint, str) and hint:
        return f"key sha256:{hint}"
    leaf = _signing_certificate(doc)
    if leaf is not None:
        return f"certificate {leaf.subject.rfc4514_string()}"
    raise ValueError("the bundle names no signing key (re-sign with a current model-signing)")


def verify_signature(
    model: str,
    bundle: bytes | None,
    files: Mapping[str, str],
    trusted: Sequence[TrustedSigner],
) -> Verdict:
    """Check a model version's OMS signature against its files and the trusted signers (pure).

    Args:
        model: The model's name (the signed statement must name it).
        bundle: The `model.sig` bundle's bytes, or None when the version has none.
        files: Every file of the version (path in the Triton model folder, e.g.
            `config.pbtxt`, `2/model.onnx`) → its SHA-256 hex digest; not the bundle itself.
        trusted: The signers trusted for this model (`trusted_for`).

    Returns:
        The verdict: ok, or why not (missing, invalid, untrusted, or which files differ).
    """
    if bundle is None:
        return Verdict(False, f"no model signature ({SIGNATURE_NAME}) was published with it")
    digest = hashlib.sha256(bundle).hexdigest()
    if len(bundle) > MAX_BUNDLE_BYTES:
        return Verdict(False, f"{SIGNATURE_NAME} is over {MAX_BUNDLE_BYTES} bytes", "", digest)
    try:
        signer = bundle_signer(bundle)
    except ValueError as exc:
        return Verdict(False, f"{SIGNATURE_NAME}: {exc}", "", digest)
    candidates = _candidates(bundle, signer, trusted)
    if not candidates:
        return Verdict(
            False, f"signed by {signer}, which is not trusted for {model}", signer, digest
        )
    failures = []
    for candidate in candidates:
        try:
            resources, name, method = _verified_statement(bundle, candidate)
            break
        except _UntrustedChainError as exc:
            failures.append(f"signed by {signer}, whose certificate {exc}")
        except ValueError as exc:
            failures.append(f"the signature does not verify: {exc}")
    else:
        return Verdict(False, failures[0], signer, digest)
    if name != model:
        return Verdict(False, f"the signature is for model {name!r}, not {model!r}", signer, digest)
    if method != ("files", "sha256"):
        return Verdict(
            False,
            f"unsupported OMS serialization {method[0]}/{method[1]}: sign with files/sha256",
            signer,
            digest,
        )
    differences = compare_files(resources, files)
    if differences:
        return Verdict(False, "; ".join(differences), signer, digest)
    return Verdict(True, "", signer, digest)


def compare_files(signed: Mapping[str, str], present: Mapping[str, str]) -> list[str]:
    """What differs between the files a signature lists and the files there are.

    Args:
        signed: Path → SHA-256 as the signed statement lists them.
        present: Path → SHA-256 of the version's files.

    Returns:
        One phrase per kind of difference (changed, not signed, missing); empty when equal.
    """
    changed = sorted(p for p in signed.keys() & present.keys() if signed[p] != present[p])
    added = sorted(present.keys() - signed.keys())
    missing = sorted(signed.keys() - present.keys())
    found = []
    if changed:
        found.append(f"changed after signing: {_names(changed)}")
    if added:
        found.append(f"not covered by the signature: {_names(added)}")
    if missing:
        found.append(f"signed but missing: {_names(missing)}")
    return found


def _names(paths: list[str]) -> str:
    more = f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else ""
    return ", ".join(paths[:_SHOWN]) + more


def _bundle_json(bundle: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(bundle)
    except (UnicodeDecodeError, ValueError):
        raise ValueError("not a Sigstore bundle (not JSON)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("verificationMaterial"), dict):
        raise ValueError("not a Sigstore bundle (no verificationMaterial)")
    return doc


class _UntrustedChainError(ValueError):
    """A signing certificate that does not chain to the trusted CA certificates."""


def _candidates(
    bundle: bytes, signer: str, trusted: Sequence[TrustedSigner]
) -> list[TrustedSigner]:
    """The trusted entries that could vouch for this bundle's signer."""
    if signer.startswith("key "):
        return [t for t in trusted if isinstance(t, TrustedKey) and t.identity == signer]
    leaf = _signing_certificate(_bundle_json(bundle))
    if leaf is None:
        return []
    from cryptography.x509.oid import NameOID  # noqa: PLC0415 - see the imports

    names = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    common_name = str(names[0].value) if names else ""
    subject = leaf.subject.rfc4514_string()
    return [t for t in trusted if isinstance(t, TrustedCA) and t.admits(subject, common_name)]


def _signing_certificate(doc: dict[str, Any]) -> x509.Certificate | None:
    """The bundle's signing (leaf) certificate, when it was signed in certificate mode."""
    from cryptography import x509  # noqa: PLC0415 - see the imports

    chain = doc["verificationMaterial"].get("x509CertificateChain")
    if chain is None:
        return None
    try:
        raw = base64.b64decode(chain["certificates"][0]["rawBytes"])
        return x509.load_der_x509_certificate(raw)
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValueError("the bundle's certificate chain is malformed") from None


def _verified_statement(
    bundle: bytes, signer: TrustedSigner
) -> tuple[dict[str, str], str, tuple[str, str]]:
    """Verify the bundle with `signer` (the library does) → (resources, model name, method)."""
    # Imported here: the library (and sigstore behind it) loads only when a signature is checked.
    from cryptography import x509  # noqa: PLC0415 - see the imports
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from model_signing._signing import (  # noqa: PLC0415
        sign_certificate,
        sign_ec_key,
        sign_sigstore_pb,
    )
    from OpenSSL import crypto  # noqa: PLC0415 - the library's certificate chain check
    from sigstore_models.bundle import v1 as bundle_pb  # noqa: PLC0415

    class _KeyVerifier(sign_ec_key.Verifier):
        """The library's key verifier, given the key itself rather than a file."""

        def __init__(self, public_pem: bytes) -> None:
            self._public_key = serialization.load_pem_public_key(public_pem)

    class _CertificateVerifier(sign_certificate.Verifier):
        """The library's certificate verifier, given the CA certificates rather than files."""

        def __init__(self, ca_pem: bytes) -> None:
            self._log_fingerprints = False
            self._store = crypto.X509Store()
            for certificate in x509.load_pem_x509_certificates(ca_pem):
                self._store.add_cert(crypto.X509.from_cryptography(certificate))

    doc = _bundle_json(bundle)
    doc["verificationMaterial"].setdefault("tlogEntries", [])  # as `Signature.read` normalizes
    verifier: sign_sigstore_pb.Verifier = (
        _KeyVerifier(signer.public_pem)
        if isinstance(signer, TrustedKey)
        else _CertificateVerifier(signer.ca_pem)
    )
    try:
        signature = sign_sigstore_pb.Signature(bundle_pb.Bundle.from_dict(doc))
        manifest = verifier.verify(signature)
    except crypto.X509StoreContextError as exc:
        raise _UntrustedChainError(f"does not chain to a trusted CA ({exc})") from None
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - cryptography / pydantic / KeyError on bad input
        raise ValueError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
    args = manifest.serialization_type
    method = (str(args.get("method", "")), str(args.get("hash_type", "")))
    resources = {str(r.identifier): r.digest.digest_hex for r in manifest.resource_descriptors()}
    return resources, str(manifest.model_name), method


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """A device's OMS settings: the policy and the trusted keys (`[sync]`)."""

    policy: SignaturePolicy = SignaturePolicy.OFF
    trusted: tuple[TrustedSigner, ...] = ()

    def verdict(self, model: str, bundle: bytes | None, files: Mapping[str, str]) -> Verdict:
        """`verify_signature` with the keys trusted for `model`."""
        return verify_signature(model, bundle, files, trusted_for(model, self.trusted))


def parse_policy(text: str) -> SignaturePolicy:
    """`off`, `warn` or `require` (the `[sync] model_signature_policy` setting).

    Raises:
        ValueError: Anything else.
    """
    try:
        return SignaturePolicy(text.strip().lower())
    except ValueError:
        raise ValueError(
            f"model_signature_policy must be off, warn or require, got {text!r}"
        ) from None
