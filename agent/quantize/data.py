"""Sample files for `edge-agent quantize`: calibration batches and evaluation data.

Calibration: a folder of `.npy` files (one array for a single-input model: one sample without the
batch dimension, or a batch with it) or `.npz` files (one array per input name). Files are read in
name order, one at a time, so a large calibration set never sits in memory at once.

Evaluation: an `.npz` file or a folder of `.npy` files holding the model inputs, each by input
name (or `inputs` for a single-input model), and optionally `labels` (class indices, one per
sample). With labels the accuracy of both models is measured; without them the data is reference
data and only the INT8 model's agreement with FP32 is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

SINGLE_INPUT_KEY = "inputs"
LABELS_KEY = "labels"
MAX_SAMPLE_FILES = 100_000  # a calibration folder larger than this is almost surely a mistake


class QuantizeDataError(Exception):
    """Calibration or evaluation data is missing or does not fit the model."""


@dataclass(frozen=True, slots=True)
class InputSpec:
    """A model input as the quantizer needs it: name, rank and element type."""

    name: str
    rank: int
    dtype: np.dtype[np.generic]


@dataclass(frozen=True, slots=True)
class EvalData:
    """Evaluation inputs (batched, by input name) and optional labels."""

    feeds: Mapping[str, np.ndarray]
    labels: np.ndarray | None

    @property
    def samples(self) -> int:
        """Number of samples (the batch dimension of the inputs)."""
        return int(next(iter(self.feeds.values())).shape[0])


def _fit(spec: InputSpec, array: np.ndarray, source: str) -> np.ndarray:
    """Cast to the input's type and add the batch dimension when the file holds one sample."""
    if array.ndim == spec.rank - 1:
        array = array[np.newaxis, ...]
    if array.ndim != spec.rank:
        raise QuantizeDataError(
            f"{source}: input '{spec.name}' has rank {array.ndim}, the model wants {spec.rank}"
        )
    return np.ascontiguousarray(array, dtype=spec.dtype)


def _from_mapping(
    specs: Sequence[InputSpec], arrays: Mapping[str, np.ndarray], source: str
) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.name in arrays:
            value = arrays[spec.name]
        elif len(specs) == 1 and SINGLE_INPUT_KEY in arrays:
            value = arrays[SINGLE_INPUT_KEY]
        else:
            raise QuantizeDataError(f"{source}: no array for input '{spec.name}'")
        feeds[spec.name] = _fit(spec, np.asarray(value), source)
    return feeds


def sample_files(folder: Path) -> list[Path]:
    """The `.npy`/`.npz` files of a calibration folder, in name order.

    Raises:
        QuantizeDataError: the folder is missing, empty or too large.
    """
    if not folder.is_dir():
        raise QuantizeDataError(f"calibration folder {folder} not found")
    files = sorted(p for p in folder.iterdir() if p.suffix in (".npy", ".npz") and p.is_file())
    if not files:
        raise QuantizeDataError(f"calibration folder {folder} holds no .npy or .npz files")
    if len(files) > MAX_SAMPLE_FILES:
        raise QuantizeDataError(f"calibration folder {folder} holds over {MAX_SAMPLE_FILES} files")
    return files


def load_sample(path: Path, specs: Sequence[InputSpec]) -> dict[str, np.ndarray]:
    """One calibration file as feeds for the model.

    Raises:
        QuantizeDataError: the file does not match the model's inputs.
    """
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            return _from_mapping(specs, {k: archive[k] for k in archive.files}, str(path))
    if len(specs) != 1:
        raise QuantizeDataError(f"{path}: a .npy sample only fits a single-input model; use .npz")
    return {specs[0].name: _fit(specs[0], np.load(path, allow_pickle=False), str(path))}


class FolderCalibrationReader(CalibrationDataReader):  # type: ignore[misc]
    """ONNX Runtime's calibration reader over a folder of sample files (rewindable).

    It hands out one sample at a time, whatever batch each file holds: the histogram calibrators
    (entropy, percentile) stack what they collect and need every run to have the same shape.
    """

    def __init__(self, folder: Path, specs: Sequence[InputSpec]) -> None:
        """List the files now, so a missing or empty folder fails before calibration starts."""
        self._files = sample_files(folder)
        self._specs = tuple(specs)
        self._samples: Iterator[dict[str, np.ndarray]] = self._each_sample()
        self.count = 0  # samples handed out since the last rewind

    def _each_sample(self) -> Iterator[dict[str, np.ndarray]]:
        for path in self._files:
            feeds = load_sample(path, self._specs)
            sizes = {a.shape[0] for a in feeds.values()}
            if len(sizes) != 1:
                raise QuantizeDataError(f"{path}: inputs disagree on the batch size")
            for i in range(sizes.pop()):
                yield {name: a[i : i + 1] for name, a in feeds.items()}

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next sample's feeds (batch of one), or None at the end."""
        sample = next(self._samples, None)
        if sample is not None:
            self.count += 1
        return sample

    def rewind(self) -> None:
        """Start again from the first file."""
        self._samples = self._each_sample()
        self.count = 0


def load_eval_data(path: Path, specs: Sequence[InputSpec]) -> EvalData:
    """Evaluation inputs and labels from an `.npz` file or a folder of `.npy` files.

    Raises:
        QuantizeDataError: the data is missing, or does not fit the model or itself.
    """
    arrays: dict[str, np.ndarray] = {}
    if path.is_file() and path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    elif path.is_dir():
        arrays = {p.stem: np.load(p, allow_pickle=False) for p in sorted(path.glob("*.npy"))}
    else:
        raise QuantizeDataError(f"evaluation data {path} is neither an .npz file nor a folder")
    feeds = _from_mapping(specs, arrays, str(path))
    counts = {name: a.shape[0] for name, a in feeds.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise QuantizeDataError(f"{path}: inputs disagree on the number of samples: {counts}")
    labels = arrays.get(LABELS_KEY)
    if labels is not None:
        labels = np.asarray(labels).reshape(-1).astype(np.int64)
        if labels.shape[0] != next(iter(counts.values())):
            raise QuantizeDataError(
                f"{path}: {labels.shape[0]} labels for {next(iter(counts.values()))} samples"
            )
    return EvalData(feeds, labels)
