"""Warm-up requests from a config's `model_warmup` entries, run before a version is ready.

Samples are built as ordinary inference requests so they pass through the same validation and
reshapes as client traffic. `input_data_file` names a raw little-endian file in `MODEL/warmup/`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from agent.errors import InvalidInputError, ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.tensors import datatypes
from agent.tensors.request import InferInput, InferRequest, check_shape, tensor_from_bytes

WARMUP_DIR = "warmup"
# A sample is one request of the model's own size: past these a value is a typo that would
# exhaust memory or keep the version loading for hours, not a warm-up plan.
MAX_SAMPLE_BYTES = 256 << 20
MAX_COUNT = 10_000


def warmup_requests(config: mc.ModelConfig, model_dir: Path) -> list[tuple[str, InferRequest, int]]:
    """The warm-up samples of a config as (name, request, repeat count).

    Raises:
        ModelConfigError: an unsupported type, or a data file that is missing or of the wrong size.
    """
    rng = np.random.default_rng(0)
    samples = []
    for warm in config.model_warmup:
        batch = max(1, warm.batch_size)
        if config.max_batch_size > 0 and batch > config.max_batch_size:
            raise ModelConfigError(
                f"model_warmup '{warm.name}': batch_size {batch} is over max_batch_size "
                f"{config.max_batch_size}"
            )
        if warm.count > MAX_COUNT:
            raise ModelConfigError(
                f"model_warmup '{warm.name}': count {warm.count} is over {MAX_COUNT}"
            )
        inputs = []
        for name, spec in sorted(warm.inputs.items()):
            dt = datatypes.from_config(mc.DataType.Name(spec.data_type))
            if dt is None:
                raise ModelConfigError(
                    f"model_warmup '{warm.name}' input '{name}': unsupported data_type"
                )
            shape = (batch, *spec.dims) if config.max_batch_size > 0 else tuple(spec.dims)
            _check_sample_shape(shape, dt, warm.name, name)
            data = _sample(spec, dt, shape, model_dir, warm.name, name, rng)
            inputs.append(InferInput(name, dt.kserve, shape, data))
        samples.append((warm.name, InferRequest(inputs=tuple(inputs)), max(1, warm.count)))
    return samples


def _check_sample_shape(
    shape: tuple[int, ...], dt: datatypes.DataType, warm_name: str, input_name: str
) -> None:
    where = f"model_warmup '{warm_name}' input '{input_name}'"
    if any(d < 0 for d in shape):
        raise ModelConfigError(
            f"{where}: dims {list(shape)} must be all specified (no -1) for a warm-up sample"
        )
    try:
        check_shape(shape, dt.kserve)
    except InvalidInputError as exc:
        raise ModelConfigError(f"{where}: {exc.message}") from None
    size = math.prod(shape) * max(1, dt.itemsize)
    if size > MAX_SAMPLE_BYTES:
        raise ModelConfigError(
            f"{where}: a sample of shape {list(shape)} is {size} bytes, over {MAX_SAMPLE_BYTES}"
        )


def _sample(
    spec: mc.ModelWarmup.Input,
    dt: datatypes.DataType,
    shape: tuple[int, ...],
    model_dir: Path,
    warm_name: str,
    input_name: str,
    rng: np.random.Generator,
) -> np.ndarray:
    count = math.prod(shape)
    kind = spec.WhichOneof("input_data_type")
    if kind == "input_data_file":
        folder = (model_dir / WARMUP_DIR).resolve()
        path = (folder / spec.input_data_file).resolve()
        if not path.is_relative_to(folder):  # the config may come from a load request
            raise ModelConfigError(
                f"model_warmup '{warm_name}' input '{input_name}': input_data_file "
                f"{spec.input_data_file!r} is not a file in the model's {WARMUP_DIR}/ folder"
            )
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ModelConfigError(
                f"model_warmup '{warm_name}': cannot read {path}: {exc}"
            ) from None
        # The file holds one batch item (the dims); Triton repeats it for every batch row.
        item = tuple(spec.dims)
        try:
            one = tensor_from_bytes(raw, dt.kserve, item)
        except InvalidInputError as exc:
            raise ModelConfigError(
                f"model_warmup '{warm_name}' input '{input_name}': {exc}"
            ) from None
        return np.broadcast_to(one, shape).copy() if item != shape else one
    if dt.kserve == "BYTES":
        arr = np.empty(count, dtype=np.object_)
        arr[:] = [
            b"0" if kind != "random_data" else str(rng.integers(0, 100)).encode()
            for _ in range(count)
        ]
        return arr.reshape(shape)
    if kind == "random_data":
        if dt.kserve == "BOOL":
            return rng.integers(0, 2, size=shape).astype(np.bool_)
        if np.issubdtype(dt.numpy, np.integer):
            return rng.integers(0, 100, size=shape).astype(dt.numpy)
        return rng.standard_normal(size=shape).astype(dt.numpy)
    return np.zeros(shape, dtype=dt.numpy)
