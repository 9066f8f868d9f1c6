"""A model repository for child traces: an ensemble of two add_sub steps, a Python model that
makes BLS calls (one passing `trace=request.trace()`, one not), and an ensemble around it."""

from __future__ import annotations

from pathlib import Path

from tests.models import add_sub_model, write_model
from tests.python_models import write_python_model

_IO = """
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

# OUTPUT0 = (a + b) + (a - b) = 2a, OUTPUT1 = (a + b) - (a - b) = 2b
ENSEMBLE_STEPS = """
ensemble_scheduling {
  step { model_name: "add_sub" model_version: -1
         input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
         output_map { key: "OUTPUT0" value: "s" } output_map { key: "OUTPUT1" value: "d" } }
  step { model_name: "add_sub" model_version: -1
         input_map { key: "INPUT0" value: "s" } input_map { key: "INPUT1" value: "d" }
         output_map { key: "OUTPUT0" value: "OUTPUT0" }
         output_map { key: "OUTPUT1" value: "OUTPUT1" } }
}
"""

ENSEMBLE_OF_BLS = """
ensemble_scheduling {
  step { model_name: "bls_traced" model_version: -1
         input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
         output_map { key: "OUTPUT0" value: "OUTPUT0" }
         output_map { key: "OUTPUT1" value: "OUTPUT1" } }
}
"""

# add_sub twice per request: traced as a child (trace=request.trace()), and not (Triton's default).
BLS_TRACED_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ]
            outputs = ["OUTPUT0", "OUTPUT1"]
            traced = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=outputs, inputs=inputs,
                trace=request.trace(),
            ).exec()
            plain = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=outputs, inputs=inputs
            ).exec()
            for response in (traced, plain):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=traced.output_tensors()))
        return responses
"""


def write_trace_children_repo(repo: Path) -> Path:
    """`add_sub` (ONNX), `ens` (two add_sub steps), `bls_traced` (Python, BLS to add_sub) and
    `ens_bls` (one bls_traced step)."""
    write_model(
        repo, "add_sub", add_sub_model(), 'name: "add_sub"\nplatform: "onnxruntime_onnx"' + _IO
    )
    for name, steps in (("ens", ENSEMBLE_STEPS), ("ens_bls", ENSEMBLE_OF_BLS)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "ensemble"' + _IO + steps
        )
    write_python_model(
        repo, "bls_traced", BLS_TRACED_MODEL, 'name: "bls_traced"\nbackend: "python"' + _IO
    )
    return repo
