"""Clients written to the checks of Triton's Python client examples, shared by the HTTP and gRPC
example tests (tests/agent/api/test_triton_client_examples_*.py): the protocol-neutral parts, each
taking the client and its module (`tritonclient.http` or `tritonclient.grpc`)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils


def key(name: str) -> str:
    return f"/{name}_{os.getpid()}"


def check_add_sub(in0: np.ndarray, in1: np.ndarray, out0: np.ndarray, out1: np.ndarray) -> None:
    """The examples' element-by-element check of `simple`'s sum and difference."""
    for i in range(16):
        assert in0.flat[i] + in1.flat[i] == out0[0][i], "incorrect sum"
        assert in0.flat[i] - in1.flat[i] == out1[0][i], "incorrect difference"


def string_shm_tensors() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """simple_string over shared memory: the expected sum and difference, and the serialized
    BYTES tensor of each region (inputs, and outputs at their expected size)."""
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)
    expected_sum = np.array([str(x).encode() for x in in0 + in1], dtype=object)
    expected_diff = np.array([str(x).encode() for x in in0 - in1], dtype=object)
    tensors = {
        "input0_data": utils.serialize_byte_tensor(
            np.array([str(x).encode() for x in in0], object)
        ),
        "input1_data": utils.serialize_byte_tensor(
            np.array([str(x).encode() for x in in1], object)
        ),
        "output0_data": utils.serialize_byte_tensor(expected_sum),
        "output1_data": utils.serialize_byte_tensor(expected_diff),
    }
    return expected_sum, expected_diff, tensors


def string_inference(client: Any, mod: Any, binary: tuple[bool, bool] = (True, False)) -> None:
    """`simple_string`: decimal strings in, their sum and difference as strings out."""
    in0 = np.expand_dims(np.arange(16, dtype=np.int32), axis=0)
    in1 = np.ones((1, 16), dtype=np.int32)
    expected_sum, expected_diff = np.add(in0, in1), np.subtract(in0, in1)
    as_bytes = [np.array([str(x).encode() for x in a.flatten()], dtype=object) for a in (in0, in1)]
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "BYTES"),
        mod.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    if mod is httpclient:
        inputs[0].set_data_from_numpy(as_bytes[0].reshape(1, 16), binary_data=binary[0])
        inputs[1].set_data_from_numpy(as_bytes[1].reshape(1, 16), binary_data=binary[1])
        outputs = [
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary[0]),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary[1]),
        ]
    else:
        inputs[0].set_data_from_numpy(as_bytes[0].reshape(1, 16))
        inputs[1].set_data_from_numpy(as_bytes[1].reshape(1, 16))
    results = client.infer(model_name="simple_string", inputs=inputs, outputs=outputs)
    out0, out1 = results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1")
    for i in range(16):
        assert expected_sum[0][i] == int(out0[0][i])
        assert expected_diff[0][i] == int(out1[0][i])


def sequence_send(
    client: Any, mod: Any, model: str, sequence_id: int | str, values: list[int]
) -> list[np.ndarray]:
    """The sequence examples' `sync_send`: one request per value, START on the first, END on
    the last."""
    results = []
    for count, value in enumerate(values, start=1):
        data = np.full([1, 1], value, dtype=np.int32)
        inputs = [mod.InferInput("INPUT", list(data.shape), "INT32")]
        inputs[0].set_data_from_numpy(data)
        result = client.infer(
            model_name=model,
            inputs=inputs,
            outputs=[mod.InferRequestedOutput("OUTPUT")],
            sequence_id=sequence_id,
            sequence_start=count == 1,
            sequence_end=count == len(values),
        )
        results.append(result.as_numpy("OUTPUT"))
    return results


VALUES = [11, 7, 5, 3, 2, 0, 1]


def expected_sequences(
    dyna: bool, ids: tuple[int, int, int | str], string_results: list[np.ndarray]
) -> list[tuple[int, int, int]]:
    """What the sequence examples expect, step by step, of their three sequences."""
    rows = []
    for i in range(len(VALUES) + 1):
        seq0 = 1 if i == 0 else VALUES[i - 1]
        seq1 = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            text = 20 if dyna else 21
        elif dyna:
            text = -VALUES[i - 1] + int(string_results[i - 1][0][0])
        else:
            text = -VALUES[i - 1]
        if dyna and i != 0 and VALUES[i - 1] == 1:  # the dyna models add the id at the end
            seq0 += int(ids[0])
            seq1 += int(ids[1])
            text += int(ids[2])
        rows.append((seq0, seq1, text))
    return rows


def run_sequences(client: Any, mod: Any, dyna: bool) -> None:
    """The sequence-sync example (`-d`: the dyna models and a numeric string id)."""
    int_model = "simple_dyna_sequence" if dyna else "simple_sequence"
    string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
    ids: tuple[int, int, int | str] = (1000, 1001, "1002" if dyna else "3e2a42cc-uuid-like-id")
    seq0 = sequence_send(client, mod, int_model, ids[0], [0, *VALUES])
    seq1 = sequence_send(client, mod, int_model, ids[1], [100] + [-v for v in VALUES])
    text = sequence_send(client, mod, string_model, ids[2], [20] + [-v for v in VALUES])
    rows = zip(seq0, seq1, text, strict=True)
    got = [(int(a[0][0]), int(b[0][0]), int(c[0][0])) for a, b, c in rows]
    assert got == expected_sequences(dyna, ids, text)


def reuse_infer_objects(client: Any, mod: Any, protocol: str) -> None:
    """The same InferInput / InferRequestedOutput objects, switched between shared memory and
    tensors in the request, three times."""
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)
    size = in0.size * in0.itemsize
    names = ("output0_data", "output1_data", "input0_data", "input1_data")
    handles = {n: shm.create_shared_memory_region(n, key(f"{n}_{protocol}"), size) for n in names}
    try:
        for n in names[:2]:
            client.register_system_shared_memory(n, key(f"{n}_{protocol}"), size)
        shm.set_shared_memory_region(handles["input0_data"], [in0])
        shm.set_shared_memory_region(handles["input1_data"], [in1])
        for n in names[2:]:
            client.register_system_shared_memory(n, key(f"{n}_{protocol}"), size)
        inputs = [
            mod.InferInput("INPUT0", [1, 16], "INT32"),
            mod.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]

        def infer_and_validate(use_shm: bool) -> None:
            first, second = in0, in1
            if use_shm:
                inputs[0].set_shared_memory("input0_data", size)
                inputs[1].set_shared_memory("input1_data", size)
                outputs[0].set_shared_memory("output0_data", size)
                outputs[1].set_shared_memory("output1_data", size)
            else:
                second = in1 * 2
                inputs[0].set_data_from_numpy(np.expand_dims(first, axis=0))
                inputs[1].set_data_from_numpy(np.expand_dims(second, axis=0))
                outputs[0].unset_shared_memory()
                outputs[1].unset_shared_memory()
            results = client.infer(model_name="simple", inputs=inputs, outputs=outputs)
            got = []
            for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
                output = results.get_output(name)
                assert output is not None
                if use_shm:
                    datatype = output.datatype if protocol == "grpc" else output["datatype"]
                    shape = output.shape if protocol == "grpc" else output["shape"]
                    handle = handles[f"output{index}_data"]
                    got.append(
                        shm.get_contents_as_numpy(handle, utils.triton_to_np_dtype(datatype), shape)
                    )
                else:
                    got.append(results.as_numpy(name))
            check_add_sub(first, second, got[0], got[1])

        infer_and_validate(True)
        infer_and_validate(False)
        infer_and_validate(True)
        client.unregister_system_shared_memory()
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)
