from __future__ import annotations

from pathlib import Path

import pytest

from agent.config.loader import load_config
from agent.errors import AgentConfigError
from sync.config import SyncConfig, signature_check, validate
from sync.errors import SyncConfigError
from sync.model_signature import SignaturePolicy
from tests.sync.signing_support import make_key


def test_defaults_are_off() -> None:
    assert not SyncConfig().enabled
    validate(SyncConfig(), None)


def test_the_agent_loader_reads_the_sync_section_and_resolves_paths(tmp_path: Path) -> None:
    (tmp_path / "root.json").write_text("{}")
    path = tmp_path / "a.toml"
    path.write_text(
        '[sync]\nsource = "s3://b/p"\ntrusted_root = "root.json"\ninterval_s = 60\n'
        'desired = ["m=2"]\n[cache]\ndir = "c"\n'
    )
    config = load_config(path, serving=False)
    assert config.sync.trusted_root == tmp_path / "root.json"
    assert config.sync.desired == ("m=2",)
    assert config.sync.interval_s == 60
    assert config.cache.dir == tmp_path / "c"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("[sync]\nbogus = 1\n", "unknown config key 'sync.bogus'"),
        ('[sync]\ninterval_s = "5"\n', "'sync.interval_s' must be an integer"),
        ("[sync]\ndesired = [1]\n", "list of strings"),
        ("[sync\n", "invalid TOML"),
    ],
)
def test_the_agent_loader_refuses_a_bad_sync_section(tmp_path: Path, body: str, match: str) -> None:
    path = tmp_path / "a.toml"
    path.write_text(body)
    with pytest.raises(AgentConfigError, match=match):
        load_config(path, serving=False)


def test_validate_refuses(tmp_path: Path) -> None:
    root = tmp_path / "root.json"
    root.write_text("{}")
    good = SyncConfig(source="s3://b/p", trusted_root=root)
    validate(good, tmp_path)
    with pytest.raises(SyncConfigError, match=r"cache\.dir"):
        validate(good, None)
    bad = {"source": "ftp://x", "interval_s": 0, "max_parallel": 0, "desired": ("x",)}
    for key, value in bad.items():
        fields = {"source": "s3://b/p", "trusted_root": root, key: value}
        with pytest.raises(SyncConfigError):
            validate(SyncConfig(**fields), tmp_path)  # type: ignore[arg-type]


def test_model_signature_settings_fail_at_boot(tmp_path: Path) -> None:
    root = tmp_path / "root.json"
    root.write_text("{}")
    key = make_key(tmp_path / "keys")
    base = {"source": "s3://b/p", "trusted_root": root}
    good = SyncConfig(
        **base,  # type: ignore[arg-type]
        model_signature_policy="require",
        trusted_model_signers=(f"m*={key.public}",),
    )
    validate(good, tmp_path)
    check = signature_check(good)
    assert check.policy is SignaturePolicy.REQUIRE
    assert [t.pattern for t in check.trusted] == ["m*"]
    for fields, match in (
        ({"model_signature_policy": "require"}, "needs sync.trusted_model_signers"),
        ({"model_signature_policy": "strict"}, "must be off, warn or require"),
        ({"trusted_model_signers": ("m*",)}, "PATTERN=KEY_FILE"),
        ({"trusted_model_signers": (f"*={tmp_path / 'none.pub'}",)}, "cannot read"),
    ):
        with pytest.raises(SyncConfigError, match=match):
            validate(SyncConfig(**base, **fields), tmp_path)  # type: ignore[arg-type]
    path = tmp_path / "a.toml"
    path.write_text(
        '[sync]\nsource = "s3://b/p"\ntrusted_root = "root.json"\n'
        f'model_signature_policy = "warn"\ntrusted_model_signers = ["m*={key.public}"]\n'
        '[cache]\ndir = "c"\n'
    )
    config = load_config(path, serving=False)
    assert config.sync.model_signature_policy == "warn"
    assert config.sync.trusted_model_signers == (f"m*={key.public}",)
