"""An optional feature whose extra is missing stops the command with one line naming the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import agent.cli
from agent.cli.exit_codes import EXIT_CONFIG
from agent.config.extras import OPTIONAL, installed, missing_extra


def _fails_naming(
    capsys: pytest.CaptureFixture[str], argv: list[str], extra: str, feature: str
) -> None:
    assert agent.cli.main(argv) == EXIT_CONFIG
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("edge-agent: error: "), err
    assert feature in err
    assert f"pip install 'edge-agent[{extra}]'" in err


def test_the_grpcio_engine_without_grpcio(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # find_spec: not importable
    argv = ["serve", "--demo", "--grpc-engine", "grpcio"]
    _fails_naming(capsys, argv, "grpcio", 'server.grpc_engine = "grpcio"')


def test_opentelemetry_traces_without_the_otel_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)
    argv = ["serve", "--demo", "--trace-mode", "opentelemetry"]
    _fails_naming(capsys, argv, "otel", 'log.trace_mode = "opentelemetry"')


def _sync_config(tmp_path: Path, source: str, policy: str = "off") -> Path:
    root = tmp_path / "root.json"
    root.write_text("{}", encoding="utf-8")
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[cache]\ndir = "{tmp_path / "cache"}"\n'
        f'[sync]\nsource = "{source}"\ntrusted_root = "{root}"\n'
        f'model_signature_policy = "{policy}"\n',
        encoding="utf-8",
    )
    return config


def test_an_s3_store_without_the_s3_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    config = _sync_config(tmp_path, "s3://fleet/prod")
    _fails_naming(capsys, ["serve", "--config", str(config)], "s3", 'sync.source = "s3://..."')


def test_model_signatures_without_the_signing_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "model_signing", None)
    config = _sync_config(tmp_path, f"file://{tmp_path / 'store'}", policy="warn")
    argv = ["serve", "--config", str(config)]
    _fails_naming(capsys, argv, "signing", "sync.model_signature_policy")


def test_quantize_without_onnx(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)
    argv = ["quantize", str(tmp_path / "m.onnx"), "--calibration", str(tmp_path)]
    _fails_naming(capsys, [*argv, "--output", str(tmp_path / "q.onnx")], "quantize", "quantize")


def test_an_s3_store_opened_without_boto3_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sync.errors import SyncConfigError
    from sync.stores import open_store

    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(SyncConfigError, match=r"pip install 'edge-agent\[s3\]'"):
        open_store("s3://fleet/prod")


def test_every_extra_is_installed_in_the_dev_environment() -> None:
    # [dev] pulls every optional extra the suite uses (pyproject.toml).
    assert {extra: missing_extra(extra, "x") for extra in OPTIONAL} == dict.fromkeys(OPTIONAL)


def test_installed_looks_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert installed("json")
    assert not installed("no_such_module_here")
    assert not installed("no_such_package.sub")
    monkeypatch.setitem(sys.modules, "json", None)
    assert not installed("json")
