"""The running agent syncs signed versions from the S3-protocol server and hot-swaps them."""

from __future__ import annotations

import argparse
import io
import json
import urllib.request
import uuid
from pathlib import Path

from agent.config.schema import AgentConfig, CacheConfig, ModelsConfig, ServerConfig
from agent.runtime.demo import mlp_model
from sync.cli import run
from sync.cli_parser import add_commands
from sync.config import SyncConfig
from tests.models import M_CONFIG, write_model
from tests.server import running_agent
from tests.support import wait_until


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="edge-agent")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv), out=io.StringIO(), err=io.StringIO())


def served_version(port: int) -> str | None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/m/infer", data=json.dumps(doc).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            version: str = json.loads(resp.read())["model_version"]
            return version
    except urllib.error.HTTPError:
        return None


def test_agent_syncs_and_swaps_published_versions(tmp_path: Path, s3_endpoint: str) -> None:
    repo = tmp_path / "repo"
    assert cli("keys", "init", "--repo", str(repo)) == 0
    store = f"s3://agent-{uuid.uuid4().hex[:12]}/prod"
    s3 = ("--store", store, "--s3-endpoint", s3_endpoint, "--s3-region", "us-east-1")
    for version in (1, 2):
        write_model(tmp_path / f"src{version}", "m", mlp_model(seed=version), M_CONFIG, (version,))
    assert (
        cli(
            "publish",
            "--repo",
            str(repo),
            *s3,
            "--create-bucket",
            "m",
            "1",
            str(tmp_path / "src1/m"),
        )
        == 0
    )
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=-1, metrics_port=-1),
        models=ModelsConfig(exit_on_error=False),
        cache=CacheConfig(dir=tmp_path / "cache"),
        sync=SyncConfig(
            source=store,
            trusted_root=repo / "metadata" / "root.json",
            interval_s=1,
            jitter_s=0,
            s3_endpoint=s3_endpoint,
            s3_region="us-east-1",
        ),
    )
    with running_agent(config) as agent:
        wait_until(lambda: served_version(agent.http_port) == "1", "version 1 served", timeout_s=60)
        assert cli("publish", "--repo", str(repo), *s3, "m", "2", str(tmp_path / "src2/m")) == 0
        wait_until(lambda: served_version(agent.http_port) == "2", "version 2 served", timeout_s=60)
        assert agent.dataplane.cached_versions("m")[-1]["state"] == "active"
