"""Server TLS for the HTTP, metrics and gRPC listeners, with certificate rotation in place.

One `ServerTls` holds the certificate, key and (for mutual TLS) the client CA, read from files.
`reload()` (SIGHUP) reads the files again and, once they load as a pair, hands them on without a
restart:

* HTTP and metrics: the listeners share one `ssl.SSLContext`, and loading the new chain into it
  changes what each new connection is served (open connections keep theirs);
* the loop gRPC engine: its own context (ALPN "h2"), reloaded the same way;
* gRPC (grpcio): `grpc.dynamic_ssl_server_credentials` asks `_fetch` before each new
  handshake, which returns the new configuration once.

Invariant: a reload that fails (a missing file, a key that does not match the certificate)
changes nothing; the running certificate stands and the error is raised to the caller.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from agent.errors import AgentError

if TYPE_CHECKING:
    import grpc

__all__ = ["ServerTls", "TlsError", "TlsFiles"]

logger = logging.getLogger(__name__)


class TlsError(AgentError):
    """The server certificate, key or client CA cannot be loaded."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where the server's TLS material lives (`server.tls_*_file`)."""

    cert: Path
    key: Path
    client_ca: Path | None = None  # set: mutual TLS, a client certificate it signed is required


@dataclass(frozen=True, slots=True)
class _Material:
    cert: bytes
    key: bytes
    client_ca: bytes | None


class ServerTls:
    """The TLS settings of every listener of one agent (see the module doc)."""

    def __init__(self, files: TlsFiles) -> None:
        """Raises: TlsError: a file cannot be read or the key does not match the certificate."""
        self.files = files
        self._material = _read(files)
        self._context = _server_context(files)
        self._lock = threading.Lock()  # `_fetch` runs on grpc's threads
        # grpcio (the grpcio engine's extra) is imported only once its credentials are asked for.
        self._pending: _Material | None = None
        self._h2_context: ssl.SSLContext | None = None

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by the client CA."""
        return self.files.client_ca is not None

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The context of the HTTP and metrics listeners (the same object across reloads)."""
        return self._context

    def h2_ssl_context(self) -> ssl.SSLContext:
        """A context offering ALPN "h2" (gRPC clients require it) for the loop gRPC engine.

        Its own object, so the HTTP listeners' ALPN stays untouched; `reload` updates it too.
        """
        if self._h2_context is None:
            self._h2_context = _server_context(self.files)
            self._h2_context.set_alpn_protocols(["h2"])
        return self._h2_context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials that pick up each reload at the next handshake."""
        import grpc  # noqa: PLC0415 - the grpcio engine's extra, only for that engine

        # grpc's stub types the fetcher as never returning None; None means "keep the last".
        fetch = cast(Callable[[], grpc.ServerCertificateConfiguration], self._fetch)
        with self._lock:
            initial, self._pending = self._material, None
        return grpc.dynamic_ssl_server_credentials(
            _grpc_config(initial), fetch, require_client_authentication=self.mutual
        )

    def reload(self) -> None:
        """Read the files again and serve them to new connections.

        Raises:
            TlsError: the new files do not load; the running certificate stands.
        """
        material = _read(self.files)
        _server_context(self.files)  # the new pair loads, or nothing changes
        contexts = (
            [self._context] if self._h2_context is None else [self._context, self._h2_context]
        )
        try:
            for context in contexts:
                context.load_cert_chain(self.files.cert, self.files.key)
                if self.files.client_ca is not None:
                    context.load_verify_locations(cafile=self.files.client_ca)
        except (OSError, ssl.SSLError) as exc:  # replaced between the check and now
            raise TlsError(f"server TLS: cannot reload {self.files.cert}: {exc}") from None
        with self._lock:
            self._material = self._pending = material
        logger.info("server TLS: certificate %s reloaded", self.files.cert)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpc's question before a handshake: a new configuration, or None to keep the last."""
        with self._lock:
            pending, self._pending = self._pending, None
        return _grpc_config(pending) if pending is not None else None


def _read(files: TlsFiles) -> _Material:
    try:
        return _Material(
            files.cert.read_bytes(),
            files.key.read_bytes(),
            files.client_ca.read_bytes() if files.client_ca is not None else None,
        )
    except OSError as exc:
        raise TlsError(f"server TLS: cannot read {exc.filename}: {exc.strerror}") from None


def _server_context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(
            f"server TLS: cannot load certificate {files.cert} with key {files.key}: {exc}"
        ) from None
    if files.client_ca is not None:
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"server TLS: cannot load client CA {files.client_ca}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _grpc_config(material: _Material) -> grpc.ServerCertificateConfiguration:
    import grpc  # noqa: PLC0415 - see `ServerTls.grpc_credentials`

    return grpc.ssl_server_certificate_configuration(
        [(material.key, material.cert)], root_certificates=material.client_ca
    )
