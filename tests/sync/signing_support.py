"""OpenSSF Model Signing in tests: EC keys made here, bundles made by the `model-signing` lib."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
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
