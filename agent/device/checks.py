"""`edge-agent doctor`'s judgements: facts in, one OK / WARN / FAIL line each, with the fix (pure).

FAIL is kept for what stops the agent from serving at all (no importable ONNX Runtime, two ONNX
Runtime distributions overwriting each other, an unsupported JetPack, a config that does not
load, a budget that fits nothing). What the agent survives (an unreachable broker or store, a
port in use by the running agent, a GPU without GPU runtimes) is a WARN.

Inputs are the plain dicts of `agent.device.facts.device_facts` and of the doctor's agent probe
(see `agent_checks`), so tests feed recorded or simulated devices directly.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
MIN_BUDGET_BYTES = 256 * MIB  # below this no real model fits next to the agent itself

# The config's accelerator names and the ONNX Runtime provider each needs (as
# agent.backends.onnx maps them; a test holds the two together).
ACCELERATOR_PROVIDERS = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider"}

ORT_FIX = (
    "install one ONNX Runtime: pip install 'edge-agent[cpu]' (CPU), 'edge-agent[gpu]' (x86-64 "
    "with an NVIDIA GPU), or on a Jetson onnxruntime-gpu from NVIDIA's Jetson index "
    "(docs/jetson.md)"
)


class Status(enum.Enum):
    """A check's outcome, worst last."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


_RANK = {Status.OK: 0, Status.WARN: 1, Status.FAIL: 2}


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        """{"name", "status", "detail"[, "fix"]}."""
        doc = {"name": self.name, "status": self.status.value, "detail": self.detail}
        if self.fix:
            doc["fix"] = self.fix
        return doc


def worst(checks: Iterable[Check]) -> Status:
    """The worst status among the checks (OK when there are none)."""
    return max((c.status for c in checks), key=_RANK.__getitem__, default=Status.OK)


def device_checks(facts: Mapping[str, Any]) -> list[Check]:
    """Judge `device_facts`: Jetson release, Python, CPU, memory, GPU, CUDA, TensorRT, ORT."""
    jetson = facts.get("jetson")
    gpus = facts.get("gpu") or []
    has_gpu = bool(gpus) or bool(jetson)
    checks = [
        _jetson_check(jetson),
        _python_check(facts["platform"]),
        Check(
            "cpu",
            Status.OK,
            f"{facts['cpu']['count']} cores, {facts['cpu']['model']} "
            f"({facts['platform']['machine']})",
        ),
        Check("memory", Status.OK, f"{_mib(facts['memory']['total_bytes'])} RAM"),
        _gpu_check(gpus, jetson),
        _cuda_check(facts["cuda"], has_gpu),
        _tensorrt_check(facts["tensorrt"], jetson, has_gpu),
        *_onnxruntime_checks(facts["onnxruntime"], jetson, has_gpu),
    ]
    return checks


def agent_checks(agent: Mapping[str, Any]) -> list[Check]:
    """Judge what the agent would use.

    `agent` holds: "config" {"file", "error"}; "models_source" (None: none configured);
    "cgroup_memory_max" (bytes or None: no limit);
    "memory_budget" {"bytes", "source"} or None; "ports" [{"name", "host", "port", "in_use"}];
    "paths" [{"name", "path", "exists", "writable"}]; "endpoints" [{"name", "target",
    "reachable" (None: not configured), "error"}]; "security" {"summary", "problems" (one
    sentence each, "what: set the fix"), "strict"} (optional).
    """
    config = agent["config"]
    if config.get("error"):
        return [
            Check(
                "config",
                Status.FAIL,
                f"{config.get('file') or 'defaults'}: {config['error']}",
                "fix the file (edge-agent config check FILE says what is wrong)",
            )
        ]
    checks = [Check("config", Status.OK, str(config.get("file") or "defaults (no config file)"))]
    source = agent.get("models_source")
    checks.append(
        Check("models", Status.OK, source)
        if source
        else Check(
            "models",
            Status.WARN,
            "no model source configured",
            "set models.repository or cache.dir (or serve --demo to try the agent)",
        )
    )
    limit = agent.get("cgroup_memory_max")
    checks.append(
        Check(
            "cgroup memory.max",
            Status.OK,
            "no limit" if limit is None else _mib(int(limit)),
        )
    )
    budget = agent.get("memory_budget")
    if budget is None or int(budget["bytes"]) < MIN_BUDGET_BYTES:
        shown = "none" if budget is None else f"{_mib(int(budget['bytes']))} ({budget['source']})"
        checks.append(
            Check(
                "memory budget",
                Status.FAIL,
                shown,
                f"give the models at least {_mib(MIN_BUDGET_BYTES)}: raise MemoryMax= "
                "(edge_agent_memory_max) or models.memory_budget_bytes",
            )
        )
    else:
        checks.append(
            Check("memory budget", Status.OK, f"{_mib(int(budget['bytes']))} ({budget['source']})")
        )
    checks.extend(_port_check(p) for p in agent.get("ports", ()))
    checks.extend(_path_check(p) for p in agent.get("paths", ()))
    checks.extend(_endpoint_check(e) for e in agent.get("endpoints", ()))
    if "security" in agent:
        checks.append(_security_check(agent["security"]))
    return checks


