"""config.pbtxt and load-request config overrides, mutated: the model fails with a reason.

Real configs (the test repository's, and Triton-style ones using most of the schema) are mutated
as text (bytes deleted, inserted, numbers and enum names replaced, lines repeated) and as field
values (any field of the parsed config set to any value of its type), then loaded by the real
loader against real ONNX models. Property: the build either serves or fails with an `AgentError`
whose reason is the config's problem; never an unexpected exception (which the loader reports as
"unexpected <Type>"), never a hang, never a read outside the model folder.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import example, given
from hypothesis import strategies as st

from agent.errors import ModelConfigError
from agent.models.loader import LoadSettings
from agent.models.registry import ModelRegistry
from agent.proto import model_config_pb2 as mc
from agent.repository.model_config import config_from_json, parse_model_config
from agent.runtime.demo import mlp_model
from tests.fuzz.budget import scaled
from tests.fuzz.strategies import JSON
from tests.models import FLAT_CONFIG, flat_model, write_model

MLP_CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
version_policy: { latest: { num_versions: 1 } }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 2, 4 ]
  max_queue_delay_microseconds: 100
  default_queue_policy {
    timeout_action: REJECT default_timeout_microseconds: 5000 max_queue_size: 8
  }
  priority_levels: 2
  default_priority_level: 1
}
model_warmup [
  {
    name: "zeros"
    batch_size: 2
    count: 1
    inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 64 ] zero_data: true } }
  }
]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
response_cache { enable: false }
"""

CONFIGS = {"m": MLP_CONFIG, "flat": FLAT_CONFIG}

_NUMBER = re.compile(r"-?\d+")
_WORDS = [
    "TYPE_FP32", "TYPE_STRING", "TYPE_INVALID", "KIND_GPU", "KIND_MODEL", "DELAY", "-1", "0",
    "{", "}", "[", "]", ":", '"', "input", "output", "dims", "max_batch_size", "reshape",
    "shape: [ ]", "ensemble_scheduling { }", "sequence_batching { }", "\\", "\n", "#",
]  # fmt: skip
_EDGE_INTS = st.sampled_from(
    [-(2**63), -(2**31), -2, -1, 0, 1, 2, 3, 64, 2**20 + 1, 2**31 - 1, 2**32, 2**63 - 1, 2**64]
)


@st.composite
def _text_mutation(draw: st.DrawFn) -> tuple[str, str]:
    model = draw(st.sampled_from(sorted(CONFIGS)))
    text = CONFIGS[model]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "number", "line", "word"]))
        at = draw(st.integers(0, len(text)))
        if kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 12)) :]
        elif kind == "insert":
            text = text[:at] + draw(st.text(max_size=6) | st.sampled_from(_WORDS)) + text[at:]
        elif kind == "number":
            spans = [m.span() for m in _NUMBER.finditer(text)]
            if spans:
                start, end = draw(st.sampled_from(spans))
                text = text[:start] + str(draw(_EDGE_INTS)) + text[end:]
        elif kind == "line":
            lines = text.splitlines(keepends=True)
            i = draw(st.integers(0, len(lines) - 1))
            text = "".join([*lines[: i + 1], *lines[i:]])
        else:
            words = re.findall(r"[A-Z_]{4,}", text)
            if words:
                old = draw(st.sampled_from(words))
                text = text.replace(old, draw(st.sampled_from(_WORDS)), 1)
    return model, text


_F = FieldDescriptor
_INT64 = {_F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_SINT64, _F.TYPE_FIXED64, _F.TYPE_SFIXED64}
_UNSIGNED = {_F.TYPE_UINT32, _F.TYPE_UINT64, _F.TYPE_FIXED32, _F.TYPE_FIXED64}


def _scalar(draw: st.DrawFn, field: Any) -> Any:
    kind = field.type
    if kind == FieldDescriptor.TYPE_BOOL:
        return draw(st.booleans())
    if kind == FieldDescriptor.TYPE_STRING:
        return draw(st.sampled_from(["", "INPUT0", "OUTPUT0", "m", "../x", "/etc"]) | st.text())
    if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return draw(st.floats(width=32 if kind == FieldDescriptor.TYPE_FLOAT else 64))
    if kind == FieldDescriptor.TYPE_ENUM:
        named = [v.number for v in field.enum_type.values]
        return draw(st.sampled_from(named) | st.integers(-200, 200))  # open enums: any number
    if kind == FieldDescriptor.TYPE_BYTES:
        return draw(st.binary(max_size=8))
    bits = 64 if kind in _INT64 else 32
    unsigned = kind in _UNSIGNED
    low, high = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return draw((_EDGE_INTS | st.integers(-3, 70)).filter(lambda v: low <= v <= high))


