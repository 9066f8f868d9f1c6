"""Capabilities are declared, not probed (agent/backends/base.py): each backend's class states
what it can do besides `run`, the scheduler resolves it once when it is built, and no
`getattr(obj, "maybe_attribute", ...)` probe is left on the request path."""

from __future__ import annotations

import ast
import asyncio
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from agent.backends.base import (
    Backend,
    DeclaresConfig,
    HoldsWorkerMemory,
    NamedOutputs,
    ReleasesMemory,
    ReportsProviders,
    RequestFeeds,
    RunsDecoupled,
    RunsRequests,
)
from agent.backends.cancellation import CancelSignal
from agent.backends.onnx import OnnxBackend
from agent.backends.python.backend import PythonBackend
from agent.backends.tensorrt.backend import TensorRTBackend
from agent.errors import AgentError
from agent.proto import model_config_pb2 as mc
from agent.runtime.demo import mlp_model
from agent.scheduling.batching import BatchingPolicy
from agent.scheduling.scheduler import ModelScheduler
from agent.tensors.datatypes import ModelTensor
from agent.tensors.request import RequestContext
from agent.tensors.signature import ValidatedRequest

ROOT = Path(__file__).resolve().parents[3]
# Where requests run, and what builds what they run on.
REQUEST_PATH = ("agent/api", "agent/backends", "agent/ensemble", "agent/models", "agent/scheduling",
                "agent/serving")  # fmt: skip

# The literal-named getattr/hasattr calls left there, each reading what no Protocol of ours can
# declare. Every entry must still be found (the list cannot outlive its reason).
FOREIGN_ATTRIBUTES: dict[tuple[str, str], str] = {
    ("agent/api/metrics.py", "idle"): "psutil's cpu_times fields differ by OS",
    ("agent/api/metrics.py", "iowait"): "psutil's cpu_times fields differ by OS",
    ("agent/serving/cuda_regions.py", "name"): "cuda-python errors: an enum, or a bare int",
    ("agent/backends/tensorrt/backend.py", "device_memory_size_v2"): "TensorRT >= 10.1",
    ("agent/backends/tensorrt/backend.py", "device_memory_size"): "TensorRT < 11",
    ("agent/backends/tensorrt/config.py", "has_implicit_batch_dimension"): "TensorRT < 10",
    ("agent/backends/tensorrt/config.py", "max_batch_size"): "TensorRT < 10",
    # User code: Triton's Python model API leaves these to the model to define (or not).
    ("agent/backends/python/worker/main.py", "TritonPythonModel"): "the model file's class",
    ("agent/backends/python/worker/main.py", "auto_complete_config"): "optional in Triton",
    ("agent/backends/python/worker/main.py", "initialize"): "optional in Triton",
    ("agent/backends/python/worker/main.py", "execute"): "checked, to name what is missing",
    ("agent/backends/python/worker/main.py", "finalize"): "optional in Triton",
}


def literal_attribute_probes(root: Path, packages: Sequence[str]) -> set[tuple[str, str]]:
    """(module, attribute) of every `getattr`/`hasattr` call naming its attribute in a string
    literal (dunders aside: `__name__`, `__version__` are introspection, not capabilities)."""
    found: set[tuple[str, str]] = set()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and isinstance(node.args[1].value, str)
                ):
                    continue
                name = node.args[1].value
                if not (name.startswith("__") and name.endswith("__")):
                    found.add((path.relative_to(root).as_posix(), name))
    return found


def test_no_capability_probe_is_left_on_the_request_path() -> None:
    found = literal_attribute_probes(ROOT, REQUEST_PATH)
    probes = sorted(found - FOREIGN_ATTRIBUTES.keys())
    assert not probes, f"declare these as a Protocol (agent/backends/base.py): {probes}"
    stale = sorted(FOREIGN_ATTRIBUTES.keys() - found)
    assert not stale, f"no longer read; drop them from FOREIGN_ATTRIBUTES: {stale}"