def _security_check(security: Mapping[str, Any]) -> Check:
    """Off loopback without TLS or with control groups open: WARN, FAIL under strict_security
    (the agent would refuse to start)."""
    problems = list(security.get("problems", ()))
    if not problems:
        return Check("security", Status.OK, str(security.get("summary", "")))
    strict = bool(security.get("strict"))
    return Check(
        "security",
        Status.FAIL if strict else Status.WARN,
        "; ".join(p.split(": set ", 1)[0] for p in problems)
        + (" (server.strict_security refuses to start)" if strict else ""),
        "; ".join(p.split(": ", 1)[1] if ": " in p else p for p in problems),
    )


def _jetson_check(jetson: Mapping[str, Any] | None) -> Check:
    if jetson is None:
        return Check("jetson", Status.OK, "not a Jetson (no nv_tegra_release)")
    if jetson.get("l4t") is None:
        return Check(
            "jetson",
            Status.WARN,
            f"{jetson['release_file']} does not name an L4T release: {jetson.get('raw', '')!r}",
            "check the board's JetPack install (cat /etc/nv_tegra_release)",
        )
    detail = f"L4T {jetson['l4t']} (JetPack {jetson.get('jetpack') or 'unknown'})"
    if jetson.get("board"):
        detail += f", board {jetson['board']}"
    if not jetson.get("supported"):
        return Check("jetson", Status.FAIL, detail, str(jetson.get("unsupported_reason") or ""))
    return Check("jetson", Status.OK, detail)


def _python_check(plat: Mapping[str, Any]) -> Check:
    where = "a virtualenv" if plat.get("virtualenv") else "the system Python"
    return Check("python", Status.OK, f"{plat['python']} ({where}: {plat['executable']})")


def _gpu_check(gpus: Sequence[Mapping[str, Any]], jetson: Mapping[str, Any] | None) -> Check:
    if not gpus:
        if jetson:
            return Check(
                "gpu",
                Status.WARN,
                "no GPU figures (tegrastats gave none)",
                "run doctor as a user in group video, or check that tegrastats runs",
            )
        return Check(
            "gpu",
            Status.OK,
            "none found (no NVML: no NVIDIA driver, or nvidia-ml-py not installed): "
            "models run on the CPU",
        )
    parts = []
    for gpu in gpus:
        text = f"GPU {gpu.get('index', 0)}"
        if gpu.get("name"):
            text += f" ({gpu['name']})"
        if "memory_total_bytes" in gpu:
            text += f": {_mib(gpu['memory_total_bytes'])}"
            if jetson:
                text += " shared with the CPU"
            else:
                text += f", {_mib(gpu.get('memory_used_bytes', 0))} used"
        parts.append(text)
    return Check("gpu", Status.OK, "; ".join(parts))


def _cuda_check(cuda: Mapping[str, Any], has_gpu: bool) -> Check:
    shown = f"toolkit {cuda.get('toolkit') or 'absent'}, driver {cuda.get('driver') or 'absent'}"
    if has_gpu and not cuda.get("driver"):
        return Check(
            "cuda",
            Status.WARN,
            shown,
            "install the NVIDIA driver (x86) or JetPack's CUDA (nvidia-jetpack) for GPU inference",
        )
    return Check("cuda", Status.OK, shown)


