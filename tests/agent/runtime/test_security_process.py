"""`edge-agent serve` off loopback as a process: the start-up warning, `--strict-security`, and a
TLS certificate and a restricted header value rotated by SIGHUP."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import AgentLog, wait_until
from tests.tls_certs import Pem, TestPki, served_serial

LISTENING = re.compile(r"listening on https?://[^:]+:(\d+)")
GRPC = re.compile(r"gRPC on [^:]+:(\d+)")


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent", "serve", "--metrics-port", "-1", *args]


@contextmanager
def _serving(*args: str) -> Iterator[tuple[subprocess.Popen[str], AgentLog]]:
    proc = subprocess.Popen(_command(*args), stderr=subprocess.PIPE, text=True)
    log = AgentLog(proc)
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
        assert proc.stderr is not None
        proc.stderr.close()


def test_beyond_loopback_without_protection_warns_at_start(tmp_path: Path) -> None:
    args = ("--host", "0.0.0.0", "--http-port", "0", "--grpc-port", "0")
    with _serving(*args, "--model-repository", str(tmp_path)) as (_, log):
        log.wait_for(LISTENING)
        text = "".join(log.lines)
    assert "server.host = 0.0.0.0 is beyond loopback without TLS" in text
    assert "HTTP control groups open (model-repository, cache, canary, shared-memory)" in text
    assert "gRPC control groups open" in text


def test_strict_security_refuses_to_start_naming_what_to_fix(tmp_path: Path) -> None:
    done = subprocess.run(
        _command(
            "--host",
            "0.0.0.0",
            "--http-port",
            "0",
            "--grpc-port",
            "-1",
            "--model-repository",
            str(tmp_path),
            "--strict-security",
            "--http-restricted-api",
            "model-repository,cache,canary,shared-memory:admin-key=s3cret",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("edge-agent: error: server.strict_security refuses to start")
    assert "server.tls_cert_file" in lines[0]
    assert "http_restricted_api" not in lines[0]  # restricted already: only TLS is missing
    assert "s3cret" not in done.stderr


def _rotate(pki: TestPki, live: Pem, serial: int) -> None:
    """Replace the served files the way a certificate tool does: write aside, then rename."""
    fresh = pki.server(serial=serial, stem=f"next-{serial}")
    os.replace(fresh.key, live.key)
    os.replace(fresh.cert, live.cert)


def _index_status(port: int, ca: Path, value: str) -> int:
    """POST /v2/repository/index over https with the admin header set to `value`."""
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/v2/repository/index",
        data=b"{}",
        headers={"admin-key": value},
    )
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def _restrict(config: Path, value: str) -> None:
    config.write_text(f'[server]\nhttp_restricted_api = ["model-repository:admin-key={value}"]\n')


def test_a_rotated_certificate_and_header_value_apply_after_sighup(tmp_path: Path) -> None:
    pki = TestPki(tmp_path / "pki")
    live = pki.server(serial=100)
    config = tmp_path / "agent.toml"
    _restrict(config, "one")
    args = (
        "--config",
        str(config),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--model-repository",
        str(tmp_path / "pki"),  # no model folders: nothing to load
        "--tls-cert-file",
        str(live.cert),
        "--tls-key-file",
        str(live.key),
    )
    with _serving(*args) as (proc, log):
        http_port = int(log.wait_for(LISTENING).group(1))
        grpc_port = int(log.wait_for(GRPC).group(1))
        assert served_serial(http_port, pki.ca.cert) == 100
        assert served_serial(grpc_port, pki.ca.cert, alpn="h2") == 100
        assert _index_status(http_port, pki.ca.cert, "one") == 200
        _rotate(pki, live, 200)
        _restrict(config, "two")
        proc.send_signal(signal.SIGHUP)
        log.wait_for(re.compile(r"config reload done"))
        assert served_serial(http_port, pki.ca.cert) == 200
        assert _index_status(http_port, pki.ca.cert, "one") == 403
        assert _index_status(http_port, pki.ca.cert, "two") == 200
        # grpc asks for the new configuration at the next handshake.
        wait_until(
            lambda: served_serial(grpc_port, pki.ca.cert, alpn="h2") == 200,
            "gRPC serving the new certificate",
        )
        # A rotation to files that do not match keeps the running certificate.
        live.key.write_bytes(pki.server(serial=300, stem="stray").key_bytes)
        proc.send_signal(signal.SIGHUP)
        log.wait_for(re.compile(r"keeping the running TLS certificate"))
        assert served_serial(http_port, pki.ca.cert) == 200
        assert proc.poll() is None
