"""Samples a gateway's `GET /healthz` latency from a process of its own: the test's event loop,
busy with the streams it drives, would add its own delays to every sample.

`python -m tests.latency_probe URL BOUND_MS` prints `ready`, then takes a sample every 5 ms on one
keep-alive connection until a line arrives on stdin, then prints one JSON line: a list of
`[at, best_ms, attempts]`, `at` on the system's monotonic clock (the one `time.monotonic()` reads
in every process). A sample is up to five attempts in a row, ending at the first under the
bound: on a machine whose cores other work shares, one slow attempt says more about the
scheduler than about the gateway, while a worker that is busy fails all five.
"""

from __future__ import annotations

import http.client
import json
import select
import sys
import time
from urllib.parse import urlsplit

ATTEMPTS = 5
PACE_S = 0.005


def main(url: str, bound_ms: float) -> None:
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    samples: list[list[float]] = []
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], PACE_S)[0]:
        at = time.monotonic()
        best = float("inf")
        attempts = 0
        while attempts < ATTEMPTS and best >= bound_ms:
            attempts += 1
            started = time.perf_counter()
            connection.request("GET", "/healthz")
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                raise SystemExit(f"/healthz answered {answer.status}")
            best = min(best, (time.perf_counter() - started) * 1000)
        samples.append([at, best, attempts])
    print(json.dumps(samples), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
