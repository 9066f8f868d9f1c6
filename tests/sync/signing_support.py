"""OpenSSF Model Signing in tests: EC keys made here, bundles made by the `model-signing` lib."""

from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from model_signing import hashing, signing

from sync.model_signature import SIGNATURE_NAME, TrustedKey, key_identity


@dataclass(frozen=True)
class SigningKey:
    """A signer's key pair on disk (private key 0600, never committed: made per test)."""

    private: Path
    public: Path

    @property
    def identity(self) -> str:
        return key_identity(self.public.read_bytes())

    def trusted(self, pattern: str = "*") -> TrustedKey:
        return TrustedKey(pattern, self.public.read_bytes(), str(self.public))


def make_key(folder: Path, name: str = "ml-team") -> SigningKey:
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    private = folder / f"{name}.key"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(private, 0o600)
    public = folder / f"{name}.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return SigningKey(private, public)


def sign_folder(folder: Path, key: SigningKey) -> Path:
    """Sign `folder` as an ML team would (OMS key mode); the bundle goes to `folder/model.sig`."""
    bundle = folder / SIGNATURE_NAME
    config = signing.Config().use_elliptic_key_signer(private_key=key.private)  # type: ignore[no-untyped-call]
    config.set_hashing_config(
        hashing.Config().set_ignored_paths(paths=[SIGNATURE_NAME])  # type: ignore[no-untyped-call]
    )
    config.sign(folder, bundle)
    return bundle


def digests(folder: Path) -> dict[str, str]:
    """Every file under `folder` but the bundle: path → SHA-256 (what a device compares)."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != SIGNATURE_NAME
    }


@dataclass(frozen=True)
class CertificateSigner:
    """A CA (its certificate is what devices trust) and a signer certified by it."""

    ca: Path
    key: Path
    certificate: Path


def make_certificate_signer(folder: Path, common_name: str = "ml-team") -> CertificateSigner:
    """A self-signed CA and a code-signing certificate for `common_name` (offline, in the test)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(_usage(cert_sign=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    made = CertificateSigner(
        folder / "ca.pem", folder / f"{common_name}.key", folder / f"{common_name}.pem"
    )
    made.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    made.certificate.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    made.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(made.key, 0o600)
    return made


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )
