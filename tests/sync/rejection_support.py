"""A device for the rejection scenarios: a real agent, a real store, a real broker, a client.

The agent serves its model cache on its own event loop (`tests.mqtt_support.agent_thread`),
with the fleet link connected to a Mosquitto broker; the publisher signs versions into a bucket
of the S3-protocol server; a client thread sends inference requests throughout. Sync cycles are
driven by the test (`Device.cycle`), through the same `SyncLoop` the daemon's periodic task
runs, so "ten cycles" takes ten cycles and no sleeping.
"""

from __future__ import annotations

import http.client
import json
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config.choices import ModelControlMode
from agent.config.schema import AgentConfig, CacheConfig, ModelsConfig, ServerConfig
from agent.fleet.link import FleetLink
from agent.runtime.demo import mlp_model
from sync.client import SyncClient
from sync.fetcher import Downloader
from sync.keys import init_keys, metadata_dir
from sync.model_signature import SignatureCheck
from sync.periodic import CycleResult, SyncLoop
from sync.policy import parse_desired
from sync.provenance import ProvenanceStore
from sync.publish import Publisher
from sync.s3 import S3Store
from sync.store import S3Settings
from tests.models import write_model
from tests.mqtt_support import AgentThread, Broker, agent_thread, mqtt_config

CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""
REQUEST = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}
).encode()


def infer(port: int) -> tuple[int, str | None]:
    """One request: (HTTP status, the version that answered)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v2/models/m/infer", REQUEST, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
    finally:
        conn.close()
    return resp.status, body.get("model_version") if resp.status == 200 else None


def get_json(port: int, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, payload)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


@dataclass
class Client:
    """Sends requests one after another from a thread until stopped; records what answered."""

    port: int
    seen: list[tuple[int, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.seen.append(infer(self.port))

    def stop(self) -> list[tuple[int, str | None]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        return list(self.seen)


@dataclass
class Device:
    """The agent, its sync loop (driven by the test), its events, and the publisher."""

    served: AgentThread
    loop: SyncLoop
    publisher: Publisher
    sources: Path
    events: list[tuple[str, int | None, str, dict[str, Any]]]
    link: FleetLink

    @property
    def port(self) -> int:
        return self.served.agent.http_port

    def cycle(self) -> CycleResult:
        return self.served.run(self.loop.cycle(), timeout=120)

    def publish(self, version: int, *, broken: bool = False) -> None:
        """Sign version `version` of m: a working MLP, or (broken) bytes that are not ONNX."""
        folder = self.sources / f"v{version}"
        model = mlp_model(seed=version)
        write_model(folder, "m", model, CONFIG, (version,))
        if broken:
            (folder / "m" / str(version) / "model.onnx").write_bytes(b"signed garbage " * 64)
        self.publisher.publish("m", version, folder / "m")

    def kinds(self, kind: str) -> list[tuple[str, int | None, str, dict[str, Any]]]:
        return [e for e in self.events if e[2] == kind]


@contextmanager
def device(
    tmp_path: Path,
    s3_endpoint: str,
    broker: Broker,
    signatures: SignatureCheck | None = None,
) -> Iterator[Device]:
    """A fresh device (empty cache) and an empty signed repository, linked to the broker.

    `signatures`: the device's OMS policy and trusted keys (default: off).
    """
    repo = tmp_path / "repo"
    init_keys(repo, {})
    store = S3Store(f"r-{uuid.uuid4().hex[:16]}", "prod", S3Settings(s3_endpoint, "us-east-1"))
    store.ensure_bucket()
    publisher = Publisher(repo, store)
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(
            control_mode=ModelControlMode.EXPLICIT, load_models=("*",), intra_op_threads=1
        ),
        cache=CacheConfig(dir=tmp_path / "cache"),
    )
    with agent_thread(config) as served:
        cache = served.agent.model_cache
        versions = served.agent.dataplane.versions
        assert cache is not None
        assert versions is not None
        events: list[tuple[str, int | None, str, dict[str, Any]]] = []

        class Recorder:
            def record(
                self, model: str, version: int | None, kind: str, detail: Mapping[str, object]
            ) -> None:
                events.append((model, version, kind, dict(detail)))

        served.events.add(Recorder())
        link = FleetLink(
            mqtt_config(broker),
            served.agent.dataplane,
            served.agent.registry,
            served.agent.registry.ledger,
            tmp_path / "fleet.sqlite",
        )
        served.run(link.start())
        served.run(link.wait_subscribed(), timeout=20)
        served.events.add(link)
        client = SyncClient(
            store,
            cache,
            (metadata_dir(repo) / "1.root.json").read_bytes(),
            tmp_path / "work",
            parse_desired(["*=latest"]),
            downloader=Downloader(store, sleep=lambda _s: None),
            signatures=signatures,
            provenance=ProvenanceStore(cache.root / "sync" / "provenance"),  # where the agent reads
        )
        loop = SyncLoop(client, cache, versions.activate, events=served.events.record)
        try:
            yield Device(served, loop, publisher, tmp_path / "src", events, link)
        finally:
            served.events.remove(link)
            served.run(link.stop())
