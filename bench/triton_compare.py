"""`python -m bench.triton_compare`: the agent against the real Triton 2.51 on the same models.

Three servers run side by side on the bench's dynamic-batching repositories (bench.models: the
MLP, 1 instance, and the MobileNetV2-shaped CNN, 2 instances; the same config.pbtxt for all):

  agent           the agent's ONNX Runtime backend (its default threads: a lone run gets every
                  core, busy instances share them)
  agent, Python   the agent serving the same models through a Python-backend `model.py` that
                  runs onnxruntime (one session per instance, one thread per core)
  Triton 2.51     tritonserver from the nvidia-pytriton wheel (`make triton`), which has only
                  the Python backend: the same `model.py`. Its stub runs Debian's python3.11
                  with numpy < 2; onnxruntime (the agent's version) is installed for it with
                  `pip install --target` into the Triton venv, once (`stub_onnxruntime`).

Every round runs each case against each server (perf_analyzer, batch 1, binary tensors over
HTTP, a fixed `--request-count`), the servers' order rotated and reversed from round to round
so that none always runs on a warmer or colder machine, or right after the same other server.
The table gives the medians of the rounds and the median of the per-round agent / Triton ratios
(a single pair on a shared machine moves far more). Cases: the MLP over HTTP and gRPC at c=1
and c=16, the CNN over HTTP at c=1 and c=16, and Triton's add_sub example (a Python model)
called one after another with tritonclient over HTTP.
Throughput at c=16 is c / mean latency (Little's law, as bench.latency_pairs reads it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.cpu_per_request import Server, drive, run_counted_retrying
from bench.models import (
    MODELS,
    BenchModel,
    config_pbtxt,
    instances,
    write_model_files,
    write_repository,
)
from bench.perf import find_perf_analyzer, mean_latency_us, single_run_row
from bench.procs import REPO_ROOT, BenchError
from bench.report import load_average, markdown_table
from tests.conformance.triton import STUB_PYTHON, find_triton, running_triton

AGENT = "agent"
PINNED = "agent, pinned threads"  # --pinned: the threads before a lone run got every core
AGENT_PYTHON = "agent, Python backend"
TRITON = "Triton 2.51"
SERVERS = (AGENT, PINNED, AGENT_PYTHON, TRITON)
STUB_INTERPRETER = f"/usr/bin/python{STUB_PYTHON}"
PYTHON_PATH_PARAMETER = "bench_python_path"  # where model.py finds onnxruntime (Triton's stub)
SPINNING_PARAMETER = "bench_spinning"  # "1": model.py's onnxruntime threads spin during runs


@dataclass(frozen=True, slots=True)
class Case:
    """One measured row: a model at one concurrency over one protocol (or add_sub)."""

    name: str
    model: str  # the served name
    protocol: str
    concurrency: int
    requests: int  # per run (full mode)


CASES = (
    Case("MLP HTTP c=1", "mlp", "http", 1, 1000),
    Case("MLP gRPC c=1", "mlp", "grpc", 1, 1000),
    Case("MLP HTTP c=16", "mlp", "http", 16, 4000),
    Case("MLP gRPC c=16", "mlp", "grpc", 16, 4000),
    Case("CNN HTTP c=1", "mobilenetv2", "http", 1, 200),
    Case("CNN HTTP c=16", "mobilenetv2", "http", 16, 400),
)
ADD_SUB = Case("add_sub, sequential tritonclient HTTP", "add_sub", "http", 1, 1000)
QUICK_FACTOR = 10  # --quick: a tenth of the requests (at least QUICK_MIN) and one round
QUICK_MIN = 40


@dataclass(frozen=True, slots=True)
class Measure:
    """One run: throughput (inf/s) and p50 latency (µs)."""

    rate: float
    p50_us: float


@dataclass(frozen=True, slots=True)
class Row:
    """A case's medians over the rounds per server, and per (server, reference) the median of
    the per-round ratios server / reference of the rates and of the p50s. Missing: not measured.
    """

    case: str
    medians: dict[str, Measure]
    ratios: dict[tuple[str, str], Measure]


# --- the models -------------------------------------------------------------------------------

ONNX_MODEL_PY = '''\
"""Serves the model.onnx beside this file with onnxruntime (one session per instance)."""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = config.get("parameters", {}).get("bench_python_path", {}).get("string_value")
        if path:
            sys.path.insert(0, path)
        import onnxruntime as ort

        options = ort.SessionOptions()  # intra-op threads 0: one per core
        parameters = config.get("parameters", {})
        if parameters.get("bench_spinning", {}).get("string_value") == "1":
            # Threads spin while a run runs and stop when it returns (the agent's lone run).
            options.add_session_config_entry("session.intra_op.allow_spinning", "1")
            options.add_session_config_entry("session.force_spinning_stop", "1")
        else:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        version = os.path.join(args["model_repository"], args["model_version"])
        self.session = ort.InferenceSession(
            os.path.join(version, "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        out = self.session.run(["OUTPUT0"], {"INPUT0": batch})[0]
        responses, start = [], 0
        for a in arrays:
            rows = out[start : start + a.shape[0]]
            start += a.shape[0]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", rows)]))
        return responses
'''

ADD_SUB_MODEL_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", a + b),
                pb_utils.Tensor("OUTPUT1", a - b),
            ]))
        return responses
"""

