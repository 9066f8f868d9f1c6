"""Triton model repository layout: which models and versions are on disk, and which to serve.

    REPOSITORY/MODEL/config.pbtxt      (optional when auto-complete is on)
    REPOSITORY/MODEL/1/model.onnx      (model.py for Python models, or default_model_filename)
    REPOSITORY/MODEL/2/...

Pure path rules and the version policy; loading lives in `agent.models.registry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agent.proto import model_config_pb2 as mc

DEFAULT_MODEL_FILENAME = {
    "onnxruntime_onnx": "model.onnx",
    "onnxruntime": "model.onnx",
    "tensorrt_plan": "model.plan",
    "tensorrt": "model.plan",
    "python": "model.py",
}


def list_models(repository: Path) -> list[str]:
    """Model names in a repository: its sub-directories, sorted, hidden ones skipped."""
    return sorted(p.name for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))


def is_model_name(name: str) -> bool:
    """Whether `name` can name a model of a repository: one visible path component, as
    `list_models` finds them (so never '..', 'a/b' or '../../elsewhere', which leave the
    repository)."""
    return bool(name) and not name.startswith(".") and "/" not in name and "\0" not in name


def list_versions(model_dir: Path) -> list[int]:
    """Version numbers present as numeric sub-directories (`1/`, `2/`, ...), ascending."""
    versions = []
    for p in model_dir.iterdir():
        if p.is_dir() and _is_number(p.name) and int(p.name) > 0:
            versions.append(int(p.name))
    return sorted(versions)


def select_versions(policy: mc.ModelVersionPolicy, available: Sequence[int]) -> list[int]:
    """The versions a policy serves, ascending. Triton's default policy is latest with 1 version.

    A `specific` policy may name versions that are not on disk; those are returned too, so that
    the caller reports them as unavailable instead of silently serving less.
    """
    ordered = sorted(available)
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return ordered
    if choice == "specific":
        return sorted(set(policy.specific.versions))
    count = policy.latest.num_versions if choice == "latest" else 1
    return ordered[-max(count, 1) :] if ordered else []


PYTHON_BACKEND = "python"
_PYTHON_FILENAME = "model.py"
_OTHER_MODEL_FILES = ("model.onnx", "model.plan")


def holds_python_model(version_dir: Path, config: mc.ModelConfig) -> bool:
    """Whether a version folder of a config naming no platform or backend is a Python model.

    Triton's rule: `default_model_filename: "model.py"`, or `model.py` in the folder (and no
    ONNX or TensorRT file beside it).
    """
    if config.platform or config.backend:
        return False
    if config.default_model_filename == _PYTHON_FILENAME:
        return True
    if config.default_model_filename:
        return False
    return (version_dir / _PYTHON_FILENAME).is_file() and not any(
        (version_dir / name).is_file() for name in _OTHER_MODEL_FILES
    )


def backend_from_files(model_dir: Path, config: mc.ModelConfig) -> str:
    """The backend a config without platform and backend gets from its files ("" if none).

    Triton looks at the first version folder (in name order): one holding `model.py` is a
    Python model.
    """
    if config.platform or config.backend:
        return ""
    try:
        folders = [
            p for p in model_dir.iterdir() if p.is_dir() and _is_number(p.name) and int(p.name) > 0
        ]
    except OSError:
        return ""
    first = min(folders, key=lambda p: p.name, default=None)
    if first is not None and holds_python_model(first, config):
        return PYTHON_BACKEND
    return ""


def model_filename(config: mc.ModelConfig) -> str:
    """The file inside a version folder that holds the model."""
    if config.default_model_filename:
        return config.default_model_filename
    return DEFAULT_MODEL_FILENAME.get(config.platform or config.backend, "model.onnx")


def _is_number(name: str) -> bool:
    """ASCII digits only: str.isdigit() also takes "²", which int() refuses."""
    return name.isascii() and name.isdigit()