def _repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # newer protobuf; `label` is deprecated there
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _mutate(draw: st.DrawFn, message: Message, depth: int = 0) -> None:
    if not message.DESCRIPTOR.fields:
        return
    field: Any = draw(st.sampled_from(list(message.DESCRIPTOR.fields)))
    value = getattr(message, field.name)
    is_message = field.type == FieldDescriptor.TYPE_MESSAGE
    if is_message and field.message_type.GetOptions().map_entry:
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        key = _scalar(draw, key_field)
        if value_field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < 4:
                _mutate(draw, value[key], depth + 1)
        else:
            value[key] = _scalar(draw, value_field)
    elif _repeated(field):
        if is_message:
            if depth < 4:
                item = (
                    value[draw(st.integers(0, len(value) - 1))]
                    if value and draw(st.booleans())
                    else value.add()
                )
                _mutate(draw, item, depth + 1)
        elif value and draw(st.booleans()):
            value[draw(st.integers(0, len(value) - 1))] = _scalar(draw, field)
        else:
            value.append(_scalar(draw, field))
    elif is_message:
        if depth < 4:
            _mutate(draw, value, depth + 1)
    else:
        setattr(message, field.name, _scalar(draw, field))


@st.composite
def _field_mutation(draw: st.DrawFn) -> tuple[str, str]:
    model = draw(st.sampled_from(sorted(CONFIGS)))
    config = parse_model_config(CONFIGS[model], model)
    for _ in range(draw(st.integers(1, 3))):
        _mutate(draw, config)
    return model, text_format.MessageToString(config)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> ModelRegistry:
    root = tmp_path_factory.mktemp("fuzz-repo")
    (root.parent / "outside.bin").write_bytes(b"\0" * 256)
    write_model(root, "m", mlp_model(), MLP_CONFIG)
    write_model(root, "flat", flat_model(), FLAT_CONFIG)
    return ModelRegistry(root, LoadSettings(intra_op_threads=1, measure_memory=False))


def _loads_or_fails_with_a_reason(
    registry: ModelRegistry, model: str, config: mc.ModelConfig | None = None
) -> None:
    build = registry.build(model, config)
    if build.served is not None:
        registry.release(build.served)
        return
    assert build.error is not None
    assert build.record.reason
    assert not re.search(r"unexpected \w+: ", build.record.reason), build.record.reason


def _written(registry: ModelRegistry, model: str, text: str) -> None:
    (registry.repository / model / "config.pbtxt").write_text(
        text, encoding="utf-8", errors="replace"
    )


@scaled(0.5)
@given(_text_mutation())
@example(("m", MLP_CONFIG.replace("max_batch_size: 4", "max_batch_size: -2")))  # the case
@example(("flat", FLAT_CONFIG.replace("TYPE_FP32", "-132", 1)))  # found: DataType.Name ValueError
def test_text_mutations_fail_the_model_with_a_reason(
    repository: ModelRegistry, case: tuple[str, str]
) -> None:
    model, text = case
    _written(repository, model, text)
    _loads_or_fails_with_a_reason(repository, model)


@scaled(0.5)
@given(_field_mutation())
def test_field_mutations_fail_the_model_with_a_reason(
    repository: ModelRegistry, case: tuple[str, str]
) -> None:
    model, text = case
    _written(repository, model, text)
    _loads_or_fails_with_a_reason(repository, model)


@scaled(0.5)
@given(
    st.sampled_from(sorted(CONFIGS)),
    st.dictionaries(
        st.sampled_from(["max_batch_size", "input", "output", "instance_group", "name"])
        | st.text(max_size=6),
        JSON,
        max_size=3,
    ),
)
@example("m", {"max_batch_size": -2})  # the issue: a plain-text 500 once; now a reason (400)
@example("m", {"input": [{"name": "INPUT0", "data_type": -5, "dims": [64]}]})
def test_load_request_overrides_fail_the_model_with_a_reason(
    repository: ModelRegistry, model: str, override: dict[str, Any]
) -> None:
    _written(repository, model, CONFIGS[model])
    try:
        config = config_from_json(json.loads(json.dumps(override)))
    except ModelConfigError:
        return
    _loads_or_fails_with_a_reason(repository, model, config)


# Found by this file's fuzzing: warm-up samples sized by the config alone (a MemoryError or a
# ValueError while loading, reported as "unexpected"), a count that kept the version loading for
# hours, and an input_data_file read from outside the model folder.
@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        ("dims: [ 64 ] zero_data", "dims: [ 64, 100000000 ] zero_data", "over 268435456"),
        ("dims: [ 64 ] zero_data", "dims: [ -1 ] zero_data", "must be all specified"),
        ("batch_size: 2", "batch_size: 4000000000", "is over max_batch_size 4"),
        ("count: 1\n    inputs", "count: 4000000000\n    inputs", "count 4000000000 is over"),
        ("zero_data: true", 'input_data_file: "../../config.pbtxt"', "not a file in the model"),
        ("zero_data: true", 'input_data_file: "/etc/hostname"', "not a file in the model"),
    ],
)
def test_warm_up_samples_the_config_cannot_hold_fail_the_model(
    repository: ModelRegistry, old: str, new: str, reason: str
) -> None:
    assert old in MLP_CONFIG
    _written(repository, "m", MLP_CONFIG.replace(old, new))
    build = repository.build("m")
    assert build.served is None
    assert reason in build.record.reason


def test_the_unmutated_configs_serve(repository: ModelRegistry) -> None:
    """The mutations start from configs that load: a failure is the mutation's doing."""
    for model, text in CONFIGS.items():
        _written(repository, model, text)
        build = repository.build(model)
        assert build.served is not None, build.record.reason
        repository.release(build.served)
