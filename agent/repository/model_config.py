"""Triton model configuration: parse config.pbtxt, render it as Triton's JSON.

The schema is `agent/proto/model_config.proto`, written from Triton's public ModelConfig (same
package, names and field numbers), so real Triton configs parse with protobuf's text format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository.layout import backend_from_files

CONFIG_FILENAME = "config.pbtxt"

ModelConfig = mc.ModelConfig

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def parse_model_config(text: str, source: str) -> mc.ModelConfig:
    """Parse config.pbtxt text.

    Args:
        text: the file's content.
        source: the file name to put in error messages.

    Raises:
        ModelConfigError: a syntax or schema error, as `source:line:column: message`.
    """
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        # The library's message repeats "line:col :" in front; keep only its reason.
        reason = str(exc).split(" : ", 1)[-1] if line is not None else str(exc)
        where = f"{source}:{line}:{column}" if line is not None else source
        raise ModelConfigError(f"{where}: {reason}") from None
    return config


def load_model_config(model_dir: Path) -> mc.ModelConfig | None:
    """Read `model_dir/config.pbtxt`; None when the file does not exist.

    A config that names no platform and no backend gets `backend: "python"` when the model's
    first version folder holds `model.py`, as Triton fills it (`layout.backend_from_files`).

    Raises:
        ModelConfigError: the file exists but does not parse, or cannot be read as UTF-8.
    """
    path = model_dir / CONFIG_FILENAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc}") from None
    config = parse_model_config(text, str(path))
    backend = backend_from_files(model_dir, config)
    if backend:
        config.backend = backend
    return config


def config_from_json(doc: dict[str, Any]) -> mc.ModelConfig:
    """Build a config from its JSON form (as the config endpoint returns it, or a load request's
    override). Its values are checked by the loader, as a config.pbtxt's are.

    Raises:
        ModelConfigError: unknown fields, wrong value types or values out of range.
    """
    config = mc.ModelConfig()
    try:
        json_format.ParseDict(doc, config)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise ModelConfigError(f"invalid model config JSON: {exc}") from None
    return config


def config_to_json(config: Message) -> dict[str, Any]:
    """Render a config the way Triton's config endpoint does.

    Field names as in the .proto, scalar and repeated fields always present (defaults included),
    enums by name, 64-bit integers as JSON numbers (Triton converts them back from the strings
    protobuf's JSON printer makes), sub-messages only when set.
    """
    out: dict[str, Any] = {}
    field: Any  # protobuf's stubs type descriptors per implementation (upb/python)
    for field in config.DESCRIPTOR.fields:
        value = getattr(config, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _scalar_or_message(value_field, v) for k, v in value.items()}
        elif _is_repeated(field):
            out[field.name] = [_scalar_or_message(field, v) for v in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if config.HasField(field.name):
                out[field.name] = config_to_json(value)
        elif (field.containing_oneof is not None and not config.HasField(field.name)) or (
            field.name in _NEWER_THAN_TRITON and not value
        ):
            continue
        else:
            out[field.name] = _scalar_or_message(field, value)
    return out


# Fields of our model_config.proto that the Triton we answer as (2.51) does not have: printed
# only when set, so a config that does not use them reads as Triton's.
_NEWER_THAN_TRITON = frozenset({"max_inflight_requests"})


def _is_repeated(field: Any) -> bool:
    # `label` is deprecated in newer protobuf releases in favour of `is_repeated`.
    flag = getattr(field, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _is_map(field: Any) -> bool:
    is_message = field.type == FieldDescriptor.TYPE_MESSAGE
    return bool(is_message and field.message_type.GetOptions().map_entry)


def _scalar_or_message(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return config_to_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    if field.type in _INT64_TYPES:
        return int(value)
    return value


def instance_count(config: mc.ModelConfig) -> int:
    """Executions in flight for a model: the sum of its instance groups' counts.

    A config not yet completed counts as Triton will complete it: no group is one group of the
    default count, a group without a count has the default count (`default_instance_count`).
    """
    if not config.instance_group:
        return default_instance_count(config, mc.ModelInstanceGroup.KIND_AUTO)
    counts = (
        g.count if g.count > 0 else default_instance_count(config, g.kind)
        for g in config.instance_group
    )
    return max(1, sum(counts))


def default_instance_count(config: mc.ModelConfig, kind: int) -> int:
    """Triton core's SetDefaultInstanceCount on a device without GPUs: 2 for a CPU group (a
    KIND_AUTO one runs on the CPU here) of the onnxruntime backend, 1 otherwise.

    A config that names neither backend nor platform is an ONNX model (see autocomplete).
    """
    onnx = config.backend == "onnxruntime" or (
        not config.backend and config.platform in ("", "onnxruntime_onnx")
    )
    cpu = kind in (mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_AUTO)
    return 2 if onnx and cpu else 1
