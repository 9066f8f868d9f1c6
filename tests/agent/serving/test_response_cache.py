"""The response cache: key sensitivity, LRU byte accounting, copies, invalidation, counters."""

from __future__ import annotations

import numpy as np
import pytest

from agent.serving.response_cache import (
    ENTRY_OVERHEAD_BYTES,
    TENSOR_OVERHEAD_BYTES,
    ResponseCache,
    cache_key,
    entry_size,
)
from agent.tensors.request import InferInput, OutputTensor

FP32_100_ENTRY = ENTRY_OVERHEAD_BYTES + TENSOR_OVERHEAD_BYTES + 400  # one FP32 tensor of 100


def fp32(name: str, values: list[float], shape: tuple[int, ...]) -> InferInput:
    return InferInput(name, "FP32", shape, np.array(values, dtype=np.float32).reshape(shape))


def texts(name: str, values: list[bytes]) -> InferInput:
    data = np.empty(len(values), dtype=np.object_)
    data[:] = values
    return InferInput(name, "BYTES", (len(values),), data)


def outputs(fill: float = 0.0, count: int = 100) -> tuple[OutputTensor, ...]:
    return (OutputTensor("Y", "FP32", np.full(count, fill, dtype=np.float32)),)


BASE_INPUTS = [fp32("A", [1, 2, 3, 4, 5, 6], (2, 3)), texts("T", [b"ab", b"c"])]
BASE = cache_key("m", "1", BASE_INPUTS, ["Y"])


def test_key_is_a_stable_sha256_digest() -> None:
    again = [fp32("A", [1, 2, 3, 4, 5, 6], (2, 3)), texts("T", [b"ab", b"c"])]
    assert len(BASE) == 32
    assert cache_key("m", "1", again, ["Y"]) == BASE


def test_key_ignores_the_order_inputs_are_listed_in() -> None:
    assert cache_key("m", "1", list(reversed(BASE_INPUTS)), ["Y"]) == BASE


def test_key_of_a_strided_array_equals_its_contiguous_copy() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3).T
    strided = InferInput("A", "FP32", (3, 2), data)
    contiguous = InferInput("A", "FP32", (3, 2), np.ascontiguousarray(data))
    assert cache_key("m", "1", [strided], ["Y"]) == cache_key("m", "1", [contiguous], ["Y"])


def _same_bytes_as_int32() -> InferInput:
    a = BASE_INPUTS[0]
    return InferInput("A", "INT32", a.shape, a.data.view(np.int32))


@pytest.mark.parametrize(
    ("model", "version", "inputs", "names"),
    [
        pytest.param("other", "1", BASE_INPUTS, ["Y"], id="model"),
        pytest.param("m", "2", BASE_INPUTS, ["Y"], id="version"),
        pytest.param("m", "1", [_same_bytes_as_int32(), BASE_INPUTS[1]], ["Y"], id="dtype"),
        pytest.param(
            "m", "1", [fp32("A", [1, 2, 3, 4, 5, 6], (3, 2)), BASE_INPUTS[1]], ["Y"], id="shape"
        ),
        pytest.param(
            "m", "1", [fp32("A", [1, 2, 3, 4, 5, 7], (2, 3)), BASE_INPUTS[1]], ["Y"], id="bytes"
        ),
        pytest.param(
            "m", "1", [fp32("B", [1, 2, 3, 4, 5, 6], (2, 3)), BASE_INPUTS[1]], ["Y"], id="name"
        ),
        pytest.param("m", "1", [BASE_INPUTS[0], texts("T", [b"a", b"bc"])], ["Y"], id="elements"),
        pytest.param("m", "1", BASE_INPUTS[:1], ["Y"], id="missing-input"),
        pytest.param("m", "1", BASE_INPUTS, ["Z"], id="output-name"),
        pytest.param("m", "1", BASE_INPUTS, ["Y", "Z"], id="more-outputs"),
        pytest.param("m1", "", BASE_INPUTS, ["Y"], id="model-version-boundary"),
    ],
)
def test_key_changes_with_every_part_of_the_request(
    model: str, version: str, inputs: list[InferInput], names: list[str]
) -> None:
    assert cache_key(model, version, inputs, names) != BASE


def test_output_name_order_is_part_of_the_key() -> None:
    assert cache_key("m", "1", BASE_INPUTS, ["Y", "Z"]) != cache_key(
        "m", "1", BASE_INPUTS, ["Z", "Y"]
    )


def test_entry_size_counts_arrays_bytes_elements_and_overhead() -> None:
    assert entry_size(outputs()) == FP32_100_ENTRY == 784
    words = np.empty(2, dtype=np.object_)
    words[:] = [b"abc", b"de"]
    two = (OutputTensor("Y", "FP32", np.zeros(10, np.float32)), OutputTensor("L", "BYTES", words))
    assert entry_size(two) == ENTRY_OVERHEAD_BYTES + 2 * TENSOR_OVERHEAD_BYTES + 40 + 16 + 5


def test_lru_evicts_the_least_recently_used_with_exact_accounting() -> None:
    cache = ResponseCache(3 * FP32_100_ENTRY)
    for key in (b"a", b"b", b"c"):
        assert cache.put(key, outputs(), model="m", version="1")
    assert (cache.entries, cache.used_bytes, cache.evictions) == (3, 3 * FP32_100_ENTRY, 0)
    assert cache.get(b"a") is not None  # b is now the least recently used
    assert cache.put(b"d", outputs(), model="m", version="1")
    assert cache.get(b"b") is None
    assert all(cache.get(k) is not None for k in (b"a", b"c", b"d"))
    assert (cache.entries, cache.used_bytes, cache.evictions) == (3, 3 * FP32_100_ENTRY, 1)


