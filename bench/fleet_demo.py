"""`make demo`: the whole product on one machine, in a few minutes, cleaned up afterwards.

    python -m bench.fleet_demo [--keep]

A local S3-protocol server (moto) holds a signed model repository; Mosquitto is the fleet's
broker; three agents (`edge-agent serve`, each its own process, cache and groups) sync from the
store and report over MQTT. Version 1 is published and served; version 2 is published and
rolled out in waves through `set-desired` + `sync` (the signed path), with `fleet inventory` and
`rollout status` shown; version 3, whose p95 latency is far worse, breaks the gate in its canary
wave and is rolled back. Traffic runs against every agent so the gate has figures to judge.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from agent.proto import onnx_model_pb2 as onnx_pb
from agent.runtime.demo import IR_VERSION, OPSET, mlp_model

CONFIG = """name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""
AGENTS = {"jetson-a1": ("site-a", "orin"), "jetson-a2": ("site-a", "orin"),
          "jetson-b1": ("site-b", "orin")}  # fmt: skip
BUCKET = "s3://demo-models/prod"
GATE = "p95_ms<=50,error_rate<=0.01"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def slow_model(layers: int = 1500, width: int = 1024) -> onnx.ModelProto:
    """Same signature as version 1, many times the work per request (one shared weight)."""
    rng = np.random.default_rng(3)
    w_in = (rng.standard_normal((64, width)) * 0.1).astype(np.float32)
    w = (rng.standard_normal((width, width)) * 0.03).astype(np.float32)
    w_out = (rng.standard_normal((width, 10)) * 0.1).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["INPUT0", "WI"], ["H0"])]
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [f"H{i}", "W"], [f"M{i}"]))
        nodes.append(helper.make_node("Tanh", [f"M{i}"], [f"H{i + 1}"]))
    nodes.append(helper.make_node("MatMul", [f"H{layers}", "WO"], ["L"]))
    nodes.append(helper.make_node("Softmax", ["L"], ["OUTPUT0"], axis=1))
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(a, n) for a, n in ((w_in, "WI"), (w, "W"), (w_out, "WO"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def write_version(root: Path, version: int, model: onnx.ModelProto | onnx_pb.ModelProto) -> Path:
    folder = root / f"src{version}" / "m"
    (folder / str(version)).mkdir(parents=True)
    (folder / str(version) / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "config.pbtxt").write_text(CONFIG)
    return folder


class Demo:
    """The processes and files of one demo run; everything is undone by `close`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stop_traffic = threading.Event()
        self.edge = [str(Path(sys.executable).parent / "edge-agent")]
        if not Path(self.edge[0]).exists():
            self.edge = [sys.executable, "-c", "import sys; from agent.cli import main; "
                         "sys.exit(main())"]  # fmt: skip
        self.env = {**os.environ, "AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo",
                    "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
        self.broker_port = free_port()
        self.http_ports = {name: free_port() for name in AGENTS}
        self.s3 = ""

    def step(self, title: str, shows: str) -> None:
        print(f"\n=== {title}\n    {shows}", flush=True)

    def edge_agent(self, *args: str, check: bool = True) -> int:
        shown = " ".join(a if " " not in a else repr(a) for a in args)
        print(f"$ edge-agent {shown}", flush=True)
        result = subprocess.run([*self.edge, *args], env=self.env, check=False)
        if check and result.returncode != 0:
            raise SystemExit(f"demo: edge-agent {args[0]} exited {result.returncode}")
        return result.returncode

    def fleet(self, *args: str, check: bool = True) -> int:
        return self.edge_agent(
            "fleet", *args, "--host", "127.0.0.1", "--port", str(self.broker_port), check=check
        )

    def start_s3(self) -> None:
        from moto.server import ThreadedMotoServer  # noqa: PLC0415 - a dev dependency

        port = free_port()
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.moto.start()
        self.s3 = f"http://127.0.0.1:{port}"
        print(f"moto S3 server on {self.s3}")

    def start_broker(self) -> None:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        conf = self.root / "mosquitto.conf"
        conf.write_text(
            f"listener {self.broker_port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"user {pwd.getpwuid(os.geteuid()).pw_name}\n"
        )
        log = (self.root / "mosquitto.log").open("wb")
        self.procs.append(subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=log))
        wait(lambda: accepts(self.broker_port), "mosquitto")
        print(f"mosquitto on 127.0.0.1:{self.broker_port}")

    def publish(self, version: int, source: Path) -> None:
        self.edge_agent("publish", "--repo", str(self.root / "repo"), "--store", BUCKET,
                        "--create-bucket", "--s3-endpoint", self.s3, "--s3-region", "us-east-1",
                        "m", str(version), str(source))  # fmt: skip

    def start_agents(self) -> None:
        for name, groups in AGENTS.items():
            folder = self.root / name
            folder.mkdir()
            config = folder / "agent.toml"
            config.write_text(f"""[server]
http_port = {self.http_ports[name]}
grpc_port = -1
metrics_port = -1

[models]
intra_op_threads = 1

[cache]
dir = "{folder / "cache"}"

[sync]
source = "{BUCKET}"
s3_endpoint = "{self.s3}"
s3_region = "us-east-1"
trusted_root = "{self.root / "repo/metadata/root.json"}"
desired = ["m=1"]
interval_s = 3600

[mqtt]
host = "127.0.0.1"
port = {self.broker_port}
device_id = "{name}"
groups = {json.dumps(list(groups))}
telemetry_interval_ms = 500
""")
            log = (folder / "agent.log").open("wb")
            proc = subprocess.Popen([*self.edge, "serve", "--config", str(config)],
                                    env=self.env, stdout=log, stderr=log)  # fmt: skip
            self.procs.append(proc)
        for name, port in self.http_ports.items():
            wait(functools.partial(serves, port, "1"), f"{name} serving version 1", 120)
        print("3 agents serve m version 1")

    def traffic(self) -> None:
        def run() -> None:
            while not self.stop_traffic.is_set():
                for port in self.http_ports.values():
                    served_version(port)
                time.sleep(0.01)

        threading.Thread(target=run, daemon=True).start()

    def close(self, keep: bool) -> None:
        self.stop_traffic.set()
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if getattr(self, "moto", None) is not None:
            self.moto.stop()
        if keep:
            print(f"\nfiles kept in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
            print("\ncleaned up: processes stopped, files removed")


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def served_version(port: int) -> str | None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.1] * 64}]}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/m/infer",
                                     data=json.dumps(doc).encode(), method="POST")  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(json.loads(response.read())["model_version"])
    except (OSError, ValueError, KeyError):
        return None


def serves(port: int, version: str) -> bool:
    return served_version(port) == version


def wait(check: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.2)


def main() -> int:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the files (logs, databases)")
    args = parser.parse_args()
    demo = Demo(Path(tempfile.mkdtemp(prefix="edge-agent-demo-")))
    db = str(demo.root / "rollouts.sqlite")
    try:
        demo.step("1. Infrastructure", "an S3-protocol store and an MQTT broker, on loopback")
        demo.start_s3()
        demo.start_broker()
        demo.step("2. Keys and version 1", "the publisher signs (TUF) and uploads version 1")
        demo.edge_agent("keys", "init", "--repo", str(demo.root / "repo"))
        sources = {1: write_version(demo.root, 1, mlp_model(seed=1)),
                   2: write_version(demo.root, 2, mlp_model(seed=2)),
                   3: write_version(demo.root, 3, slow_model())}  # fmt: skip
        demo.publish(1, sources[1])
        demo.step("3. Three agents", "each syncs the signed version 1 and reports over MQTT")
        demo.start_agents()
        demo.traffic()
        demo.step("4. Inventory", "what each device is, its groups, and what it serves")
        demo.fleet("inventory")
        demo.step("5. Version 2, rolled out in waves",
                  "30% then 60% then 100% of group orin; each wave soaks 3 s and the gate "
                  f"({GATE}) compares it with the devices still on version 1")  # fmt: skip
        demo.publish(2, sources[2])
        demo.fleet("rollout", "start", "m", "2", "--group", "orin", "--waves", "30%,60%,100%",
                   "--gate", GATE, "--soak", "3s", "--via", "set-desired", "--db", db)  # fmt: skip
        demo.fleet("rollout", "status", "--db", db, "--events", "0")
        demo.fleet("inventory")
        demo.step("6. A bad version 3", "its first wave breaks the p95 gate: the rollout "
                  "aborts and puts the touched device back on version 2")  # fmt: skip
        demo.publish(3, sources[3])
        code = demo.fleet("rollout", "start", "m", "3", "--group", "orin",
                          "--waves", "30%,60%,100%", "--gate", GATE, "--soak", "3s",
                          "--min-requests", "5", "--via", "set-desired", "--db", db,
                          check=False)  # fmt: skip
        demo.fleet("rollout", "status", "--db", db, "--events", "3")
        served = {name: served_version(port) for name, port in demo.http_ports.items()}
        print(f"serving now: {served}")
        if code != 1 or set(served.values()) != {"2"}:
            raise SystemExit("demo: version 3 should have been aborted and rolled back")
        demo.step("Done", "v2 reached every device in waves; v3 was stopped by its own telemetry")
        return 0
    finally:
        demo.close(args.keep)


if __name__ == "__main__":
    sys.exit(main())
