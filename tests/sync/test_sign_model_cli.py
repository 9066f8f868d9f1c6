"""The two-signer flow through the command line: the ML team signs, ops publishes, a device syncs.

`edge-agent sign-model` / `verify-model` (bundles made by the `model-signing` library), `publish
--require-model-signature` and `REPO/publish.toml`, `sync --once` with a `[sync]` signature policy.
"""

from __future__ import annotations

import contextlib
import io
import uuid
from pathlib import Path

from agent.cli.commands import main
from model_cache import ModelCache
from tests.sync.signing_support import make_certificate_signer, make_key
from tests.sync.support import make_model, payload


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_ml_team_signs_ops_publishes_device_verifies(tmp_path: Path, s3_endpoint: str) -> None:
    team = make_key(tmp_path / "ml-team")
    model = make_model(tmp_path / "build", "demo", 1, payload(1))
    code, out, err = _run("sign-model", str(model), "--key", str(team.private))
    assert code == 0, err
    assert f"signed {model} as 'demo' by {team.identity}" in out
    assert (model / "model.sig").is_file()
    code, out, err = _run("verify-model", str(model), "--trust", str(team.public))
    assert (code, out.strip()) == (0, f"{model}: signed by {team.identity} (2 files verified)")

    repo = tmp_path / "repo"
    assert _run("keys", "init", "--repo", str(repo))[0] == 0
    (repo / "publish.toml").write_text(
        f'[publish]\nrequire_model_signature = true\nmodel_signers = ["demo={team.public}"]\n'
    )
    store = f"s3://sig-{uuid.uuid4().hex[:12]}/prod"
    s3 = ("--s3-endpoint", s3_endpoint, "--s3-region", "us-east-1")
    publish = ("publish", "--no-verify-model", "--repo", str(repo), "--store", store, *s3)
    unsigned = make_model(tmp_path / "unsigned", "demo", 2, payload(2))
    code, _out, err = _run(*publish, "--create-bucket", "demo", "2", str(unsigned))
    assert code == 1
    assert err.count("\n") == 1
    assert "no model signature" in err
    code, out, err = _run(*publish, "demo", "1", str(model))
    assert code == 0, err
    assert "demo version 1: published (3 files" in out

    config = tmp_path / "agent.toml"
    config.write_text(
        f'[cache]\ndir = "cache"\n[sync]\nsource = "{store}"\n'
        f'trusted_root = "repo/metadata/root.json"\ns3_endpoint = "{s3_endpoint}"\n'
        's3_region = "us-east-1"\nmodel_signature_policy = "require"\n'
        f'trusted_model_signers = ["demo={team.public}"]\n'
    )
    code, out, err = _run("sync", "--once", "--config", str(config))
    assert code == 0, err
    assert "serving demo version 1" in out

    # A version signed by someone else, published by an ops key that trusts them: refused.
    intruder = make_key(tmp_path / "intruder", "intruder")
    other = make_model(tmp_path / "other", "demo", 3, payload(3))
    assert _run("sign-model", str(other), "--key", str(intruder.private))[0] == 0
    (repo / "publish.toml").unlink()
    code, _out, err = _run(
        *publish, "--model-signer", f"demo={intruder.public}", "demo", "3", str(other)
    )
    assert code == 0, err
    code, out, err = _run("sync", "--once", "--config", str(config))
    assert code == 1
    assert f"demo version 3: model signature refused: signed by {intruder.identity}" in err
    with ModelCache(tmp_path / "cache") as cache:
        served = cache.active_version("demo")
        assert served is not None
        assert served.version == 1
        assert [r.version for r in cache.rejections.entries("demo")] == [3]


def test_sign_and_verify_errors_are_one_line_with_exit_codes(tmp_path: Path) -> None:
    team = make_key(tmp_path / "k")
    model = make_model(tmp_path / "build", "demo", 1, payload(1))
    code, _out, err = _run("sign-model", str(model), "--keyless")
    assert code == 2
    assert err.count("\n") == 1
    assert "keyless Sigstore signing needs network access" in err
    code, _out, err = _run("sign-model", str(model))
    assert (code, err.count("\n")) == (2, 1)
    code, _out, err = _run("sign-model", str(model), "--key", str(team.public))
    assert (code, err.count("\n")) == (1, 1)
    assert "cannot sign" in err
    code, _out, err = _run("verify-model", str(model), "--trust", str(team.public))
    assert code == 1
    assert "no model signature (model.sig)" in err
    assert _run("sign-model", str(model), "--key", str(team.private))[0] == 0
    (model / "1" / "model.onnx").write_bytes(b"other")
    code, _out, err = _run("verify-model", str(model), "--trust", str(team.public))
    assert (code, err.count("\n")) == (1, 1)
    assert "changed after signing: 1/model.onnx" in err
    code, _out, err = _run("verify-model", str(model), "--trust", str(tmp_path / "none.pub"))
    assert (code, err.count("\n")) == (2, 1)


def test_certificate_mode_signs_and_verifies_offline(tmp_path: Path) -> None:
    team = make_certificate_signer(tmp_path / "team", "ml-team")
    model = make_model(tmp_path / "build", "demo", 1, payload(1))
    code, out, err = _run(
        "sign-model", str(model), "--key", str(team.key), "--certificate", str(team.certificate),
        "--chain", str(team.ca),
    )  # fmt: skip
    assert code == 0, err
    assert "by certificate CN=ml-team" in out
    code, out, err = _run("verify-model", str(model), "--trust", f"{team.ca}#ml-team")
    assert (code, out.strip()) == (
        0,
        f"{model}: signed by certificate CN=ml-team (2 files verified)",
    )
    code, _out, err = _run("verify-model", str(model), "--trust", f"{team.ca}#ops")
    assert code == 1
    assert "signed by certificate CN=ml-team, which is not trusted for demo" in err
