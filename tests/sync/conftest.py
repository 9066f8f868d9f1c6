from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from model_cache import ModelCache
from sync.keys import init_keys
from sync.s3 import S3Store
from sync.store import FileStore, S3Settings
from tests.mqtt_support import Broker
from tests.sync.support import HttpFaults, World, http_server

_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-protocol server on a free loopback port, for the whole session."""
    saved = {k: os.environ.get(k) for k in _AWS_ENV}
    os.environ.update(_AWS_ENV)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_store(s3_endpoint: str) -> S3Store:
    """A fresh bucket per test, under a prefix."""
    store = S3Store(
        f"t-{uuid.uuid4().hex[:16]}", "fleet/prod", S3Settings(s3_endpoint, "us-east-1")
    )
    store.ensure_bucket()
    return store


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    init_keys(tmp_path / "repo", {})
    return tmp_path / "repo"


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[ModelCache]:
    with ModelCache(tmp_path / "cache", verify_on_open=False) as opened:
        yield opened


@pytest.fixture
def world(repo: Path, s3_store: S3Store, cache: ModelCache, tmp_path: Path) -> World:
    """Publisher and device on the S3-protocol server."""
    return World(repo, s3_store, cache, tmp_path / "work", tmp_path / "src")


@pytest.fixture
def folder_world(repo: Path, cache: ModelCache, tmp_path: Path) -> World:
    """Publisher and device on a plain folder (file://)."""
    return World(repo, FileStore(tmp_path / "bucket"), cache, tmp_path / "work", tmp_path / "src")


@pytest.fixture
def http_faults() -> HttpFaults:
    return HttpFaults()


@pytest.fixture
def http_url(tmp_path: Path, http_faults: HttpFaults) -> Iterator[str]:
    """A plain HTTP server (Range, injected faults) serving `tmp_path / 'bucket'`."""
    (tmp_path / "bucket").mkdir(exist_ok=True)
    server, url = http_server(tmp_path / "bucket", http_faults)
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto broker of this test's own (the end-to-end tests skip without mosquitto)."""
    server = Broker(tmp_path / "broker")
    server.start()
    try:
        yield server
    finally:
        server.stop()
