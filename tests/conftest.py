"""The suite's tiers and the fixtures every folder shares.

Tiers (markers registered in pyproject.toml). `make check` runs the tests that carry none of
them, the fast loop while working; `make test` runs them all, as CI does:

    e2e       starts a whole agent (in a thread or as a process), the edge-agent program, or
              several processes (a Python model's workers)
    bench     runs a benchmark or perf_analyzer
    external  needs a service or tool from outside the Python environment: Mosquitto,
              RabbitMQ, Chromium, Ansible, systemd tools, a package index, KServe's SDK,
              perf_analyzer, a GPU, the real tritonserver (tests/conformance)

The marks are applied at collection from the fixtures a test uses (MARKS_BY_FIXTURE) and from
where it lives (MARKS_BY_PATH: folders, modules, and single tests whose own bodies start an
agent or a tool). A new test of that kind goes in the table, or carries the mark where it is
written (`pytestmark = pytest.mark.e2e` in its module, or a decorator); both count.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config.schema import AgentConfig, ModelsConfig, ServerConfig
from agent.runtime.daemon import RunningAgent
from tests.models import build_test_repository
from tests.server import running_agent

TESTS = Path(__file__).resolve().parent

# Folders and modules (under tests/) whose every test is in a tier, and single tests
# (`module::name`, every parametrization) that start what their fixtures do not show.
MARKS_BY_PATH: dict[str, tuple[str, ...]] = {
    "bench": ("bench",),  # the benchmarks' own runs, most with perf_analyzer
    "gpu": ("external",),  # CUDA, TensorRT and NVML on the device machine
    "powercut": ("external",),  # a FUSE file system, cuts replayed in fresh processes
    "agent/runtime/test_stop_budget.py": ("e2e",),
    # Agents started in a thread by the tests themselves
    "agent/api/test_api_security.py": ("e2e",),
    "agent/api/test_grpc_backpressure.py": ("e2e",),
    "agent/api/test_grpc_engine_grpcio.py": ("e2e",),
    "agent/api/test_grpc_loop.py": ("e2e",),
    "agent/api/test_http_fuzz_regressions.py": ("e2e",),
    "agent/api/test_triton_errors.py": ("e2e",),
    "agent/canary/test_canary_e2e.py": ("e2e",),
    "agent/ensemble/test_ensemble.py": ("e2e",),
    "agent/ensemble/test_ensemble_python.py": ("e2e",),
    "agent/models/test_hot_swap.py": ("e2e",),
    "agent/models/test_model_control.py": ("e2e",),
    "agent/quantize/test_serve_int8.py": ("e2e",),
    "agent/repository/test_broken_configs.py": ("e2e",),
    "agent/runtime/test_startup_teardown.py": ("e2e",),
    "agent/scheduling/test_scheduling_e2e.py": ("e2e",),
    "agent/scheduling/test_sequence_e2e.py": ("e2e",),
    "agent/serving/test_shared_memory_e2e.py": ("e2e",),
    "sync/test_agent_sync.py": ("e2e",),
    "agent/api/test_access.py::test_every_http_route_and_grpc_method_is_in_ENDPOINT_GROUPS": (
        "e2e",
    ),
    "agent/api/test_http_lane.py::test_a_slow_body_is_handed_over_and_timed_out": ("e2e",),
    "agent/api/test_openapi.py::test_the_agent_serves_the_document": ("e2e",),
    "agent/api/test_resource_limits.py::test_connections_over_max_connections_get_503": ("e2e",),
    "agent/models/test_load_files.py::"
    "test_with_a_model_cache_pushed_files_live_in_its_folder_and_are_cleared": ("e2e",),
    "agent/repository/test_autocomplete_triton.py::test_a_scalar_model_serves_its_dims_of_one": (
        "e2e",
    ),
    "agent/repository/test_autocomplete_triton.py::test_config_endpoint_returns_tritons_config": (
        "e2e",
    ),
    "agent/repository/test_triton_validation.py::"
    "test_triton_refusals_fail_their_model_and_the_good_one_serves": ("e2e",),
    "agent/tracing/test_trace_otlp.py::test_spans_reach_the_collector": ("e2e",),
    "agent/tracing/test_trace_otlp.py::test_ensemble_steps_and_bls_calls_are_child_spans": ("e2e",),
    # The agent (or the edge-agent program) as processes, and Python models' worker processes
    "agent/api/test_idle_connections.py": ("e2e",),
    "agent/backends/test_decoupled_backend.py": ("e2e",),
    "agent/backends/test_python_worker.py": ("e2e",),
    "agent/cli/test_cli.py": ("e2e",),
    "agent/device/test_doctor.py": ("e2e",),
    "agent/models/test_cache_swap.py": ("e2e",),
    "agent/runtime/test_security_process.py": ("e2e",),
    "deploy/test_service_notify.py": ("e2e",),
    "deploy/test_service_signals.py": ("e2e",),
    "model_cache/test_atomic.py::test_a_killed_owner_never_blocks_the_next_one": ("e2e",),
    "model_cache/test_recovery.py::test_sigkill_at_each_step_recovers": ("e2e",),
    # perf_analyzer outside tests/bench
    "agent/api/test_grpc_loop.py::test_perf_analyzer_over_the_loop_engine": ("bench", "external"),
    "agent/serving/test_shared_memory_e2e.py::test_perf_analyzer_with_system_shared_memory": (
        "bench",
        "external",
    ),
    # Tools from outside the Python environment
    "agent/api/test_kserve_sdk.py": ("external",),  # KServe's SDK in its own venv
    "conformance": ("e2e", "external"),  # the real tritonserver beside an agent
    "agent/manager/test_dashboard.py": ("external",),  # headless chromium
    "agent/fleet/test_store_forward.py": ("external",),  # a broker it restarts
    "agent/manager/test_rollout_fleet.py": ("e2e", "external"),  # 20 agents, Mosquitto, RabbitMQ
    "agent/pages/test_status_page.py": ("external",),  # headless chromium
    "deploy/test_ansible.py": ("external",),
    "deploy/test_ansible_jetson.py": ("external",),
    "deploy/test_install_resolution.py": ("external",),  # pip against the package index
    "deploy/test_systemd_units.py": ("external",),  # systemd-analyze, systemd-sysusers
}

# Fixtures that bring what a tier is about, wherever they are defined (a test using one
# through another fixture counts too: `url` needs `agent`).
MARKS_BY_FIXTURE: dict[str, tuple[str, ...]] = {
    "agent": ("e2e",),  # a whole agent on a thread (this file; some modules have their own)
    "served": ("e2e",),  # tests/agent/conftest.py: an agent serving a model cache
    "broker": ("external",),  # a Mosquitto (or RabbitMQ) broker of the test's own
    "tls_broker": ("external",),
}


def _relative_id(item: pytest.Item) -> tuple[str, str] | None:
    """(path under tests/, test name without its parameters), or None outside tests/."""
    try:
        path = item.path.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None
    return path, item.name.split("[", 1)[0]


def table_marks(path: str, name: str) -> set[str]:
    """The marks MARKS_BY_PATH gives the test `name` of `path` (under tests/)."""
    marks: set[str] = set()
    for key, names in MARKS_BY_PATH.items():
        where, _, test = key.partition("::")
        if test:
            if path == where and name == test:
                marks.update(names)
        elif path == where or path.startswith(where + "/"):
            marks.update(names)
    return marks


def check_table(modules: dict[str, object]) -> None:
    """Fail the run when the table names a file or test that is gone (moved or renamed): its
    marks would silently stop applying. `modules`: the test modules collected, by path."""
    for key in MARKS_BY_PATH:
        where, _, test = key.partition("::")
        if not (TESTS / where).exists():
            raise pytest.UsageError(f"tests/conftest.py marks tests/{where}, which does not exist")
        if test and where in modules and not hasattr(modules[where], test):
            raise pytest.UsageError(f"tests/conftest.py marks {key}, which tests/{where} lacks")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    modules: dict[str, object] = {}
    for item in items:
        where = _relative_id(item)
        marks = set() if where is None else table_marks(*where)
        if where is not None and isinstance(item, pytest.Function):
            modules[where[0]] = item.module
        for fixture in getattr(item, "fixturenames", ()):
            marks.update(MARKS_BY_FIXTURE.get(fixture, ()))
        for name in sorted(marks - {m.name for m in item.iter_markers()}):
            item.add_marker(name)
    check_table(modules)


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="module")
def agent(model_repo: Path) -> Iterator[RunningAgent]:
    config = AgentConfig(
        server=ServerConfig(http_port=0, grpc_port=0, metrics_port=0, max_request_bytes=1 << 20),
        models=ModelsConfig(repository=model_repo, intra_op_threads=1),
    )
    with running_agent(config) as running:
        yield running


@pytest.fixture
def url(agent: RunningAgent) -> str:
    return f"127.0.0.1:{agent.http_port}"
