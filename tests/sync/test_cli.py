"""`edge-agent keys init`, `publish`, `sync --once` through the argparse wiring."""

from __future__ import annotations

import argparse
import io
import uuid
from pathlib import Path

from model_cache import ModelCache
from sync.cli import run
from sync.cli_parser import SYNC_COMMANDS, add_commands
from sync.keys import keys_dir
from tests.sync.support import make_model, payload


def _run(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="edge-agent")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.command in SYNC_COMMANDS
    out, err = io.StringIO(), io.StringIO()
    code = run(args, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_keys_publish_sync_on_s3(tmp_path: Path, s3_endpoint: str) -> None:
    repo = tmp_path / "repo"
    code, out, _err = _run(
        "keys", "init", "--repo", str(repo), "--targets-keys", "2", "--targets-threshold", "2"
    )
    assert code == 0
    assert "targets: threshold 2" in out
    for key_file in keys_dir(repo).glob("*.pem"):
        secret = key_file.read_text().splitlines()[1]
        assert secret not in out
    assert "PRIVATE" not in out
    store = f"s3://cli-{uuid.uuid4().hex[:12]}/prod"
    s3 = ("--s3-endpoint", s3_endpoint, "--s3-region", "us-east-1")
    for version in (1, 2):
        model = make_model(tmp_path / f"v{version}", "demo", version, payload(version, 300_000))
        code, out, err = _run(
            "publish",
            "--repo",
            str(repo),
            "--store",
            store,
            *s3,
            "--create-bucket",
            "demo",
            str(version),
            str(model),
        )
        assert code == 0, err
        assert f"demo version {version}: published" in out
    cache_dir = tmp_path / "cache"
    code, out, err = _run(
        "sync",
        "--once",
        "--source",
        store,
        "--trusted-root",
        str(repo / "metadata" / "root.json"),
        "--cache-dir",
        str(cache_dir),
        "--desired",
        "demo=1",
        *s3,
    )
    assert code == 0, err
    assert "serving demo version 1" in out
    assert "100%" in err  # the progress bar
    code, out, err = _run(
        "sync",
        "--once",
        "--source",
        store,
        "--trusted-root",
        str(repo / "metadata" / "root.json"),
        "--cache-dir",
        str(cache_dir),
        *s3,
    )
    assert code == 0, err
    assert "serving demo version 2" in out
    with ModelCache(cache_dir) as cache:
        served = cache.active_version("demo")
        assert served is not None
        assert served.version == 2


def test_sync_reads_the_agent_config_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert _run("keys", "init", "--repo", str(repo))[0] == 0
    bucket = tmp_path / "bucket"
    model = make_model(tmp_path / "src", "demo", 3, payload(3))
    assert (
        _run("publish", "--repo", str(repo), "--store", bucket.as_uri(), "demo", "3", str(model))[0]
        == 0
    )
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[cache]\ndir = "cache"\n[sync]\nsource = "{bucket.as_uri()}"\n'
        'trusted_root = "repo/metadata/root.json"\ndesired = ["demo=latest"]\n'
    )
    code, out, err = _run("sync", "--once", "--config", str(config))
    assert code == 0, err
    assert "serving demo version 3" in out
    code, out, _err = _run("sync", "--once", "--config", str(config))
    assert out.strip() == "up to date"


def test_errors_have_exit_codes(tmp_path: Path) -> None:
    code, _out, err = _run(
        "publish",
        "--repo",
        str(tmp_path / "none"),
        "--store",
        (tmp_path / "b").as_uri(),
        "demo",
        "1",
        str(tmp_path),
    )
    assert code == 1
    assert "keys init" in err
    code, _out, err = _run("sync", "--once", "--cache-dir", str(tmp_path / "c"))
    assert code == 2
    assert "--source" in err
    code, _out, err = _run("publish", "--repo", str(tmp_path), "--store", "ftp://x/y")
    assert code == 2
