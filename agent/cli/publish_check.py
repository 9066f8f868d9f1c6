"""`edge-agent publish` checks a model folder the way the agent would load it, before signing.

    check = folder_check(load=True)
    notes = check("resnet", 2, Path("build/resnet"))   # PublishError: one line saying why not

A signed version that no device can load makes every device fail (and, before rejections,
retry); the publisher is the one place to stop it. What is checked, in the order a device meets
it (the same parser, rules and runtime as `agent.models.registry`):

    1. `config.pbtxt` parses (protobuf text format, the agent's schema);
    2. its `name`, when set, is the model's name;
    3. its platform/backend is one the agent runs;
    4. the version folder holds the model file the config names;
    5. the model loads: an ONNX Runtime session (CPU) whose inputs and outputs the config agrees
       with (auto-complete rules); a Python model's `model.py` compiles. A TensorRT plan is not
       loaded (it needs the device's GPU) and the notes say so; an ensemble has no file.

`load=False` (`--no-verify-model`, for a publisher without ONNX Runtime) skips 5 and says so.
The check is handed to `sync.publish.Publisher.publish`, which never imports the agent.
"""

from __future__ import annotations

from pathlib import Path

from agent.backends.select import BackendKind
from agent.ensemble.plan import is_ensemble
from agent.errors import AgentError, ModelConfigError, ModelLoadError
from agent.proto import model_config_pb2 as mc
from agent.repository.autocomplete import (
    ONNX_BACKEND,
    ONNX_PLATFORM,
    PYTHON_BACKEND,
    TENSORRT_BACKEND,
    TENSORRT_PLATFORM,
    complete_config,
)
from agent.repository.layout import model_filename
from agent.repository.model_config import load_model_config
from sync.errors import PublishError
from sync.publish import ModelCheck

NOT_LOADED = "model file not loaded (--no-verify-model): only the config was checked"
_MAX_REASON = 400  # characters of a refusal (ONNX Runtime's messages can be long)


def folder_check(*, load: bool) -> ModelCheck:
    """The check `publish` runs before signing.

    Args:
        load: Load the model file (False: `--no-verify-model`).

    Returns:
        A `ModelCheck`: notes for the output, or `PublishError` with one line.
    """

    def check(model: str, version: int, folder: Path) -> list[str]:
        try:
            return check_folder(model, version, folder, load=load)
        except AgentError as exc:
            reason = " ".join(exc.message.split())
            if len(reason) > _MAX_REASON:
                reason = reason[: _MAX_REASON - 3] + "..."
            raise PublishError(
                f"refusing to publish {model} version {version}: {reason}",
                model=model,
                version=version,
            ) from None

    return check


def check_folder(model: str, version: int, folder: Path, *, load: bool) -> list[str]:
    """Check a Triton model folder as the agent would load `version` of `model` from it.

    Args:
        model: The name the version is published under.
        version: The version; `folder/VERSION/` holds its files.
        folder: The Triton model folder (`config.pbtxt`, `VERSION/`).
        load: Load the model file too.

    Raises:
        ModelConfigError: The config does not parse, names another model, or asks for a
            backend the agent does not run, or contradicts the model.
        ModelLoadError: The model file is missing, or its runtime refuses it.

    Returns:
        Notes on what was not checked.
    """
    config = load_model_config(folder)
    if config is None:
        raise ModelConfigError(f"{folder}/config.pbtxt is missing")
    if config.name and config.name != model:
        raise ModelConfigError(
            f"config.pbtxt names the model '{config.name}', but it is published as '{model}'"
        )
    if is_ensemble(config):
        return ["an ensemble: its steps are checked on the device, against the models it serves"]
    kind = _backend(config)
    version_dir = folder / str(version)
    path = version_dir / model_filename(config)
    if kind is BackendKind.TENSORRT:
        if not path.is_file() and not (version_dir / "model.onnx").is_file():
            raise ModelLoadError(f"{version_dir} holds neither {path.name} nor model.onnx")
        return ["TensorRT engine not loaded here: it needs the device's GPU"]
    if not path.is_file():
        raise ModelLoadError(f"{version_dir} has no {path.name} (the model file the config names)")
    if not load:
        return [NOT_LOADED]
    if kind is BackendKind.PYTHON:
        _compile(path)
        return []
    _load_onnx(model, path, config)
    return []


def _backend(config: mc.ModelConfig) -> BackendKind:
    platform, backend = config.platform, config.backend
    if backend == PYTHON_BACKEND and not platform:
        return BackendKind.PYTHON
    if platform in ("", ONNX_PLATFORM) and backend in ("", ONNX_BACKEND):
        return BackendKind.ONNXRUNTIME
    if platform in ("", TENSORRT_PLATFORM) and backend in ("", TENSORRT_BACKEND):
        return BackendKind.TENSORRT
    raise ModelConfigError(
        f"platform '{platform}' backend '{backend}' is not one the agent runs (onnxruntime_onnx, "
        "tensorrt_plan, or backend python)"
    )


def _compile(path: Path) -> None:
    try:
        compile(path.read_bytes(), str(path), "exec")
    except (SyntaxError, ValueError) as exc:
        raise ModelLoadError(f"{path} does not compile: {exc}") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror}") from None


def _load_onnx(model: str, path: Path, config: mc.ModelConfig) -> None:
    from agent.backends.onnx import OnnxBackend  # noqa: PLC0415 - onnxruntime only here

    # The publisher's machine need not have the device's accelerators: only the file is checked.
    backend = OnnxBackend(path, config, intra_op_threads=1, allow_cpu_fallback=True)
    try:
        complete_config(config, model, backend.inputs, backend.outputs, auto_complete=True)
    finally:
        backend.close()
