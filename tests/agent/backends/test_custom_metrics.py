"""Custom metrics of Python models (`pb_utils.MetricFamily`): the worker-side API with Triton's
rules and messages, the agent's store, and a real agent whose /metrics shows them."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from agent import pb_utils
from agent.api.metrics import build_registry, render
from agent.backends.python.custom_metrics import CustomMetricStore
from agent.pb_utils import metrics as pb_metrics
from agent.runtime.daemon import RunningAgent
from agent.scheduling.statistics import StatisticsRegistry
from tests.prometheus_text import read_families
from tests.python_models import write_python_model
from tests.server import explicit_agent, http_client

COUNTER_NEGATIVE = (
    "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
)

# --- the worker-side API, in this process ------------------------------------------------------


def test_counter_gauge_histogram_values_and_coalesced_updates() -> None:
    pb_metrics.take_updates()
    counter = pb_utils.MetricFamily(
        name="t_unit_counter", description="c", kind=pb_utils.MetricFamily.COUNTER
    ).Metric(labels={"model": "m"})
    gauge = pb_utils.MetricFamily("t_unit_gauge", "g", pb_utils.MetricFamily.GAUGE).Metric()
    hist = pb_utils.MetricFamily("t_unit_hist", "h", pb_utils.MetricFamily.HISTOGRAM).Metric(
        labels={"a": "b"}, buckets=[1.0, 2.0]
    )
    for _ in range(10_000):  # a hot loop: one pending delta, not 10,000 messages
        counter.increment(1)
    gauge.increment(5)
    gauge.set(2.5)
    gauge.increment(-1)
    hist.observe(0.5)
    hist.observe(1.5)
    hist.observe(7)
    assert counter.value() == 10_000
    assert gauge.value() == 1.5
    updates = pb_metrics.take_updates()
    assert updates is not None
    assert {f["name"] for f in updates["families"]} >= {"t_unit_counter", "t_unit_gauge"}
    by_family = {m["family"]: m for m in updates["metrics"]}
    assert by_family["t_unit_counter"] == {
        "family": "t_unit_counter",
        "labels": {"model": "m"},
        "inc": 10_000.0,
    }
    assert by_family["t_unit_gauge"]["set"] == 1.5
    assert by_family["t_unit_hist"]["counts"] == [1, 1, 1]
    assert by_family["t_unit_hist"]["sum"] == 9.0
    assert pb_metrics.take_updates() is None  # nothing new
    # The same labels are the same metric.
    again = pb_utils.MetricFamily("t_unit_counter", "other", pb_utils.MetricFamily.COUNTER)
    assert again.Metric(labels={"model": "m"}).value() == 10_000


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda c, g, h: c.increment(-1), COUNTER_NEGATIVE),
        (lambda c, g, h: c.set(1), "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
        (lambda c, g, h: c.observe(1), "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"),
        (lambda c, g, h: g.observe(1), "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"),
        (
            lambda c, g, h: h.increment(1),
            "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment",
        ),
        (lambda c, g, h: h.set(1), "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set"),
        (lambda c, g, h: h.value(), "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"),
    ],
)
def test_operations_the_kind_does_not_support_raise_tritons_message(
    action: Any, message: str
) -> None:
    c = pb_utils.MetricFamily("t_ops_c", "c", pb_utils.MetricFamily.COUNTER).Metric()
    g = pb_utils.MetricFamily("t_ops_g", "g", pb_utils.MetricFamily.GAUGE).Metric()
    h = pb_utils.MetricFamily("t_ops_h", "h", pb_utils.MetricFamily.HISTOGRAM).Metric(buckets=[1])
    with pytest.raises(pb_utils.TritonModelException, match=message.replace(".", r"\.")):
        action(c, g, h)


@pytest.mark.parametrize(
    ("create", "message"),
    [
        (
            lambda: pb_utils.MetricFamily("t_dup", "d", pb_utils.MetricFamily.GAUGE),
            "already exists with a different kind",
        ),
        (
            lambda: pb_utils.MetricFamily("9bad name", "d", pb_utils.MetricFamily.GAUGE),
            "Invalid metric name",
        ),
        (
            lambda: pb_utils.MetricFamily("t_kind", "d", 7),  # type: ignore[arg-type]
            "Unsupported kind",
        ),
        (
            lambda: pb_utils.MetricFamily("t_lab", "d", pb_utils.MetricFamily.GAUGE).Metric(
                labels={"bad-name": "x"}
            ),
            "Invalid label name 'bad-name'",
        ),
        (
            lambda: pb_utils.MetricFamily("t_lab", "d", pb_utils.MetricFamily.GAUGE).Metric(
                labels={"n": 3}  # type: ignore[dict-item]
            ),
            "Parameter [n] must have a type of TRITONSERVER_PARAMETER_STRING",
        ),
        (
            lambda: pb_utils.MetricFamily("t_h", "d", pb_utils.MetricFamily.HISTOGRAM).Metric(),
            "Bucket boundaries not found in Metric args.",
        ),
        (
            lambda: pb_utils.MetricFamily("t_h", "d", pb_utils.MetricFamily.HISTOGRAM).Metric(
                buckets=[2, 1]
            ),
            "Bucket Boundaries must be strictly sorted",
        ),
        (
            lambda: pb_utils.MetricFamily("t_c", "d", pb_utils.MetricFamily.COUNTER).Metric(
                buckets=[1]
            ),
            "Unexpected args found in counter Metric constructor.",
        ),
    ],
)
def test_invalid_families_and_metrics_raise(create: Any, message: str) -> None:
    pb_utils.MetricFamily("t_dup", "d", pb_utils.MetricFamily.COUNTER)
    with pytest.raises(pb_utils.TritonModelException) as caught:
        create()
    assert message in caught.value.message()


# --- the agent's store and its rendering ---------------------------------------------------------


def scrape(stats: StatisticsRegistry) -> dict[str, Any]:
    body, _ = render(build_registry(stats, None))
    return {f.name: f for f in read_families(body.decode())}


def test_store_sums_workers_renders_and_forgets_released_series() -> None:
    stats = StatisticsRegistry()
    store: CustomMetricStore = stats.custom_metrics
    family = {"name": "my_requests", "description": "Requests seen", "kind": "COUNTER"}
    hist = {"name": "my_latency", "description": "Latency", "kind": "HISTOGRAM"}
    for worker in ("w0", "w1"):
        assert not store.apply(
            worker,
            {
                "families": [family, hist],
                "metrics": [
                    {"family": "my_requests", "labels": {"model": "m"}, "inc": 2},
                    {
                        "family": "my_latency",
                        "labels": {},
                        "buckets": [0.5, 1],
                        "counts": [1, 0, 1],
                        "sum": 3.25,
                    },
                ],
            },
        )
    refused = store.apply("w2", {"families": [{**family, "kind": "GAUGE"}], "metrics": []})
    assert "already exists with a different kind" in refused[0]
    families = scrape(stats)
    # Counters keep their exact names and their type, as the agent's own; histograms too.
    assert families["my_requests"].type == "counter"
    assert families["my_requests"].documentation == "Requests seen"
    assert [(s.labels, s.value) for s in families["my_requests"].samples] == [({"model": "m"}, 4)]
    samples = {(s.name, s.labels.get("le")): s.value for s in families["my_latency"].samples}
    assert samples[("my_latency_bucket", "0.5")] == 2
    assert samples[("my_latency_bucket", "1")] == 2
    assert samples[("my_latency_bucket", "+Inf")] == 4
    assert samples[("my_latency_count", None)] == 4
    assert samples[("my_latency_sum", None)] == 6.5
    store.release("w0")
    assert "my_requests" in scrape(stats)
    store.release("w1")
    assert "my_requests" not in scrape(stats)


# --- a real agent --------------------------------------------------------------------------------

METRICS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily(
            name="custom_requests", description="Requests executed",
            kind=pb_utils.MetricFamily.COUNTER,
        ).Metric(labels={"model": args["model_name"], "version": args["model_version"]})
        self.loops = pb_utils.MetricFamily(
            name="custom_loop_steps", description="Steps of a hot loop",
            kind=pb_utils.MetricFamily.COUNTER,
        ).Metric()
        self.last = pb_utils.MetricFamily(
            name="custom_last_x", description="Last X seen", kind=pb_utils.MetricFamily.GAUGE,
        ).Metric(labels={"model": args["model_name"]})
        self.sizes = pb_utils.MetricFamily(
            name="custom_x", description="X seen", kind=pb_utils.MetricFamily.HISTOGRAM,
        ).Metric(labels={"model": args["model_name"]}, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if mode == 1:
                self.requests.increment(-1)
            elif mode == 2:
                self.requests.set(3)
            elif mode == 3:
                self.last.observe(1)
            elif mode == 4:
                self.sizes.value()
            elif mode == 5:
                pb_utils.MetricFamily("custom_requests", "again", pb_utils.MetricFamily.GAUGE)
            elif mode == 6:
                pb_utils.MetricFamily("custom_bad", "b", pb_utils.MetricFamily.GAUGE).Metric(
                    labels={"__reserved": "x"})
            self.requests.increment(1)
            for _ in range(1000):
                self.loops.increment(1)
            self.last.set(x)
            self.sizes.observe(x)
            y = np.array([self.requests.value(), self.last.value()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""

METRICS_CONFIG = """
name: "metrics_model"
backend: "python"
input [
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "X" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [ { name: "Y" data_type: TYPE_FP64 dims: [ 2 ] } ]
"""

# A copy, written to the same API, of Triton's python_backend examples/custom_metrics model: an
# add/sub model that adds each execute's processing time to a counter and logs its value.
EXAMPLE_MODEL = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        out0 = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        out1 = pb_utils.get_output_config_by_name(config, "OUTPUT1")
        self.out0_dtype = pb_utils.triton_string_to_numpy(out0["data_type"])
        self.out1_dtype = pb_utils.triton_string_to_numpy(out1["data_type"])
        self.metric_family = pb_utils.MetricFamily(
            name="requests_process_latency_ns",
            description="Cumulative time spent processing requests",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.metric = self.metric_family.Metric(
            labels={"model": "custom_metrics", "version": "1"}
        )

    def execute(self, requests):
        responses = []
        start_ns = time.time_ns()
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.out0_dtype)),
                pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.out1_dtype)),
            ]))
        end_ns = time.time_ns()
        self.metric.increment(end_ns - start_ns + 1)
        pb_utils.Logger.log_info(
            "Cumulative requests processing latency: {}".format(self.metric.value())
        )
        return responses
"""

EXAMPLE_CONFIG = """
name: "custom_metrics"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [ { kind: KIND_CPU } ]
"""


# Two instances (two worker processes) share one labelled counter: each execute adds 1 and
# answers value() and its worker's pid.
SHARED_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.counter = pb_utils.MetricFamily(
            name="custom_shared_total", description="Shared by every instance",
            kind=pb_utils.MetricFamily.COUNTER,
        ).Metric(labels={"model": args["model_name"]})
        self.started = self.counter.value()

    def execute(self, requests):
        responses = []
        for request in requests:
            self.counter.increment(1)
            y = np.array([self.counter.value(), os.getpid()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""

SHARED_CONFIG = """
name: "metrics_shared"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP64 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    repo = tmp_path_factory.mktemp("custom_metrics") / "models"
    write_python_model(repo, "metrics_model", METRICS_MODEL, METRICS_CONFIG)
    write_python_model(repo, "custom_metrics", EXAMPLE_MODEL, EXAMPLE_CONFIG)
    write_python_model(repo, "metrics_shared", SHARED_MODEL, SHARED_CONFIG)
    with explicit_agent(repo, metrics_port=0) as running:
        yield running


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpclient.InferenceServerClient]:
    with http_client(agent) as c:
        yield c


def metrics(agent: RunningAgent) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics") as response:
        text = response.read().decode()
    return {f.name: f for f in read_families(text)}


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    family = name
    for suffix in ("_bucket", "_count", "_sum"):
        if family not in families:
            family = name.removesuffix(suffix)
    for s in families[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


def run(client: httpclient.InferenceServerClient, mode: int, x: float) -> np.ndarray:
    inputs = [httpclient.InferInput("MODE", [1], "INT32"), httpclient.InferInput("X", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([mode], dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array([x], dtype=np.float32))
    result = client.infer("metrics_model", inputs)
    y: np.ndarray | None = result.as_numpy("Y")
    assert y is not None
    return y


def test_counter_gauge_and_histogram_show_on_metrics(
    agent: RunningAgent, client: httpclient.InferenceServerClient
) -> None:
    before = metrics(agent)
    # Created in initialize: shown at 0 before any request, as Triton does.
    assert sample(before, "custom_requests", model="metrics_model", version="1") == 0
    assert before["custom_requests"].documentation == "Requests executed"
    for i, x in enumerate((0.5, 5.0, 50.0)):
        y = run(client, 0, x)
        assert y.tolist() == [i + 1, x]  # value() reads back
    families = metrics(agent)
    assert sample(families, "custom_requests", model="metrics_model", version="1") == 3
    assert sample(families, "custom_loop_steps") == 3000
    assert families["custom_last_x"].type == "gauge"
    assert sample(families, "custom_last_x", model="metrics_model") == 50
    assert families["custom_x"].type == "histogram"
    assert sample(families, "custom_x_bucket", model="metrics_model", le="1") == 1
    assert sample(families, "custom_x_bucket", model="metrics_model", le="10") == 2
    assert sample(families, "custom_x_bucket", model="metrics_model", le="+Inf") == 3
    assert sample(families, "custom_x_count", model="metrics_model") == 3
    assert math.isclose(sample(families, "custom_x_sum", model="metrics_model"), 55.5)
    # The agent's own metrics are still there.
    assert "nv_inference_request_success" in families


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (1, COUNTER_NEGATIVE),
        (2, "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
        (3, "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"),
        (4, "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"),
        (5, "already exists with a different kind"),
        (6, "Invalid label name '__reserved'"),
    ],
)
def test_invalid_use_fails_the_request_with_tritons_words_and_the_model_stays_ready(
    agent: RunningAgent, client: httpclient.InferenceServerClient, mode: int, message: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        run(client, mode, 1.0)
    assert message in str(caught.value)
    assert "TritonModelException" in str(caught.value)
    assert client.is_model_ready("metrics_model")
    count = run(client, 0, 1.0)[0]
    assert sample(metrics(agent), "custom_requests", model="metrics_model") == count


def test_tritons_custom_metrics_example_driven_like_its_client(
    agent: RunningAgent, client: httpclient.InferenceServerClient
) -> None:
    # As the example's client.py: infer, check the outputs, then read the counter on /metrics.
    in0 = np.random.rand(1, 4).astype(np.float32)[0]
    in1 = np.random.rand(1, 4).astype(np.float32)[0]
    inputs = [
        httpclient.InferInput("INPUT0", [4], "FP32"),
        httpclient.InferInput("INPUT1", [4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0"),
        httpclient.InferRequestedOutput("OUTPUT1"),
    ]
    result = client.infer("custom_metrics", inputs, outputs=outputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), in0 + in1)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), in0 - in1)
    families = metrics(agent)
    latency = sample(families, "requests_process_latency_ns", model="custom_metrics", version="1")
    assert latency > 0
    body = urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics").read()
    assert b'requests_process_latency_ns{model="custom_metrics",version="1"}' in body


def test_unloading_the_model_removes_its_series_but_keeps_the_family(
    agent: RunningAgent, client: httpclient.InferenceServerClient
) -> None:
    run(client, 0, 2.0)
    client.unload_model("metrics_model")
    families = metrics(agent)
    assert "custom_requests" not in families  # no series left: nothing rendered
    client.load_model("metrics_model")
    assert sample(metrics(agent), "custom_requests", model="metrics_model") == 0


def test_value_is_the_total_of_every_instance(
    agent: RunningAgent, client: httpclient.InferenceServerClient
) -> None:
    # As in Triton, where the metric lives once in the server: each instance's value() is the
    # sum of every instance's increments, not its own share.
    answers = []
    for _ in range(6):
        inputs = [httpclient.InferInput("X", [1], "FP32")]
        inputs[0].set_data_from_numpy(np.array([0.0], dtype=np.float32))
        y = client.infer("metrics_shared", inputs).as_numpy("Y")
        assert y is not None
        answers.append((int(y[0]), int(y[1])))
    assert len({pid for _, pid in answers}) == 2  # both workers answered
    assert [value for value, _ in answers] == [1, 2, 3, 4, 5, 6]
    assert sample(metrics(agent), "custom_shared_total", model="metrics_shared") == 6
