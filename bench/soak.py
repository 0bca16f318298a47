"""A mixed soak: every format, streams, refusals and video polls against one gateway process for
N minutes; the gateway's RSS is sampled, and any 5xx or broken connection is an error.
Passes when RSS grows less than 10% after the warm-up and nothing failed.

Usage: .venv/bin/python bench/soak.py [--minutes 10] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.procs import free_port, no_admin_listeners, rss_kb, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402

KEY = "soak-key-0001"
BEARER = {"Authorization": f"Bearer {KEY}"}
MSG = {"x-api-key": KEY, "msgapi-version": "2023-06-01"}
MESSAGE = {"model": "msgmodel-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hello there"}]}
CALLS = [
    ("POST", "/v1/messages", MSG, MESSAGE, 200),
    ("POST", "/v1/messages", MSG, {**MESSAGE, "stream": True}, 200),
    ("POST", "/v1/responses", BEARER, {"model": "respmodel-4o", "input": "hi", "stream": True}, 200),
    ("POST", "/v1/responses", BEARER, {"model": "respmodel-4o", "input": "hi"}, 200),
    (
        "POST",
        f"/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key={KEY}",
        {},
        {"contents": [{"parts": [{"text": "hi"}]}]},
        200,
    ),
    (
        "POST",
        f"/v1beta/models/genmodel-2.5-flash-image:generateContent?key={KEY}",
        {},
        {
            "contents": [{"parts": [{"text": "a fox"}]}],
            "generationConfig": {"responseFormat": {"image": {"delivery": "URI"}}},
        },
        200,
    ),
    (
        "POST",
        "/v1/images/generations",
        BEARER,
        {"model": "imagegen-2", "prompt": "x", "size": "1024x1024", "response_format": "url"},
        200,
    ),
    ("POST", "/v1/messages", MSG, {**MESSAGE, "max_tokens": 0}, 400),
    ("POST", "/v1/responses", {"Authorization": "Bearer wrong-key-000"}, {"model": "respmodel-4o", "input": "x"}, 401),
]


async def worker(url: str, deadline: float, counts: dict[str, int], tasks: list[str]) -> None:
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            method, path, headers, body, expected = random.choice(CALLS)
            try:
                async with http.request(method, url + path, json=body, headers=headers) as answer:
                    data = await answer.read()
                    if answer.status != expected:
                        counts["errors"] += 1
                        counts.setdefault(f"status {answer.status} for {path}", 0)
                        counts[f"status {answer.status} for {path}"] += 1
                    counts["requests"] += 1
                    if path.endswith("/generations") and b"task_id" in data:
                        tasks.append(data.decode())
                if random.random() < 0.1:  # a video task's life: submit, poll
                    async with http.post(
                        url + "/v1/video/generations",
                        headers=BEARER,
                        json={"model": "videogen-3.0-generate-001", "prompt": "x"},
                    ) as answer:
                        task_id = (await answer.json())["task_id"]
                    async with http.get(f"{url}/v1/video/generations/{task_id}", headers=BEARER) as answer:
                        counts["errors"] += answer.status != 200
                        counts["requests"] += 2
            except (TimeoutError, aiohttp.ClientError) as exc:
                counts["errors"] += 1
                counts.setdefault(type(exc).__name__, 0)
                counts[type(exc).__name__] += 1


async def main() -> int:
    no_admin_listeners()
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=16)
    # Small enough that the memory stores (affinity pins, video statuses) fill during the
    # warm-up: a full bounded cache is not a leak, and growth after it is what this looks for.
    parser.add_argument("--state-items", type=int, default=5_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="modelgate-soak-"))
    port, sim_port = free_port(), free_port()
    # The upstream runs as its own process, so the gateway's RSS is the gateway's alone.
    simulator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "simulate",
            "--port",
            str(sim_port),
            "--chunk-delay-ms",
            "2",
            "--output-tokens",
            "16",
            "--video-queued-s",
            "0",
            "--video-processing-s",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    config = work / "gateway.yaml"
    config.write_text(
        f'server: {{listen: "127.0.0.1:{port}"}}\n'
        f"state: {{max_items: {args.state_items}}}\n"
        f"keys: [{{name: soak, key: {KEY}, url_delivery: true, limits: {{rpm: 100000000, tpm: 10000000000}}}}]\n"
        f"channels: [{{name: upstream, base_url: 'http://127.0.0.1:{sim_port}', accepts_response_format: false}}]\n"
        f"plugins: {{url_delivery: {{enabled: true, dir: '{work / 'images'}', ttl_s: 60}}}}\n"
        "observability: {logging: {access_log: false}}\n"
    )
    gateway = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "-c", str(config)],
        stdout=(work / "gateway.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for waiting_on in (port, sim_port):
        wait_port(waiting_on)
    counts: dict[str, int] = {"requests": 0, "errors": 0}
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    deadline = started + args.minutes * 60
    load = asyncio.gather(*(worker(url, deadline, counts, []) for _ in range(args.concurrency)))
    while time.monotonic() < deadline:
        await asyncio.sleep(5)
        samples.append((time.monotonic() - started, rss_kb(gateway.pid)))
    await load
    gateway.terminate()
    gateway.wait(timeout=30)
    simulator.terminate()
    simulator.wait(timeout=30)
    # Warm-up: two minutes (a fifth of longer runs). The rate limiter keeps a sliding minute of
    # entries and the capped stores fill in the first minute or so; a sample taken at 60 s can
    # fall before that and count the filling as growth.
    warm = min(max(120.0, args.minutes * 60 * 0.2), args.minutes * 60 / 2)
    after_warmup = [kb for at, kb in samples if at >= warm]
    base, last, peak = after_warmup[0], after_warmup[-1], max(after_warmup)
    growth = (peak - base) / base
    ok = growth < 0.10 and counts["errors"] == 0
    lines = [
        "## Soak",
        "",
        f"`.venv/bin/python bench/soak.py --minutes {args.minutes:g} --concurrency {args.concurrency} "
        f"--state-items {args.state_items}`: every format, streams, URL delivery, refusals (400, 401) and video polls against one gateway process "
        "(the upstream simulator in a process of its own). The memory stores are capped at "
        f"`state.max_items: {args.state_items:,}` so they fill within the warm-up; a full bounded cache "
        "is not a leak, and growth after it is what the soak looks for.",
        "",
        f"- requests: {counts['requests']:,} in {args.minutes:g} min; errors (5xx, unexpected status, "
        f"broken connections): {counts['errors']}",
        f"- RSS after a {warm:.0f} s warm-up: {base / 1024:.1f} MB; at the end {last / 1024:.1f} MB; "
        f"peak {peak / 1024:.1f} MB; growth {growth:.1%} (target under 10%) — {'met' if ok else 'NOT met'}",
        f"- RSS samples (MB, one a minute): {' '.join(f'{kb / 1024:.0f}' for _, kb in samples[::12])}",
    ]
    extra = {k: v for k, v in counts.items() if k not in ("requests", "errors")}
    if extra:
        lines.append(f"- error kinds: {extra}")
    update_section("soak", "\n".join(lines))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
