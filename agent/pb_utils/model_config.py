"""Triton's model-config helpers of `triton_python_backend_utils`: `ModelConfig` (what
`auto_complete_config` receives and returns) and the lookups in a config as JSON.

Re-exported by `agent.pb_utils`; needs only the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The `input` entry called `name` of a model config (as `json.loads(args["model_config"])`)."""
    return _entry(model_config, "input", name)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The `output` entry called `name` of a model config, or None."""
    return _entry(model_config, "output", name)


def _entry(model_config: Mapping[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(key, ()):
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether the config's `model_transaction_policy` is decoupled."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    """The config `auto_complete_config` receives and returns (Triton's `pb_utils.ModelConfig`).

    `as_dict()` is the config as JSON (the config endpoint's form, `max_batch_size`, `input` and
    `output` always present). Only max_batch_size, inputs, outputs, the dynamic batcher and the
    transaction policy can be changed; each setter refuses, with `ValueError` worded as Triton's,
    a change that contradicts what config.pbtxt says.
    """

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)
        self._model_config.setdefault("max_batch_size", 0)
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Raises ValueError: config.pbtxt sets a larger max_batch_size."""
        current = int(self._model_config["max_batch_size"])
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Raises ValueError: the config already uses another scheduler."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        """Raises ValueError: unknown or missing properties, or a clash with config.pbtxt."""
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Raises ValueError: unknown or missing properties, or a clash with config.pbtxt."""
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Raises ValueError: a key other than 'decoupled', or a different decoupled value."""
        if any(key != "decoupled" for key in transaction_policy_dict):
            raise ValueError(
                "model transaction property in auto-complete-config function for model "
                f"'{self._name}' contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add(self, kind: str, tensor: dict[str, Any], allowed: Sequence[str]) -> None:
        where = f"in auto-complete-config function for model '{self._name}'"
        if any(key not in allowed for key in tensor):
            names = ", ".join(f"'{k}'" for k in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(
                f"{kind} '{tensor.get('name', '')}' {where} contains property other than {names}."
            )
        if "name" not in tensor:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        name = tensor["name"]
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{name}' {where} is missing '{key}' property.")
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            declared_type = current.get("data_type", "TYPE_INVALID")
            if declared_type != "TYPE_INVALID" and declared_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype "
                    f"{declared_type} for {kind} '{name}', model provides {tensor['data_type']}"
                )
            declared_dims = [int(d) for d in current.get("dims", [])]
            if declared_dims and declared_dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{declared_dims}"
                )
            if (
                "optional" in current
                and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))
