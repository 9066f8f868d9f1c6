"""N concurrent requests from their own process.

    python -m tests.deploy.burst_client HOST:PORT MODEL N


Each of N threads sends one binary FP32 [1, 64] request on its own connection; the process prints
one JSON line with every thread's HTTP status (0 and the error text on a transport failure).
"""

from __future__ import annotations

import http.client
import json
import sys
import threading

from tests.load_client import request_body


def main() -> None:
    host, model, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    body, headers = request_body()
    statuses: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        conn = http.client.HTTPConnection(host, timeout=60)
        try:
            conn.request("POST", f"/v2/models/{model}/infer", body, headers)
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException) as exc:
            status = 0
            with lock:
                errors.append(repr(exc))
        finally:
            conn.close()
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"statuses": sorted(statuses), "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