ADD_SUB_CONFIG = """\
name: "add_sub"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""


def python_config(model: BenchModel, python_path: Path | None, *, spinning: bool = False) -> str:
    """The dynbatch config.pbtxt of `model`, served by the Python backend's model.py
    (`spinning`: its onnxruntime threads spin while a run runs, and stop when it returns)."""
    text = config_pbtxt(model, "dynbatch").replace(
        'platform: "onnxruntime_onnx"', 'backend: "python"'
    )
    if spinning:
        text += f'parameters {{ key: "{SPINNING_PARAMETER}" value: {{ string_value: "1" }} }}\n'
    if python_path is not None:
        text += (
            f'parameters {{ key: "{PYTHON_PATH_PARAMETER}" '
            f'value: {{ string_value: "{python_path}" }} }}\n'
        )
    return text


def write_python_repository(
    root: Path,
    models: Sequence[BenchModel],
    onnx_paths: dict[str, Path],
    python_path: Path | None,
    *,
    spinning: bool = False,
) -> Path:
    """The models as Python models (model.py + model.onnx) and add_sub, under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    for model in models:
        version = root / model.served_name / "1"
        version.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(onnx_paths[model.key], version / "model.onnx")
        (version / "model.py").write_text(ONNX_MODEL_PY, encoding="utf-8")
        (root / model.served_name / "config.pbtxt").write_text(
            python_config(model, python_path, spinning=spinning), encoding="utf-8"
        )
    add_sub = root / "add_sub" / "1"
    add_sub.mkdir(parents=True, exist_ok=True)
    (add_sub / "model.py").write_text(ADD_SUB_MODEL_PY, encoding="utf-8")
    (root / "add_sub" / "config.pbtxt").write_text(ADD_SUB_CONFIG, encoding="utf-8")
    return root