def _tensorrt_check(
    trt: Mapping[str, Any], jetson: Mapping[str, Any] | None, has_gpu: bool
) -> Check:
    if trt.get("version"):
        return Check("tensorrt", Status.OK, f"{trt['version']} ({trt.get('path', '?')})")
    if jetson:
        return Check(
            "tensorrt",
            Status.WARN,
            "not importable: tensorrt_plan models will be UNAVAILABLE",
            "apt install python3-libnvinfer and create the venv with --system-site-packages "
            "(the Ansible role does) so JetPack's TensorRT is visible",
        )
    if has_gpu:
        return Check(
            "tensorrt",
            Status.WARN,
            "not importable: tensorrt_plan models will be UNAVAILABLE",
            "pip install 'edge-agent[gpu]'",
        )
    return Check("tensorrt", Status.OK, "not installed (no GPU: tensorrt_plan models cannot run)")


def _onnxruntime_checks(
    ort: Mapping[str, Any], jetson: Mapping[str, Any] | None, has_gpu: bool
) -> list[Check]:
    dists = list(ort.get("distributions") or [])
    checks = []
    if len(dists) > 1:
        checks.append(
            Check(
                "onnxruntime install",
                Status.FAIL,
                f"{len(dists)} distributions own the onnxruntime package: {', '.join(dists)}",
                "keep exactly one: pip uninstall -y "
                + " ".join(d.split("==")[0] for d in dists)
                + ", then install the one for this device (docs/jetson.md)",
            )
        )
    if not ort.get("version"):
        checks.append(
            Check("onnxruntime", Status.FAIL, f"not importable ({ort.get('error', '?')})", ORT_FIX)
        )
        return checks
    providers = list(ort.get("providers") or [])
    detail = f"{ort['version']} ({', '.join(dists) or 'no distribution metadata'}); providers: " + (
        ", ".join(providers) or "none"
    )
    if has_gpu and "CUDAExecutionProvider" not in providers:
        fix = (
            "install onnxruntime-gpu from NVIDIA's Jetson index (the Ansible role's jetson group)"
            if jetson
            else "pip uninstall -y onnxruntime && pip install 'edge-agent[gpu]'"
        )
        checks.append(
            Check("onnxruntime", Status.WARN, detail + " (CPU only on a GPU device)", fix)
        )
    else:
        checks.append(Check("onnxruntime", Status.OK, detail))
    return checks


def _port_check(port: Mapping[str, Any]) -> Check:
    where = f"{port['host']}:{port['port']}"
    if port.get("in_use"):
        return Check(
            f"port {port['name']}",
            Status.WARN,
            f"{where} is in use",
            "fine if it is this agent running; else free it or change server.*_port",
        )
    return Check(f"port {port['name']}", Status.OK, f"{where} free")


def _path_check(path: Mapping[str, Any]) -> Check:
    name = f"path {path['name']}"
    if not path.get("exists"):
        return Check(name, Status.OK, f"{path['path']} (created on first use)")
    if not path.get("writable"):
        return Check(
            name,
            Status.WARN,
            f"{path['path']} is not writable by this user",
            "fine when the service user owns it (run doctor as that user to be sure)",
        )
    return Check(name, Status.OK, str(path["path"]))


def _endpoint_check(endpoint: Mapping[str, Any]) -> Check:
    name = str(endpoint["name"])
    if endpoint.get("reachable") is None:
        return Check(name, Status.OK, str(endpoint.get("target") or "not configured"))
    if endpoint["reachable"]:
        return Check(name, Status.OK, f"{endpoint['target']} reachable")
    return Check(
        name,
        Status.WARN,
        f"{endpoint['target']} not reachable: {endpoint.get('error', '?')}",
        "check the address, DNS and firewall; the agent keeps retrying meanwhile",
    )