def test_a_larger_entry_evicts_as_many_as_it_needs() -> None:
    cache = ResponseCache(3 * FP32_100_ENTRY)
    for key in (b"a", b"b", b"c"):
        cache.put(key, outputs(), model="m", version="1")
    big = outputs(count=250)  # 256 + 128 + 1000 = 1384 bytes: needs two of the 784-byte slots
    assert cache.put(b"big", big, model="m", version="1")
    assert [cache.get(k) is None for k in (b"a", b"b", b"c")] == [True, True, False]
    assert (cache.used_bytes, cache.evictions) == (FP32_100_ENTRY + 1384, 2)


def test_entry_larger_than_capacity_is_refused_without_evicting() -> None:
    cache = ResponseCache(2 * FP32_100_ENTRY)
    cache.put(b"a", outputs(), model="m", version="1")
    assert not cache.put(b"big", outputs(count=1000), model="m", version="1")
    assert (cache.entries, cache.used_bytes, cache.evictions) == (1, FP32_100_ENTRY, 0)
    assert cache.get(b"big") is None


def test_putting_a_key_again_replaces_its_entry() -> None:
    cache = ResponseCache(10 * FP32_100_ENTRY)
    cache.put(b"a", outputs(1.0), model="m", version="1")
    cache.put(b"a", outputs(2.0), model="m", version="1")
    hit = cache.get(b"a")
    assert hit is not None
    assert hit.outputs[0].data[0] == 2.0
    assert (cache.entries, cache.used_bytes) == (1, FP32_100_ENTRY)


def test_cached_arrays_are_copies_the_caller_cannot_change() -> None:
    cache = ResponseCache(10 * FP32_100_ENTRY)
    mine = outputs(1.0)
    cache.put(b"a", mine, model="m", version="1")
    mine[0].data[:] = 9.0
    hit = cache.get(b"a")
    assert hit is not None
    assert hit.outputs[0].data.tolist() == [1.0] * 100
    with pytest.raises(ValueError, match="read-only"):
        hit.outputs[0].data[0] = 5.0
    with pytest.raises(ValueError, match="WRITEABLE"):
        hit.outputs[0].data.flags.writeable = True
    again = cache.get(b"a")
    assert again is not None
    assert again.outputs[0].data.tolist() == [1.0] * 100


def test_cached_bytes_outputs_are_copied_on_every_hit() -> None:
    cache = ResponseCache(10_000)
    words = np.empty(2, dtype=np.object_)
    words[:] = [b"cat", b"dog"]
    cache.put(b"a", (OutputTensor("L", "BYTES", words),), model="m", version="1")
    words[0] = b"eel"
    first = cache.get(b"a")
    assert first is not None
    assert first.outputs[0].data.tolist() == [b"cat", b"dog"]
    first.outputs[0].data[1] = b"fox"
    second = cache.get(b"a")
    assert second is not None
    assert second.outputs[0].data.tolist() == [b"cat", b"dog"]


def test_invalidate_drops_one_version_or_the_whole_model() -> None:
    cache = ResponseCache(10 * FP32_100_ENTRY)
    cache.put(b"m1v1", outputs(), model="m1", version="1")
    cache.put(b"m1v2", outputs(), model="m1", version="2")
    cache.put(b"m2v1", outputs(), model="m2", version="1")
    assert cache.invalidate("m1", "1") == 1
    assert cache.get(b"m1v1") is None
    assert cache.get(b"m1v2") is not None
    assert cache.invalidate("m1") == 1
    assert cache.get(b"m1v2") is None
    assert cache.get(b"m2v1") is not None
    assert (cache.entries, cache.used_bytes, cache.evictions) == (1, FP32_100_ENTRY, 0)
    assert cache.invalidate("absent") == 0


def test_hits_and_misses_are_counted() -> None:
    cache = ResponseCache(10 * FP32_100_ENTRY)
    assert cache.get(b"a") is None
    cache.put(b"a", outputs(), model="m", version="1")
    assert cache.get(b"a") is not None
    assert cache.get(b"a") is not None
    assert cache.get(b"b") is None
    assert (cache.hits, cache.misses) == (2, 2)


def test_capacity_zero_disables_the_cache() -> None:
    cache = ResponseCache(0)
    assert not cache.put(b"a", outputs(), model="m", version="1")
    assert cache.get(b"a") is None
    assert (cache.capacity_bytes, cache.entries, cache.used_bytes) == (0, 0, 0)
    assert (cache.hits, cache.misses, cache.evictions) == (0, 0, 0)


def test_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        ResponseCache(-1)


def test_a_hit_answers_the_parameters_stored_with_the_outputs() -> None:
    cache = ResponseCache(10 * FP32_100_ENTRY)
    given = {"calls": 1, "tag": "first"}
    cache.put(b"a", outputs(1.0), model="m", version="1", parameters=given)
    cache.put(b"b", outputs(1.0), model="m", version="1")
    given["calls"] = 2  # the caller's mapping changes later: the entry keeps its own copy
    hit = cache.get(b"a")
    assert hit is not None
    assert hit.parameters == {"calls": 1, "tag": "first"}
    plain = cache.get(b"b")
    assert plain is not None
    assert plain.parameters is None