def write_onnx_repository(
    root: Path, models: Sequence[BenchModel], onnx_paths: dict[str, Path], *, pinned: bool = False
) -> Path:
    """The models' dynbatch repositories merged into one (the agent's ONNX Runtime backend).

    `pinned`: each model's runs pinned to the cores shared between its instances (the config's
    `intra_op_thread_count`), as every run was before a lone run got every core.
    """
    repo = root / ("onnx-pinned-repo" if pinned else "onnx-repo")
    for model in models:
        single = write_repository(root, model, "dynbatch", onnx_paths[model.key])
        shutil.copytree(single, repo, dirs_exist_ok=True)
        if pinned:
            threads = max(1, (os.cpu_count() or 1) // instances(model, "dynbatch"))
            with (repo / model.served_name / "config.pbtxt").open("a", encoding="utf-8") as f:
                f.write(
                    f'parameters {{ key: "intra_op_thread_count" '
                    f'value: {{ string_value: "{threads}" }} }}\n'
                )
    return repo


# --- onnxruntime for Triton's stub ------------------------------------------------------------


def stub_onnxruntime(triton_venv: Path, version: str) -> Path | str:
    """A folder from which Triton's stub interpreter imports onnxruntime `version` (installed
    there with pip the first time), or why there is none (a sentence)."""
    target = triton_venv / f"bench-onnxruntime-{version}-py{STUB_PYTHON}"
    if not (target / "onnxruntime").is_dir():
        if not Path(STUB_INTERPRETER).is_file():
            return f"no {STUB_INTERPRETER} (Triton's Python stub's interpreter)"
        try:
            staging = Path(tempfile.mkdtemp(prefix=".bench-onnxruntime-", dir=triton_venv))
        except OSError as exc:
            return f"cannot write onnxruntime for Triton's stub under {triton_venv}: {exc}"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "--no-deps", "--only-binary=:all:", "--python-version", STUB_PYTHON,
                 "--target", str(staging), f"onnxruntime=={version}"],
                capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                return (
                    f"pip could not install onnxruntime {version} for Python {STUB_PYTHON}: "
                    + (done.stderr.strip().splitlines() or ["no output"])[-1]
                )
            staging.replace(target)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"installing onnxruntime for Triton's stub failed: {exc}"
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    probe = subprocess.run(
        [STUB_INTERPRETER, "-c", "import onnxruntime"],
        env=dict(os.environ, PYTHONPATH=str(target)),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"onnxruntime {version} does not import in {STUB_INTERPRETER}: {tail}"
    return target


def triton_venv() -> Path:
    return Path(os.environ.get("TRITON_VENV", REPO_ROOT / ".venv-triton"))


# --- the servers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ports:
    http: int
    grpc: int


@contextmanager
def agent_server(repo: Path) -> Iterator[Ports]:
    """The agent on `repo` (HTTP and gRPC on free ports), stopped on exit."""
    server = Server(
        [sys.executable, "-m", "agent", "serve", "--model-repository", str(repo),
         "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "-1"]
    )  # fmt: skip
    try:
        if not server.grpc_port:
            raise BenchError("the agent logged no gRPC port")
        yield Ports(server.port, server.grpc_port)
    finally:
        server.stop()


@contextmanager
def triton_server(repo: Path, workdir: Path) -> Iterator[Ports]:
    install = find_triton()
    if isinstance(install, str):
        raise BenchError(install)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with running_triton(install, repo, workdir) as server:
            yield Ports(server.http_port, server.grpc_port)
    except RuntimeError as exc:  # did not start
        raise BenchError(str(exc)) from None


# --- measuring --------------------------------------------------------------------------------


def perf_run(binary: str, port: int, case: Case, requests: int, workdir: Path) -> Measure:
    """One perf_analyzer run of `case` against a server's port."""
    csv_path = workdir / f"triton-compare-{case.model}-{case.protocol}-{port}.csv"
    csv_path.unlink(missing_ok=True)
    command = drive(binary, port, case.concurrency, requests, csv_path, case.protocol, case.model)
    done = run_counted_retrying(command, requests)
    row = single_run_row(done, csv_path)
    rate = case.concurrency / mean_latency_us(done.stdout) * 1e6
    return Measure(rate, float(row["p50 latency"]))


def add_sub_run(port: int, calls: int) -> Measure:
    """`calls` add_sub inferences one after another with tritonclient over HTTP."""
    import tritonclient.http as httpclient  # noqa: PLC0415 - only this case needs it

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        a = np.arange(4, dtype=np.float32)
        inputs = [
            httpclient.InferInput("INPUT0", [4], "FP32"),
            httpclient.InferInput("INPUT1", [4], "FP32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        for _ in range(min(50, calls)):  # connection, first calls
            client.infer("add_sub", inputs)
        times = []
        start = time.perf_counter()
        for _ in range(calls):
            t0 = time.perf_counter()
            result = client.infer("add_sub", inputs)
            times.append(time.perf_counter() - t0)
        total = time.perf_counter() - start
        if not np.array_equal(result.as_numpy("OUTPUT0"), a + a):
            raise BenchError("add_sub answered wrongly")
        return Measure(calls / total, statistics.median(times) * 1e6)
    finally:
        client.close()


def server_order(round_index: int, servers: Sequence[str]) -> list[str]:
    """The servers rotated every other round, and reversed in odd rounds: each server runs in
    each position, and right before and right after each other server, as often."""
    shift = (round_index // 2) % len(servers)
    order = [*servers[shift:], *servers[:shift]]
    return order[::-1] if round_index % 2 else order


def requests_for(case: Case, quick: bool) -> int:
    return max(QUICK_MIN, case.requests // QUICK_FACTOR) if quick else case.requests


def reference_pairs(servers: Sequence[str]) -> list[tuple[str, str]]:
    """(server, reference) pairs whose ratios the table shows: each server against Triton, and
    the agent against its pinned threads."""
    pairs = [(s, TRITON) for s in servers if s != TRITON and TRITON in servers]
    if AGENT in servers and PINNED in servers:
        pairs.append((AGENT, PINNED))
    return pairs


def summarize(case: str, rounds: Sequence[dict[str, Measure]]) -> Row:
    """Medians per server over the rounds, and the median per-round ratios (reference_pairs)."""
    servers = sorted({s for r in rounds for s in r}, key=SERVERS.index)
    medians = {
        s: Measure(
            statistics.median(r[s].rate for r in rounds if s in r),
            statistics.median(r[s].p50_us for r in rounds if s in r),
        )
        for s in servers
    }
    ratios: dict[tuple[str, str], Measure] = {}
    for s, ref in reference_pairs(servers):
        both = [r for r in rounds if s in r and ref in r and r[ref].rate and r[ref].p50_us]
        if both:
            ratios[s, ref] = Measure(
                statistics.median(r[s].rate / r[ref].rate for r in both),
                statistics.median(r[s].p50_us / r[ref].p50_us for r in both),
            )
    return Row(case, medians, ratios)


def run_compare(
    binary: str,
    rounds: int,
    quick: bool,
    workdir: Path,
    log: Callable[[str], None],
    models: Sequence[BenchModel] = (MODELS["mlp"], MODELS["cnn"]),
    *,
    pinned: bool = False,
    only: Collection[str] = (),
    spinning: bool = False,
) -> tuple[list[Row], str]:
    """Start the servers, run the rounds; the rows and why Triton is missing ("" when not).

    `pinned`: also the agent with each model's runs pinned to cores / instances threads;
    `only`: the names of the perf_analyzer cases to run (none given: every case of `models`);
    `spinning`: the Python-backend model.py's onnxruntime threads spin while a run runs and
    stop when it returns, as the agent's lone runs (default: they never spin, as its other
    runs)."""
    onnx_paths = write_model_files(workdir, list(models))
    served = {m.served_name for m in models}
    cases = [c for c in CASES if c.model in served and (not only or c.name in only)]
    why_no_triton = ""
    stub_path: Path | None = None
    install = find_triton()
    if isinstance(install, str):
        why_no_triton = install
    else:
        found = stub_onnxruntime(triton_venv(), _onnxruntime_version())
        if isinstance(found, str):
            why_no_triton = found
        else:
            stub_path = found
    with ExitStack() as stack:
        ports: dict[str, Ports] = {}
        log("[triton compare] starting the agent (ONNX Runtime backend)")
        ports[AGENT] = stack.enter_context(
            agent_server(write_onnx_repository(workdir, models, onnx_paths))
        )
        if pinned:
            log("[triton compare] starting the agent (ONNX Runtime backend, pinned threads)")
            repo = write_onnx_repository(workdir, models, onnx_paths, pinned=True)
            ports[PINNED] = stack.enter_context(agent_server(repo))
        log("[triton compare] starting the agent (Python backend)")
        python_repo = write_python_repository(
            workdir / "python-repo", models, onnx_paths, None, spinning=spinning
        )
        ports[AGENT_PYTHON] = stack.enter_context(agent_server(python_repo))
        if stub_path is not None:
            log("[triton compare] starting tritonserver")
            triton_repo = write_python_repository(
                workdir / "triton-repo", models, onnx_paths, stub_path, spinning=spinning
            )
            try:
                ports[TRITON] = stack.enter_context(triton_server(triton_repo, workdir / "triton"))
            except BenchError as exc:
                why_no_triton = f"tritonserver did not start: {str(exc).splitlines()[0]}"
        else:
            log(f"[triton compare] Triton skipped: {why_no_triton}")
        servers = [s for s in SERVERS if s in ports]
        for case in cases:  # warm-up: connections, sessions' first runs
            for s in servers:
                perf_run(binary, _port(ports[s], case), case, QUICK_MIN, workdir)
        results: dict[str, list[dict[str, Measure]]] = {c.name: [] for c in [*cases, ADD_SUB]}
        for i in range(rounds):
            order = server_order(i, servers)
            for case in cases:
                measures = {}
                for s in order:
                    measures[s] = perf_run(
                        binary, _port(ports[s], case), case, requests_for(case, quick), workdir
                    )
                results[case.name].append(measures)
                log(
                    f"[triton compare] round {i + 1}/{rounds} {case.name}: "
                    + ", ".join(
                        f"{s} {m.rate:,.0f} inf/s p50 {m.p50_us:,.0f} µs"
                        for s, m in measures.items()
                    )
                )
            measures = {}
            for s in order:
                if s in (AGENT_PYTHON, TRITON):  # a Python model: the agent's Python backend
                    measures[s] = add_sub_run(ports[s].http, requests_for(ADD_SUB, quick))
            results[ADD_SUB.name].append(measures)
    return [summarize(name, rs) for name, rs in results.items()], why_no_triton


def _port(ports: Ports, case: Case) -> int:
    return ports.grpc if case.protocol == "grpc" else ports.http


def _onnxruntime_version() -> str:
    import onnxruntime  # noqa: PLC0415 - the agent's, for the stub's copy

    return str(onnxruntime.__version__)


# --- the report -------------------------------------------------------------------------------


def render(rows: Sequence[Row]) -> str:
    """One line per case: each server's inf/s and p50, and the ratios (reference_pairs)."""
    present = {s for row in rows for s in row.medians}
    servers = [s for s in SERVERS if s in present]
    pairs = reference_pairs(servers)
    header = ["case"]
    for s in servers:
        header += [f"{s} inf/s", f"{s} p50 µs"]
    for s, ref in pairs:
        header += [f"{s} / {ref} inf/s", f"{s} / {ref} p50"]
    lines = []
    for row in rows:
        cells = [row.case]
        for s in servers:
            m = row.medians.get(s)
            cells += [f"{m.rate:,.0f}", f"{m.p50_us:,.0f}"] if m else ["n/a", "n/a"]
        for pair in pairs:
            ratio = row.ratios.get(pair)
            cells += [f"{ratio.rate:.2f}", f"{ratio.p50_us:.2f}"] if ratio else ["n/a", "n/a"]
        lines.append(cells)
    return markdown_table(header, lines, [False] + [True] * (len(header) - 1))


def caption(rounds: int, quick: bool, spinning: bool = False) -> str:
    return (
        f"The agent against Triton 2.51 on the same models (bench.triton_compare): {rounds} "
        f"round(s){' (--quick: a tenth of the requests)' if quick else ''}, the servers' order "
        "rotated and reversed from round to round; medians over the rounds, and the median of "
        "the per-round ratios "
        "(inf/s: agent / Triton, above 1.00 is faster; p50: agent / Triton, below 1.00 is "
        "faster). Triton serves the ONNX models through a Python-backend model.py running "
        "onnxruntime (one thread per core, "
        + ("spinning while a run runs, --spinning-model-py" if spinning else "never spinning")
        + "); so does the 'agent, Python backend' column; "
        "'agent, pinned threads' (--pinned) pins each run to cores / instances threads."
    )


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, a tenth of the requests")
    parser.add_argument("--rounds", type=int, help="default 5 (--quick 1)")
    parser.add_argument("--perf-analyzer", default=None, help="the perf_analyzer binary")
    parser.add_argument(
        "--models",
        default="mlp,cnn",
        help="comma-separated, from mlp,cnn (default both; add_sub always runs)",
    )
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="also the agent with every run pinned to cores / instances threads",
    )
    parser.add_argument(
        "--spinning-model-py",
        action="store_true",
        help="the Python-backend model.py's onnxruntime threads spin while a run runs "
        "(as the agent's lone runs); default: they never spin",
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    if not keys or any(k not in MODELS for k in keys):
        parser.error(f"--models: comma-separated, from {','.join(MODELS)}")
    binary = find_perf_analyzer(args.perf_analyzer)
    if binary is None:
        print(
            "triton compare: skipped, perf_analyzer not found "
            "(make perf-analyzer, or set PERF_ANALYZER)"
        )
        return 0
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="triton-compare-") as tmp:
        try:
            rows, why_no_triton = run_compare(
                binary,
                rounds,
                args.quick,
                Path(tmp),
                _log,
                [MODELS[k] for k in keys],
                pinned=args.pinned,
                spinning=args.spinning_model_py,
            )
        except (BenchError, OSError, subprocess.SubprocessError) as exc:
            print(f"triton compare: error: {exc}", file=sys.stderr)
            return 1
    print(caption(rounds, args.quick, args.spinning_model_py))
    print()
    print(render(rows))
    if why_no_triton:
        print(f"\nTriton not measured: {why_no_triton}")
    print(f"\nload average before/after: {load_before:.2f} / {load_average():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
