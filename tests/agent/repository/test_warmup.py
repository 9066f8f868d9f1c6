"""Warm-up samples built from a config's model_warmup entries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import parse_model_config
from agent.repository.warmup import warmup_requests
from agent.tensors.request import tensor_to_bytes
from agent.tensors.signature import ModelSignature


def config_of(max_batch_size: int, warmup: str, extra: str = "") -> mc.ModelConfig:
    text = f'name: "m"\nmax_batch_size: {max_batch_size}\n{extra}\nmodel_warmup [ {warmup} ]\n'
    return parse_model_config(text, "m/config.pbtxt")


def one_input(spec: str, batch_size: int = 1, name: str = "sample", count: int = 0) -> str:
    """A warm-up entry with one input X described by `spec`."""
    return (
        f'{{ name: "{name}" batch_size: {batch_size} count: {count} '
        f'inputs {{ key: "X" value: {{ {spec} }} }} }}'
    )


def write_warmup_file(model_dir: Path, name: str, raw: bytes) -> None:
    folder = model_dir / "warmup"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(raw)


def test_zero_data(tmp_path: Path) -> None:
    config = config_of(4, one_input("data_type: TYPE_FP32 dims: [ 3 ] zero_data: true", 2))

    ((name, request, count),) = warmup_requests(config, tmp_path)

    assert name == "sample"
    assert count == 1
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", "FP32", (2, 3))
    assert tensor.data.dtype == np.float32
    assert tensor.data.shape == (2, 3)
    assert not tensor.data.any()


@pytest.mark.parametrize(
    ("config_type", "kserve", "dtype"),
    [
        ("TYPE_BOOL", "BOOL", np.bool_),
        ("TYPE_UINT8", "UINT8", np.uint8),
        ("TYPE_INT64", "INT64", np.int64),
        ("TYPE_FP16", "FP16", np.float16),
        ("TYPE_FP64", "FP64", np.float64),
    ],
)
def test_zero_data_every_kind_of_type(
    tmp_path: Path, config_type: str, kserve: str, dtype: type
) -> None:
    config = config_of(0, one_input(f"data_type: {config_type} dims: [ 2, 2 ] zero_data: true"))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    (tensor,) = request.inputs
    assert tensor.datatype == kserve
    assert tensor.data.dtype == dtype
    assert tensor.data.shape == (2, 2)
    assert not tensor.data.any()


def test_zero_data_bytes(tmp_path: Path) -> None:
    config = config_of(0, one_input("data_type: TYPE_STRING dims: [ 2 ] zero_data: true"))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    (tensor,) = request.inputs
    assert tensor.datatype == "BYTES"
    assert tensor.data.tolist() == [b"0", b"0"]


def test_random_data_fp32(tmp_path: Path) -> None:
    config = config_of(8, one_input("data_type: TYPE_FP32 dims: [ 16 ] random_data: true", 4))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    (tensor,) = request.inputs
    assert tensor.shape == (4, 16)
    assert tensor.data.shape == (4, 16)
    assert tensor.data.dtype == np.float32
    assert np.unique(tensor.data).size > 1


def test_random_data_is_reproducible(tmp_path: Path) -> None:
    config = config_of(0, one_input("data_type: TYPE_FP64 dims: [ 8 ] random_data: true"))

    first = warmup_requests(config, tmp_path)[0][1].inputs[0].data
    second = warmup_requests(config, tmp_path)[0][1].inputs[0].data

    assert first.tolist() == second.tolist()


def test_random_data_integers_in_range(tmp_path: Path) -> None:
    config = config_of(0, one_input("data_type: TYPE_INT8 dims: [ 200 ] random_data: true"))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    data = request.inputs[0].data
    assert data.dtype == np.int8
    assert data.min() >= 0
    assert data.max() < 100
    assert np.unique(data).size > 1


def test_random_data_bool_and_bytes(tmp_path: Path) -> None:
    warmup = (
        '{ name: "r" inputs { key: "B" value: { data_type: TYPE_BOOL dims: [ 64 ] '
        "random_data: true } } "
        'inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 3 ] random_data: true } } }'
    )
    config = config_of(0, warmup)

    ((_, request, _),) = warmup_requests(config, tmp_path)

    flags, strings = request.inputs
    assert flags.name == "B"
    assert flags.data.dtype == np.bool_
    assert set(flags.data.tolist()) == {True, False}
    assert strings.name == "S"
    assert all(isinstance(s, bytes) and s.decode().isdigit() for s in strings.data.tolist())


def test_input_data_file(tmp_path: Path) -> None:
    values = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    write_warmup_file(tmp_path, "x.bin", values.tobytes())
    config = config_of(4, one_input('data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "x.bin"'))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    (tensor,) = request.inputs
    assert tensor.shape == (1, 3)
    assert tensor.data.tolist() == values.tolist()


def test_input_data_file_is_repeated_for_each_batch_row(tmp_path: Path) -> None:
    write_warmup_file(tmp_path, "x.bin", np.array([7, 8], dtype=np.int32).tobytes())
    config = config_of(
        4, one_input('data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "x.bin"', 3)
    )

    ((_, request, _),) = warmup_requests(config, tmp_path)

    data = request.inputs[0].data
    assert data.shape == (3, 2)
    assert data.tolist() == [[7, 8], [7, 8], [7, 8]]
    assert data.flags.writeable


def test_input_data_file_bytes(tmp_path: Path) -> None:
    raw = tensor_to_bytes(np.array([b"hello", b""], dtype=np.object_), "BYTES")
    write_warmup_file(tmp_path, "s.bin", raw)
    config = config_of(0, one_input('data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin"'))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    assert request.inputs[0].data.tolist() == [b"hello", b""]


def test_input_data_file_unbatched_rank_one(tmp_path: Path) -> None:
    write_warmup_file(tmp_path, "x.bin", np.arange(4, dtype=np.uint16).tobytes())
    config = config_of(0, one_input('data_type: TYPE_UINT16 dims: [ 4 ] input_data_file: "x.bin"'))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    assert request.inputs[0].data.tolist() == [0, 1, 2, 3]


def test_input_data_file_unbatched_multi_dim_holds_the_whole_tensor(tmp_path: Path) -> None:
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_warmup_file(tmp_path, "x.bin", values.tobytes())
    config = config_of(0, one_input('data_type: TYPE_FP32 dims: [ 2, 3 ] input_data_file: "x.bin"'))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    assert request.inputs[0].data.tolist() == values.tolist()


def test_input_data_file_of_the_wrong_size(tmp_path: Path) -> None:
    write_warmup_file(tmp_path, "x.bin", b"\x00" * 8)
    config = config_of(4, one_input('data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "x.bin"'))

    with pytest.raises(ModelConfigError) as info:
        warmup_requests(config, tmp_path)

    message = info.value.message
    assert "model_warmup 'sample' input 'X'" in message
    assert "8 bytes" in message
    assert "needs 12" in message


def test_input_data_file_missing(tmp_path: Path) -> None:
    config = config_of(4, one_input('data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "no.bin"'))

    with pytest.raises(ModelConfigError) as info:
        warmup_requests(config, tmp_path)

    message = info.value.message
    assert "model_warmup 'sample': cannot read" in message
    assert str(tmp_path / "warmup" / "no.bin") in message


def test_input_data_file_is_read_from_the_warmup_folder(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(np.zeros(3, dtype=np.float32).tobytes())
    config = config_of(4, one_input('data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "x.bin"'))

    with pytest.raises(ModelConfigError, match="cannot read"):
        warmup_requests(config, tmp_path)


@pytest.mark.parametrize(("batch_size", "rows"), [(0, 1), (1, 1), (3, 3)])
def test_batch_size_applied(tmp_path: Path, batch_size: int, rows: int) -> None:
    config = config_of(
        4, one_input("data_type: TYPE_INT64 dims: [ 2, 5 ] zero_data: true", batch_size)
    )

    ((_, request, _),) = warmup_requests(config, tmp_path)

    assert request.inputs[0].shape == (rows, 2, 5)
    assert request.inputs[0].data.shape == (rows, 2, 5)


def test_batch_size_ignored_without_batching(tmp_path: Path) -> None:
    config = config_of(0, one_input("data_type: TYPE_INT64 dims: [ 2, 5 ] zero_data: true", 3))

    ((_, request, _),) = warmup_requests(config, tmp_path)

    assert request.inputs[0].shape == (2, 5)


@pytest.mark.parametrize(("count", "repeat"), [(0, 1), (1, 1), (5, 5)])
def test_count(tmp_path: Path, count: int, repeat: int) -> None:
    config = config_of(
        0, one_input("data_type: TYPE_FP32 dims: [ 1 ] zero_data: true", count=count)
    )

    ((_, _, repeats),) = warmup_requests(config, tmp_path)

    assert repeats == repeat


def test_several_samples_and_inputs_sorted_by_name(tmp_path: Path) -> None:
    warmup = (
        '{ name: "first" inputs { key: "b" value: { data_type: TYPE_FP32 dims: [ 1 ] '
        'zero_data: true } } inputs { key: "a" value: { data_type: TYPE_INT32 dims: [ 1 ] '
        "zero_data: true } } }, "
        + one_input("data_type: TYPE_FP32 dims: [ 1 ] zero_data: true", name="second")
    )
    config = config_of(0, warmup)

    samples = warmup_requests(config, tmp_path)

    assert [name for name, _, _ in samples] == ["first", "second"]
    assert [t.name for t in samples[0][1].inputs] == ["a", "b"]


def test_no_warmup_entries(tmp_path: Path) -> None:
    config = parse_model_config('name: "m"', "m/config.pbtxt")

    assert warmup_requests(config, tmp_path) == []


def test_unsupported_data_type(tmp_path: Path) -> None:
    config = config_of(0, one_input("data_type: TYPE_BF16 dims: [ 1 ] zero_data: true"))

    with pytest.raises(
        ModelConfigError, match="model_warmup 'sample' input 'X': unsupported data_type"
    ):
        warmup_requests(config, tmp_path)


def test_warmup_requests_pass_the_model_signature(tmp_path: Path) -> None:
    write_warmup_file(tmp_path, "x.bin", np.ones(4, dtype=np.float32).tobytes())
    extra = (
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    )
    config = config_of(
        4, one_input('data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.bin"', 2), extra
    )
    ((_, request, _),) = warmup_requests(config, tmp_path)

    valid = ModelSignature.from_config(config).validate(request)

    assert valid.batch_size == 2
    assert valid.feeds["X"].shape == (2, 2, 2)
    assert valid.output_names == ("Y",)