def test_the_scan_finds_a_probe(tmp_path: Path) -> None:
    module = tmp_path / "agent" / "scheduling" / "late.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def go(backend):\n"
        "    run = getattr(backend, 'run_requests', None)\n"
        "    return hasattr(backend, 'release_memory'), getattr(go, '__name__')\n"
    )
    found = literal_attribute_probes(tmp_path, ["agent/scheduling"])
    assert found == {
        ("agent/scheduling/late.py", "run_requests"),
        ("agent/scheduling/late.py", "release_memory"),
    }


@pytest.mark.parametrize(
    ("backend", "declared", "not_declared"),
    [
        (OnnxBackend, {ReleasesMemory, ReportsProviders}, {RunsRequests, DeclaresConfig}),
        (
            PythonBackend,
            {RunsRequests, RunsDecoupled, DeclaresConfig, HoldsWorkerMemory},
            {ReleasesMemory, ReportsProviders},
        ),
        (TensorRTBackend, {DeclaresConfig, ReportsProviders}, {RunsRequests, ReleasesMemory}),
    ],
)
def test_each_backend_declares_what_it_can_do_in_its_class_statement(
    backend: type[object], declared: set[type[object]], not_declared: set[type[object]]
) -> None:
    bases = set(backend.__mro__)
    assert Backend in bases
    assert declared <= bases
    assert not not_declared & bases


class TakesRequestsUnmerged(Backend, RunsRequests):
    """The real ONNX backend declaring `RunsRequests`: the scheduler must hand it each request
    of a batch apart, with its cancel signal, and never call `run`."""

    def __init__(self, inner: OnnxBackend) -> None:
        self.inner = inner
        self.batches: list[int] = []
        self.gate = threading.Event()

    @property
    def inputs(self) -> Sequence[ModelTensor]:
        return self.inner.inputs

    @property
    def outputs(self) -> Sequence[ModelTensor]:
        return self.inner.outputs

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        shrink_memory: bool = False,
    ) -> list[np.ndarray]:
        raise AssertionError("a backend that runs requests is never given a merged batch")

    def run_requests(
        self,
        requests: Sequence[RequestFeeds],
        cancelled: Sequence[CancelSignal] = (),
        *,
        traces: Sequence[object | None] = (),
        contexts: Sequence[RequestContext | None] = (),
    ) -> list[NamedOutputs | AgentError]:
        self.gate.wait(30)
        assert len(cancelled) == len(requests) == len(traces)
        self.batches.append(len(requests))
        return [
            dict(zip(names, self.inner.run(feeds, names), strict=True)) for feeds, names in requests
        ]

    def close(self) -> None:
        self.inner.close()


def test_the_scheduler_gives_a_backend_what_it_declared(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(mlp_model().SerializeToString())
    backend = TakesRequestsUnmerged(OnnxBackend(path, mc.ModelConfig(name="mlp"), 1))
    rng = np.random.default_rng(0)
    requests = [
        ValidatedRequest(
            {"INPUT0": rng.standard_normal((1, 64)).astype(np.float32)}, ("OUTPUT0",), 1
        )
        for _ in range(4)
    ]
    with ThreadPoolExecutor(1) as executor:

        async def main() -> list[np.ndarray]:
            scheduler = ModelScheduler(
                model="mlp",
                version=1,
                backend=backend,
                policy=BatchingPolicy(max_batch_size=8, max_queue_delay_us=0),
                instances=1,
                executor=executor,
                inline_below_ns=0,
            )
            first = asyncio.ensure_future(scheduler.submit(requests[0]))
            rest = [asyncio.ensure_future(scheduler.submit(r)) for r in requests[1:]]
            await asyncio.sleep(0)
            backend.gate.set()  # the three queued meanwhile form one batch
            return [r.outputs[0] for r in await asyncio.gather(first, *rest)]

        outputs = asyncio.run(main())
    assert backend.batches == [1, 3]
    for request, output in zip(requests, outputs, strict=True):
        np.testing.assert_array_equal(output, backend.inner.run(request.feeds, ["OUTPUT0"])[0])
