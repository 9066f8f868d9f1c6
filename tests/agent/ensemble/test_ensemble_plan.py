"""Ensemble DAG checks: pure, from config text to plan or a refusal naming what is wrong."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from agent.ensemble.plan import build_plan, composing_model_names, decoupled_ensemble, is_ensemble
from agent.errors import ModelConfigError
from agent.proto import model_config_pb2 as mc

PRE = """
name: "pre" backend: "python" max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_UINT8 dims: [ 64 ] } ]
output [ { name: "FEATURES" data_type: TYPE_FP32 dims: [ 64 ] } ]
"""
CLS = """
name: "cls" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""
POST = """
name: "post" backend: "python" max_batch_size: 8
input [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ 10 ] } ]
output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
UNBATCHED = """
name: "flat" platform: "onnxruntime_onnx" max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""

HEAD = """
name: "pipeline" platform: "ensemble" max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ 64 ] } ]
output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
STEP_PRE = """
step { model_name: "pre" model_version: -1
       input_map { key: "RAW" value: "IMAGE" } output_map { key: "FEATURES" value: "feat" } }
"""
STEP_CLS = """
step { model_name: "cls" model_version: -1
       input_map { key: "x" value: "feat" } output_map { key: "y" value: "logits" } }
"""
STEP_POST = """
step { model_name: "post" model_version: -1
       input_map { key: "LOGITS" value: "logits" } output_map { key: "LABEL" value: "LABEL" } }
"""


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


MODELS = {c.name: c for c in map(_config, (PRE, CLS, POST, UNBATCHED))}


def _plan(steps: str, head: str = HEAD) -> object:
    config = _config(head + "ensemble_scheduling {" + steps + "}")
    return build_plan(config, MODELS.get)


def _refused(steps: str, head: str = HEAD) -> str:
    with pytest.raises(ModelConfigError) as caught:
        _plan(steps, head)
    return caught.value.message


def test_steps_are_ordered_by_their_data_whatever_the_config_order() -> None:
    config = _config(HEAD + "ensemble_scheduling {" + STEP_POST + STEP_CLS + STEP_PRE + "}")
    plan = build_plan(config, MODELS.get)
    assert [s.model_name for s in plan.steps] == ["pre", "cls", "post"]
    assert plan.composing_models == ("pre", "cls", "post")
    assert plan.steps[0].inputs == {"RAW": "IMAGE"}
    assert plan.inputs["IMAGE"].shape == (-1, 64)
    assert is_ensemble(config)
    assert composing_model_names(config) == ("post", "cls", "pre")


def test_a_composing_model_that_is_not_loaded_is_refused() -> None:
    message = _refused(STEP_PRE + STEP_CLS.replace('"cls"', '"missing"') + STEP_POST)
    assert "step 1 (model 'missing')" in message
    assert "not loaded" in message


def test_a_tensor_nothing_produces_is_refused() -> None:
    message = _refused(STEP_CLS + STEP_POST)
    assert "step 0 (model 'cls') input 'x' reads tensor 'feat'" in message
    assert "no ensemble input or step produces" in message


def test_a_type_mismatch_between_steps_is_refused() -> None:
    skip_pre = STEP_CLS.replace('value: "feat"', 'value: "IMAGE"')
    message = _refused(skip_pre + STEP_POST)
    assert "tensor 'IMAGE' is UINT8 but step 0 (model 'cls') input 'x' expects FP32" in message


def test_a_shape_mismatch_is_refused() -> None:
    narrow = _config(CLS.replace('"cls"', '"narrow"').replace("dims: [ 64 ]", "dims: [ 32 ]"))
    models = {**MODELS, "narrow": narrow}
    steps = STEP_PRE + STEP_CLS.replace('"cls"', '"narrow"') + STEP_POST
    with pytest.raises(ModelConfigError) as caught:
        build_plan(_config(HEAD + "ensemble_scheduling {" + steps + "}"), models.get)
    assert (
        "tensor 'feat' has shape [-1, 64] but step 1 (model 'narrow') input 'x' expects [-1, 32]"
        in caught.value.message
    )


def test_an_output_no_step_produces_is_refused() -> None:
    head = HEAD.replace(
        'output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] } ]',
        'output [ { name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] },'
        ' { name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] } ]',
    )
    message = _refused(STEP_PRE + STEP_CLS + STEP_POST, head)
    assert "output 'SCORE' is not produced by any step" in message


def test_an_ensemble_output_with_the_wrong_type_is_refused() -> None:
    head = HEAD.replace("TYPE_INT64", "TYPE_INT32")
    message = _refused(STEP_PRE + STEP_CLS + STEP_POST, head)
    assert "tensor 'LABEL' is INT64 but ensemble output 'LABEL' expects INT32" in message


def test_a_pure_cycle_is_named_as_such() -> None:
    # Two steps of one model feeding each other; a third one serves the ensemble's output.
    models = dict(MODELS)
    models["sq"] = _config(
        'name: "sq" platform: "onnxruntime_onnx" max_batch_size: 8 '
        'input [ { name: "i" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "o" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    )
    head = (
        'name: "loop" platform: "ensemble" max_batch_size: 8 '
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ] '
    )
    steps = """ensemble_scheduling {
      step { model_name: "sq" input_map { key: "i" value: "IN" }
             output_map { key: "o" value: "OUT" } }
      step { model_name: "sq" input_map { key: "i" value: "t2" }
             output_map { key: "o" value: "t1" } }
      step { model_name: "sq" input_map { key: "i" value: "t1" }
             output_map { key: "o" value: "t2" } }
    }"""
    with pytest.raises(ModelConfigError) as caught:
        build_plan(_config(head + steps), models.get)
    assert "steps form a cycle" in caught.value.message
    assert "step 1 (model 'sq')" in caught.value.message
    assert "step 2 (model 'sq')" in caught.value.message


def test_a_tensor_written_twice_is_refused() -> None:
    twice = STEP_PRE + STEP_CLS + STEP_CLS + STEP_POST
    message = _refused(twice)
    assert "tensor 'logits' is produced by both step 1 and step 2 (model 'cls')" in message


def test_an_unknown_map_key_and_an_unmapped_input_are_refused() -> None:
    assert "input_map names 'nope'" in _refused(
        STEP_PRE + STEP_CLS.replace('key: "x"', 'key: "nope"') + STEP_POST
    )
    assert "output_map names 'z'" in _refused(
        STEP_PRE + STEP_CLS.replace('key: "y"', 'key: "z"') + STEP_POST
    )


def test_a_batched_ensemble_over_an_unbatched_model_is_refused() -> None:
    message = _refused(STEP_PRE + STEP_CLS.replace('"cls"', '"flat"') + STEP_POST)
    assert "step 1 (model 'flat') does not batch" in message


def test_an_ensemble_without_steps_or_tensors_is_refused() -> None:
    assert "has no step" in _refused("")
    with pytest.raises(ModelConfigError, match="must declare its inputs and outputs"):
        build_plan(
            _config('name: "e" platform: "ensemble" ensemble_scheduling {' + STEP_PRE + "}"),
            MODELS.get,
        )


def test_an_ensemble_batching_more_than_a_step_is_refused() -> None:
    head = HEAD.replace("max_batch_size: 8", "max_batch_size: 16")
    message = _refused(STEP_PRE + STEP_CLS + STEP_POST, head)
    assert "max_batch_size 16 is over step 0 (model 'pre')'s 8" in message


def test_a_decoupled_step_makes_the_ensemble_decoupled() -> None:
    decoupled = _config(POST.replace('name: "post"', 'name: "stream"'))
    decoupled.model_transaction_policy.decoupled = True
    config = _config(
        HEAD
        + "ensemble_scheduling {"
        + STEP_PRE
        + STEP_CLS
        + STEP_POST.replace('"post"', '"stream"')
        + "}"
    )
    plan = build_plan(config, {**MODELS, "stream": decoupled}.get)
    assert [step.decoupled for step in plan.steps] == [False, False, True]
    assert decoupled_ensemble(plan)
    plain = _config(HEAD + "ensemble_scheduling {" + STEP_PRE + STEP_CLS + STEP_POST + "}")
    assert not decoupled_ensemble(build_plan(plain, MODELS.get))
