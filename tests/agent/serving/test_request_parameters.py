"""What a request tells its model besides tensors, and the parameters an ensemble answers with."""

from __future__ import annotations

import numpy as np

from agent.scheduling.sequence_policy import SequenceRequest
from agent.serving.request_parameters import ensemble_parameters, request_context
from agent.tensors.request import InferInput, InferRequest, RequestContext

X = (InferInput("x", "INT32", (1,), np.zeros(1, dtype=np.int32)),)


def test_a_plain_request_has_no_context() -> None:
    assert request_context(InferRequest(X)) is None


def test_the_model_sees_the_id_and_the_parameters_the_server_does_not_consume() -> None:
    params = {"s": "v", "i": 3, "priority": 1, "timeout": 5, "sequence_id": 9}
    request = InferRequest(X, id="abc", parameters={**params, "binary_data_output": True})

    assert request_context(request, 9) == RequestContext("abc", {"s": "v", "i": 3}, 9)


def test_a_sequence_alone_is_a_context() -> None:
    assert request_context(InferRequest(X), "seq") == RequestContext("", {}, "seq")


def test_ensembles_answer_with_the_sequence_parameters() -> None:
    assert ensemble_parameters(None) == {
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
    }
    assert ensemble_parameters(SequenceRequest(5, start=True)) == {
        "sequence_id": 5,
        "sequence_start": True,
        "sequence_end": False,
    }
