"""validate_config: the checks a config.pbtxt passes before its model file is opened;
validate_dims: the dimension rule Triton checks as it loads each version."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.validation import (
    MAX_BATCH_SIZE,
    MAX_INSTANCES_PER_GROUP,
    validate_config,
    validate_dims,
)


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


@pytest.mark.parametrize(
    "text",
    [
        "",  # everything left to auto-complete
        "max_batch_size: 0",
        f"max_batch_size: {MAX_BATCH_SIZE}",
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]',
        'max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { } } ]',
        f"instance_group [ {{ count: {MAX_INSTANCES_PER_GROUP} }} ]",
        "instance_group [ { count: 0 } ]",
        "version_policy: { latest: { num_versions: 2 } }",
        "version_policy: { specific: { versions: [ 1, 3 ] } }",
        "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4, 8 ] }",
        # auto-complete may raise max_batch_size from 0 later; the loader checks the pair then
        "dynamic_batching { preferred_batch_size: [ 4 ] }",
    ],
)
def test_configs_a_model_can_be_served_with_pass(text: str) -> None:
    validate_config(_config(text), "m")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_batch_size: -1", r"model 'm': max_batch_size -1 is not in 0\.\.1048576"),
        (f"max_batch_size: {MAX_BATCH_SIZE + 1}", "max_batch_size 1048577 is not in"),
        ("input [ { dims: [ 1 ] } ]", "input 0 has no name"),
        ("output [ { name: 'y' }, { name: 'y' } ]", "output 'y' is declared twice"),
        (
            "output [ { name: 'y' dims: [ 4 ] reshape: { shape: [ 2, 0 ] } } ]",
            "model output 'y' reshape dimensions must be integer >= 1",
        ),
        ("instance_group [ { count: -1 } ]", "instance_group 0 count -1 is not in"),
        ("instance_group [ {}, { count: 100000 } ]", "instance_group 1 count 100000"),
        ("version_policy: { latest: { num_versions: 0 } }", "num_versions must be >= 1"),
        ("version_policy: { specific: { } }", "specific lists no versions"),
        ("version_policy: { specific: { versions: [ 2, 0 ] } }", r"versions \[0\] are not"),
        (
            "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 0 ] }",
            "dynamic batching preferred size must be positive for m",
        ),
    ],
)
def test_each_unservable_value_is_refused_with_its_field(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        validate_config(_config(text), "m")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "input [ { name: 'x' dims: [ 0 ] } ]",
            "model input 'x' dimension must be integer >= 1, or -1 to indicate a variable-size "
            "dimension for m",
        ),
        (
            "output [ { name: 'y' dims: [ 4, -2 ] } ]",
            "model output 'y' dimension must be integer >= 1, or -1 to indicate a variable-size "
            "dimension for m",
        ),
    ],
)
def test_a_dimension_below_one_is_refused_per_version_in_tritons_words(
    text: str, message: str
) -> None:
    config = _config(text)
    validate_config(config, "m")  # not with the config: Triton fails the version, not the model
    with pytest.raises(ModelConfigError) as caught:
        validate_dims(config, "m")
    assert caught.value.message == message  # Triton's text exactly: it is the index's reason


def test_a_config_naming_another_model_is_refused_with_the_config() -> None:
    with pytest.raises(ModelConfigError) as caught:
        validate_config(_config('name: "other"'), "m")
    assert caught.value.message == "config name 'other' does not match the model directory 'm'"
    validate_config(_config('name: "m"'), "m")
