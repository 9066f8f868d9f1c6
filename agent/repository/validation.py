"""Checks on a model's config.pbtxt that need no model file: sizes, dims, names, policies.

Pure: a parsed `ModelConfig` in, a `ModelConfigError` naming the first problem out. The loader runs
it before it opens the model file or allocates anything, so an absurd value (a negative batch
size, a dimension of 0, a million instances) fails that one model with its reason instead of
reaching the runtime, the memory planner or the thread pool. What needs the model file (types and
shapes against the model's own) is checked by auto-complete (`agent.repository.autocomplete`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.repository import triton_rules

# Far above what a device serves; past these a value is a typo, not a plan.
MAX_BATCH_SIZE = 1 << 20
MAX_INSTANCES_PER_GROUP = 256
VARIABLE_DIM = -1


def validate_config(config: mc.ModelConfig, model_name: str) -> None:
    """Refuse a config whose values no model could be served with.

    Args:
        config: the parsed config (before auto-complete fills what it leaves out).
        model_name: the model's directory name, for messages.

    Raises:
        ModelConfigError: the first problem found, naming the field.
    """
    where = f"model '{model_name}'"
    if config.name and config.name != model_name:  # Triton refuses it with the config
        raise ModelConfigError(
            f"config name '{config.name}' does not match the model directory '{model_name}'"
        )
    _check_enums(config, "", where)
    if not 0 <= config.max_batch_size <= MAX_BATCH_SIZE:
        raise ModelConfigError(
            f"{where}: max_batch_size {config.max_batch_size} is not in 0..{MAX_BATCH_SIZE}"
        )
    _check_tensors(config.input, "input", where)
    _check_tensors(config.output, "output", where)
    for number, group in enumerate(config.instance_group):
        if not 0 <= group.count <= MAX_INSTANCES_PER_GROUP:
            raise ModelConfigError(
                f"{where}: instance_group {number} count {group.count} is not in "
                f"0..{MAX_INSTANCES_PER_GROUP} (0 means 1)"
            )
    _check_version_policy(config.version_policy, where)
    triton_rules.check_config(config, model_name)


def _check_tensors(
    tensors: Iterable[mc.ModelInput | mc.ModelOutput], kind: str, where: str
) -> None:
    seen: set[str] = set()
    for number, tensor in enumerate(tensors):
        if not tensor.name:
            raise ModelConfigError(f"{where}: {kind} {number} has no name")
        if tensor.name in seen:
            raise ModelConfigError(f"{where}: {kind} '{tensor.name}' is declared twice")
        seen.add(tensor.name)


def validate_dims(config: mc.ModelConfig, model_name: str) -> None:
    """Refuse a dimension below 1 other than -1, in Triton's words. Triton checks it as it
    loads each version (the version is UNAVAILABLE, the model known), not with the config.

    Raises:
        ModelConfigError: the first tensor with such a dimension.
    """
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            _check_dims(tensor.dims, f"model {kind} '{tensor.name}'", model_name)


def _check_dims(dims: Sequence[int], label: str, model_name: str) -> None:
    # Triton's wording; the reshape's dimensions are checked with Triton's other rules.
    if any(d < 1 and d != VARIABLE_DIM for d in dims):
        raise ModelConfigError(
            f"{label} dimension must be integer >= 1, or -1 to indicate a variable-size "
            f"dimension for {model_name}"
        )


def _check_version_policy(policy: mc.ModelVersionPolicy, where: str) -> None:
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest" and policy.latest.num_versions < 1:
        raise ModelConfigError(f"{where}: version_policy latest.num_versions must be >= 1")
    if choice == "specific":
        if not policy.specific.versions:
            raise ModelConfigError(f"{where}: version_policy specific lists no versions")
        bad = [v for v in policy.specific.versions if v < 1]
        if bad:
            raise ModelConfigError(
                f"{where}: version_policy specific versions {bad} are not positive numbers"
            )


def _check_enums(message: Message, path: str, where: str) -> None:
    """Refuse enum numbers the schema does not name: text format and JSON accept any number for
    these open enums (`data_type: -132`), and every later rule names values by enum name."""
    field: Any  # protobuf's stubs type descriptors per implementation (upb/python)
    for field, value in message.ListFields():
        name = f"{path}{field.name}"
        repeated = _is_repeated(field)
        if field.type == FieldDescriptor.TYPE_ENUM:
            for number in value if repeated else (value,):
                if field.enum_type.values_by_number.get(number) is None:
                    raise ModelConfigError(
                        f"{where}: {name} {number} is not a {field.enum_type.name} value"
                    )
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                if field.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                    for key, item in value.items():
                        _check_enums(item, f"{name}[{key!r}].", where)
            elif repeated:
                for number, item in enumerate(value):
                    _check_enums(item, f"{name}[{number}].", where)
            else:
                _check_enums(value, f"{name}.", where)


def _is_repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # newer protobuf; `label` is deprecated there
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED
