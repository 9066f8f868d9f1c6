"""`edge-agent publish` validates the folder as the agent would load it, before signing."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli.commands import main
from agent.cli.publish_check import NOT_LOADED, check_folder
from agent.errors import ModelConfigError, ModelLoadError
from agent.runtime.demo import mlp_model
from sync.keys import init_keys, metadata_dir
from tests.models import write_model

CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] }} ]
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    init_keys(tmp_path / "repo", {})
    return tmp_path / "repo"


def folder(tmp_path: Path, *, name: str = "m", config: str | None = None) -> Path:
    return write_model(
        tmp_path / "src", "m", mlp_model(seed=1), config or CONFIG.format(name=name), (1,)
    )


def publish(
    repo: Path, source: Path, capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[int, str, str]:
    store = (repo.parent / "bucket").as_uri()
    code = main(["publish", "--repo", str(repo), "--store", store, *flags, "m", "1", str(source)])
    out, err = capsys.readouterr()
    return code, out, err


def signed(repo: Path) -> bool:
    return (metadata_dir(repo) / "targets.json").exists()


def test_publish_refuses_a_config_that_names_another_model(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = publish(repo, folder(tmp_path, name="other"), capsys)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1, err
    assert "refusing to publish m version 1" in err
    assert "names the model 'other', but it is published as 'm'" in err
    assert not signed(repo)


def test_publish_refuses_a_model_file_that_is_not_onnx(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = folder(tmp_path)
    (source / "1" / "model.onnx").write_bytes(b"not a model\n" * 100)
    code, out, err = publish(repo, source, capsys)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("edge-agent: error: refusing to publish m version 1: onnxruntime")
    assert not signed(repo)


def test_no_verify_model_signs_without_loading_and_says_so(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = folder(tmp_path)
    (source / "1" / "model.onnx").write_bytes(b"not a model")
    code, out, err = publish(repo, source, capsys, "--no-verify-model")
    assert code == 0, err
    assert f"m version 1: {NOT_LOADED}" in out
    assert signed(repo)


def test_no_verify_model_still_checks_the_config(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = folder(tmp_path, config='name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: x\n')
    code, _out, err = publish(repo, source, capsys, "--no-verify-model")
    assert code == 1
    assert err.count("\n") == 1, err
    assert "config.pbtxt:3:17" in err


def test_a_good_folder_is_published(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = publish(repo, folder(tmp_path), capsys)
    assert code == 0, err
    assert "m version 1: published" in out


def test_the_check_on_its_own(tmp_path: Path) -> None:
    source = folder(tmp_path)
    assert check_folder("m", 1, source, load=True) == []
    with pytest.raises(ModelLoadError, match=r"has no model\.onnx"):
        check_folder("m", 2, source, load=False)
    (source / "config.pbtxt").write_text('name: "m"\nplatform: "pytorch_libtorch"\n')
    with pytest.raises(ModelConfigError, match="not one the agent runs"):
        check_folder("m", 1, source, load=False)
    (source / "config.pbtxt").write_text(
        CONFIG.format(name="m").replace("dims: [ 64 ]", "dims: [ 3 ]")
    )
    with pytest.raises(ModelConfigError):  # the config contradicts the model
        check_folder("m", 1, source, load=True)
    python = tmp_path / "py" / "p"
    (python / "1").mkdir(parents=True)
    (python / "config.pbtxt").write_text('name: "p"\nbackend: "python"\n')
    (python / "1" / "model.py").write_text("def broken(:\n")
    with pytest.raises(ModelLoadError, match="does not compile"):
        check_folder("p", 1, python, load=True)
