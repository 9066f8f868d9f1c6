"""Triton's checks of a config against the model file, before auto-complete, in Triton's words.

Pure: the config as written and the model's tensors in, a `ModelConfigError` naming the first
problem out. These are the checks Triton's backends make when an instance is created
(onnxruntime_backend `ValidateInputs` / `ValidateOutputs`, core `CheckAllowedModelInput`), made
here before auto-complete so that the first problem is reported as Triton reports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc
from agent.tensors.datatypes import ModelTensor

ONNX_PLATFORM = "onnxruntime_onnx"
ONNX_BACKEND = "onnxruntime"
_Control = mc.ModelSequenceBatching.Control
_SEQUENCE_CONTROLS = frozenset(
    {
        _Control.CONTROL_SEQUENCE_START,
        _Control.CONTROL_SEQUENCE_END,
        _Control.CONTROL_SEQUENCE_READY,
        _Control.CONTROL_SEQUENCE_CORRID,
    }
)


# --- against the model file -----------------------------------------------------------------


def check_against_model(
    config: mc.ModelConfig,
    model_name: str,
    inputs: Sequence[ModelTensor],
    outputs: Sequence[ModelTensor],
) -> None:
    """A config input or output the model does not have, or of another data type; for an ONNX
    model, first an input list that does not account for every model input (`check_input_count`).
    An output list may leave some out.

    Raises:
        ModelConfigError: `unexpected inference input 'X', allowed inputs are: ...` (or output).
    """
    name = config.name or model_name
    onnx = config.backend in ("", ONNX_BACKEND) and config.platform in ("", ONNX_PLATFORM)
    if onnx and config.input:
        check_input_count(config, name, inputs)  # before the names, as Triton's ORT backend
    for kind, declared, model in (
        ("input", config.input, inputs),
        ("output", config.output, outputs),
    ):
        by_name = {t.name: t for t in model}
        for tensor in declared:
            found = by_name.get(tensor.name)
            if found is None:
                raise ModelConfigError(
                    f"unexpected inference {kind} '{tensor.name}', allowed {kind}s are: "
                    f"{', '.join(sorted(by_name))} for {name}"
                )
            given = mc.DataType.Name(tensor.data_type)
            provided = found.datatype.config if found.datatype is not None else None
            if tensor.data_type != mc.TYPE_INVALID and provided not in (None, given):
                raise ModelConfigError(
                    f"unable to load model '{name}', configuration expects datatype {given} "
                    f"for {kind} '{tensor.name}', model provides {provided}"
                )


def check_input_count(
    config: mc.ModelConfig, model_name: str, inputs: Sequence[ModelTensor]
) -> None:
    """The ONNX Runtime backend's input count check (onnxruntime_backend `ModelInstanceState`
    constructor and `ValidateInputs`), made whether or not auto-complete is on.

    The config expects its non-optional inputs (optional ones are the model's overridable
    initializers), its batch inputs, one input per sequence control kind it sets and one per
    sequence state; the model must have exactly that many. An input list given only in part is
    refused here: Triton's ONNX Runtime backend fills a missing list, never a partial one.

    Raises:
        ModelConfigError: `unable to load model 'M', configuration expects N inputs, model
            provides K`.
    """
    expected = sum(1 for t in config.input if not t.optional) + len(config.batch_input)
    if config.HasField("sequence_batching"):
        batcher = config.sequence_batching
        kinds = {c.kind for ci in batcher.control_input for c in ci.control}
        expected += len(kinds & _SEQUENCE_CONTROLS)
        expected += len(batcher.state)
    if expected != len(inputs):
        raise ModelConfigError(
            f"unable to load model '{config.name or model_name}', configuration expects "
            f"{expected} inputs, model provides {len(inputs)}"
        )
