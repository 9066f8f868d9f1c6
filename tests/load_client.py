"""A steady-load client in its own process: `python -m tests.load_client URL MODEL RATE`.

Sends the same binary FP32 [1, 64] request at about RATE requests/s from 4 threads until its
stdin closes, then prints one JSON line: counts by HTTP status and by served version, the
outputs seen per version (rounded, to tell versions apart), and latency percentiles per second.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from collections import Counter, defaultdict

import numpy as np

THREADS = 4


def request_body() -> tuple[bytes, dict[str, str]]:
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(1, 64)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + x.tobytes(), {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def main() -> None:
    host, model, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
    body, headers = request_body()
    stop = threading.Event()
    lock = threading.Lock()
    statuses: Counter[int] = Counter()
    versions: Counter[str] = Counter()
    outputs: dict[str, set[str]] = defaultdict(set)
    latencies: list[tuple[float, float]] = []
    errors: list[str] = []
    interval = THREADS / rate

    def worker() -> None:
        conn = http.client.HTTPConnection(host, timeout=30)
        next_at = time.monotonic()
        while not stop.is_set():
            start = time.monotonic()
            try:
                conn.request("POST", f"/v2/models/{model}/infer", body, headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    errors.append(repr(exc))
                    statuses[0] += 1
                conn.close()
                conn = http.client.HTTPConnection(host, timeout=30)
                continue
            took = time.monotonic() - start
            with lock:
                statuses[resp.status] += 1
                latencies.append((start, took))
                if resp.status == 200:
                    length = int(resp.getheader("Inference-Header-Content-Length", "0"))
                    doc = json.loads(raw[:length])
                    out = np.frombuffer(raw[length:], dtype=np.float32)
                    versions[doc["model_version"]] += 1
                    outputs[doc["model_version"]].add(",".join(f"{v:.4f}" for v in out))
                else:
                    errors.append(raw[:200].decode(errors="replace"))
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    print("started", flush=True)
    sys.stdin.read()  # runs until the test closes our stdin
    stop.set()
    for t in threads:
        t.join()
    print(
        json.dumps(
            {
                "statuses": {str(k): v for k, v in statuses.items()},
                "versions": dict(versions),
                "outputs": {k: sorted(v) for k, v in outputs.items()},
                "latencies": latencies,
                "errors": errors[:10],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
