"""Throw-away certificates for the TLS tests, made with `cryptography` in each test's tmp_path.

A CA signs a server certificate (for 127.0.0.1, ::1 and localhost) and a client certificate;
`ssl_serial` reads the serial a listener serves to a fresh connection.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path

    @property
    def cert_bytes(self) -> bytes:
        return self.cert.read_bytes()

    @property
    def key_bytes(self) -> bytes:
        return self.key.read_bytes()


@dataclass(frozen=True)
class _Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(
    common: str,
    issuer: _Issued | None,
    *,
    serial: int,
    ca: bool = False,
    server: bool = False,
) -> _Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(issuer.cert.subject if issuer else _name(common))
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    signer = issuer.key if issuer else key
    return _Issued(builder.sign(signer, hashes.SHA256()), key)


def _write(issued: _Issued, folder: Path, stem: str) -> Pem:
    cert = folder / f"{stem}.crt"
    key = folder / f"{stem}.key"
    cert.write_bytes(issued.cert.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        issued.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Pem(cert, key)


class TestPki:
    """A CA in `folder` that issues server and client certificates."""

    __test__ = False  # not a pytest class

    def __init__(self, folder: Path, name: str = "test-ca") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._ca = _issue(name, None, serial=1, ca=True)
        self.ca = _write(self._ca, folder, name)

    def server(self, serial: int, stem: str = "server") -> Pem:
        """A server certificate for 127.0.0.1, ::1 and localhost with this serial."""
        return _write(_issue("edge-agent", self._ca, serial=serial, server=True), self.folder, stem)

    def client(self, serial: int = 7, stem: str = "client") -> Pem:
        return _write(_issue("technician", self._ca, serial=serial), self.folder, stem)


def served_serial(port: int, ca: Path, *, alpn: str | None = None) -> int:
    """The serial of the certificate a listener on 127.0.0.1:port shows a fresh connection."""
    context = ssl.create_default_context(cafile=str(ca))
    if alpn is not None:
        context.set_alpn_protocols([alpn])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)