def footprint_checks(footprint: Mapping[str, Any]) -> list[Check]:
    """Report the agent's own footprint (`agent.device.footprint`): OK lines, for the record.

    `footprint` holds: "install" {"beyond_runtime_bytes", "distributions", "largest" [[name,
    bytes]]} or {"error"}; "extras" {extra: installed}; "imports" {"seconds", "rss_bytes",
    "packages"} or {"error"}; "running" [{"pid", "rss_bytes", "uss_bytes", "threads",
    "native_packages"}].
    """
    checks = []
    install = footprint.get("install") or {}
    extras = footprint.get("extras") or {}
    have = ", ".join(sorted(e for e, ok in extras.items() if ok)) or "none"
    if "error" in install:
        checks.append(Check("footprint install", Status.OK, f"{install['error']}; extras: {have}"))
    else:
        largest = ", ".join(f"{name} {size / 1e6:.0f} MB" for name, size in install["largest"])
        checks.append(
            Check(
                "footprint install",
                Status.OK,
                f"{install['beyond_runtime_bytes'] / 1e6:.0f} MB beyond onnxruntime and numpy "
                f"in {install['distributions']} distributions (largest: {largest}); "
                f"extras: {have}",
            )
        )
    imports = footprint.get("imports") or {}
    if "error" in imports:
        checks.append(
            Check(
                "footprint imports",
                Status.WARN,
                f"serve's imports fail: {imports['error']}",
                "pip install the agent again (edge-agent doctor lists what it has)",
            )
        )
    elif imports:
        checks.append(
            Check(
                "footprint imports",
                Status.OK,
                f"serve imports {len(imports['packages'])} packages in {imports['seconds']:.2f} s "
                f"({_mib(int(imports['rss_bytes']))} RSS before models): "
                + ", ".join(imports["packages"]),
            )
        )
    running = footprint.get("running") or []
    if not running:
        checks.append(Check("footprint agent", Status.OK, "no running agent found"))
    for agent in running:
        checks.append(
            Check(
                f"footprint agent {agent['pid']}",
                Status.OK,
                f"RSS {_mib(int(agent['rss_bytes']))}, USS {_mib(int(agent['uss_bytes']))}, "
                f"{agent['threads']} threads; compiled packages loaded: "
                + (", ".join(agent["native_packages"]) or "none"),
            )
        )
    return checks


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.0f} MiB"


def accelerator_checks(agent: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Check]:
    """One line per model whose config asks for an accelerator (`gpu_execution_accelerator`):
    OK when this ONNX Runtime has its provider; else what the agent will do: refuse the model
    (FAIL when that stops start-up, `models.exit_on_error`; WARN otherwise), or, with
    `models.allow_cpu_fallback`, run it on the CPU (WARN: it serves, slower).

    `agent` holds "accelerators" [{"model", "names"}], "allow_cpu_fallback" and
    "exit_on_error"; `facts` is `device_facts` (its onnxruntime providers).
    """
    providers = set((facts.get("onnxruntime") or {}).get("providers") or ())
    fallback = bool(agent.get("allow_cpu_fallback"))
    checks = []
    for entry in agent.get("accelerators") or ():
        names = [str(n) for n in entry.get("names") or ()]
        needs = {n: ACCELERATOR_PROVIDERS.get(n.lower(), "") for n in names}
        missing = [
            f"{n} ({p or 'unknown accelerator'})" for n, p in needs.items() if p not in providers
        ]
        name = f"model {entry.get('model')}"
        if not missing:
            checks.append(Check(name, Status.OK, f"accelerators {', '.join(names)} available"))
        elif fallback and all(needs.values()):
            checks.append(
                Check(
                    name,
                    Status.WARN,
                    f"CPU fallback: {', '.join(missing)} not in this onnxruntime; the model runs "
                    "on the CPU, flagged in its status (models.allow_cpu_fallback)",
                    "install an onnxruntime with the accelerator (docs/jetson.md) to run it "
                    "as configured",
                )
            )
        else:
            stops = bool(agent.get("exit_on_error", True))
            checks.append(
                Check(
                    name,
                    Status.FAIL if stops else Status.WARN,
                    f"will be refused: its config asks for {', '.join(missing)}, which this "
                    "onnxruntime lacks"
                    + (" (start-up stops: models.exit_on_error)" if stops else ""),
                    "install an onnxruntime with the accelerator (docs/jetson.md), or set "
                    "models.allow_cpu_fallback = true to run it on the CPU",
                )
            )
    return checks
