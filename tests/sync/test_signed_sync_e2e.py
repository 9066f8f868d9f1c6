"""Model signatures on a running device: the signer shows, a tampered version never serves.

Real parts: the agent (HTTP, ONNX Runtime, model cache, fleet link to a Mosquitto broker), the
S3-protocol server, OMS bundles made by the `model-signing` library, a client sending requests.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.manager.cli import FleetClient
from agent.runtime.demo import mlp_model
from sync.model_signature import SignatureCheck, SignaturePolicy
from tests.models import write_model
from tests.mqtt_support import Broker
from tests.sync.rejection_support import CONFIG, Client, Device, device, get_json, infer
from tests.sync.signing_support import SigningKey, make_key, sign_folder

pytestmark = pytest.mark.skipif(
    not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()),
    reason="mosquitto is not installed (make test installs it)",
)


def publish_signed(dev: Device, version: int, key: SigningKey, *, tamper: bool = False) -> None:
    """The ML team signs version `version` of m; ops publishes it (holding no signer key)."""
    folder = dev.sources / f"signed-v{version}"
    write_model(folder, "m", mlp_model(seed=version), CONFIG, (version,))
    sign_folder(folder / "m", key)
    if tamper:  # swapped after signing: a valid model, just not the one the team signed
        other = dev.sources / "other"
        write_model(other, "m", mlp_model(seed=99), CONFIG, (version,))
        shutil.copy(other / "m" / str(version) / "model.onnx", folder / "m" / str(version))
    dev.publisher.publish("m", version, folder / "m")


def test_signer_is_shown_and_a_tampered_version_is_refused_while_the_signed_one_serves(
    tmp_path: Path, s3_endpoint: str, broker: Broker
) -> None:
    key = make_key(tmp_path / "keys")
    check = SignatureCheck(SignaturePolicy.REQUIRE, (key.trusted("m"),))
    with device(tmp_path, s3_endpoint, broker, check) as dev:
        publish_signed(dev, 1, key)
        dev.cycle()
        assert infer(dev.port)[1] == "1"
        rows = {
            r["version"]: r for r in get_json(dev.port, "GET", "/v2/repository/models/m/versions")
        }
        assert rows[1]["signer"] == key.identity
        assert rows[1]["signature"]["verified"] is True
        assert rows[1]["signature"]["policy"] == "require"
        [activated] = dev.kinds("version_activated")
        assert activated[3]["signer"] == key.identity
        assert activated[3]["signature_verified"] is True
        status = dev.link.status()
        assert status["models"] == [{"name": "m", "versions": [1], "signers": {"1": key.identity}}]

        client = Client(dev.port)
        client.start()
        publish_signed(dev, 2, key, tamper=True)

        async def cycle_and_listen() -> list[dict[str, Any]]:
            async with FleetClient(broker.settings()) as fleet:
                await fleet.subscribe("edge/dev1/events")
                result = await asyncio.to_thread(dev.cycle)
                assert result.rejected == (("m", 2),)
                dev.served.events.record("m", None, "test_marker", {})
                got: list[dict[str, Any]] = []
                async with asyncio.timeout(20):
                    async for message in fleet.messages():
                        doc = json.loads(message.payload)
                        if doc.get("event") == "test_marker":
                            return got
                        got.append(doc)
            raise AssertionError("no marker")

        events = asyncio.run(cycle_and_listen())
        refused = [e for e in events if e["event"] == "signature_refused"]
        assert [(e["model"], e["version"]) for e in refused] == [("m", 2)]
        assert "changed after signing: 2/model.onnx" in refused[0]["detail"]["reason"]
        dev.cycle()  # the rejected version is not fetched again; v1 serves on
        assert infer(dev.port)[1] == "1"
        seen = client.stop()
        assert seen, "the client sent no request"
        assert set(seen) == {(200, "1")}, [s for s in seen if s != (200, "1")][:3]

        rows = {
            r["version"]: r for r in get_json(dev.port, "GET", "/v2/repository/models/m/versions")
        }
        assert rows[2]["rejected"] is True
        assert "model signature refused: changed after signing" in rows[2]["rejected_reason"]
        index = get_json(dev.port, "POST", "/v2/repository/index", {})
        assert any(
            r.get("version") == "2" and "model signature refused" in r["reason"] for r in index
        ), index
        status = dev.link.status()
        assert [(r["version"], r["cause"]) for r in status["rejected"]] == [(2, "failed")]
        assert "changed after signing" in status["rejected"][0]["reason"]
        assert len(dev.kinds("signature_refused")) == 1
