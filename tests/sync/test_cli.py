"""`edge-agent keys init`, `publish`, `sync --once` through the argparse wiring."""

from __future__ import annotations

import contextlib
import io
import uuid
from pathlib import Path

import pytest

from agent.cli.commands import main
from model_cache import ModelCache
from sync.cli_parser import SYNC_COMMANDS
from sync.keys import keys_dir
from tests.sync.support import make_model, payload


def _run(*argv: str) -> tuple[int, str, str]:
    """`edge-agent ARGV` through the agent's own entry point (its config loader included)."""
    assert argv[0] in SYNC_COMMANDS
    if argv[0] == "publish":  # these payloads are not models: publish's checks have their tests
        argv = ("publish", "--no-verify-model", *argv[1:])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
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


def _published(tmp_path: Path) -> tuple[Path, Path]:
    """A signed repository on a folder store holding demo versions 3 and 4."""
    repo = tmp_path / "repo"
    assert _run("keys", "init", "--repo", str(repo))[0] == 0
    bucket = tmp_path / "bucket"
    for version in (3, 4):
        model = make_model(tmp_path / f"src{version}", "demo", version, payload(version))
        code, _out, err = _run(
            "publish", "--repo", str(repo), "--store", bucket.as_uri(), "demo", str(version),
            str(model),
        )  # fmt: skip
        assert code == 0, err
    return repo, bucket


def test_sync_once_honours_the_environment_like_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, bucket = _published(tmp_path)
    monkeypatch.setenv("EDGE_AGENT_SYNC_SOURCE", bucket.as_uri())
    monkeypatch.setenv("EDGE_AGENT_SYNC_TRUSTED_ROOT", str(repo / "metadata" / "root.json"))
    monkeypatch.setenv("EDGE_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGE_AGENT_SYNC_DESIRED", "demo=3")
    code, out, err = _run("sync", "--once")
    assert code == 0, err
    assert "serving demo version 3" in out
    # A flag wins over the environment, the environment over the file.
    config = tmp_path / "agent.toml"
    config.write_text('[sync]\ndesired = ["demo=4"]\n[cache]\ndir = "elsewhere"\n')
    code, out, err = _run("sync", "--once", "--config", str(config), "--desired", "demo=4")
    assert code == 0, err
    assert "serving demo version 4" in out
    with ModelCache(tmp_path / "cache") as cache:
        served = cache.active_version("demo")
        assert served is not None
        assert served.version == 4
    assert not (tmp_path / "elsewhere").exists()
    monkeypatch.setenv("EDGE_AGENT_SYNC_INTERVAL_S", "soon")
    code, _out, err = _run("sync", "--once")
    assert code == 2
    assert "EDGE_AGENT_SYNC_INTERVAL_S" in err


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
