"""Slow streams held open: N message-format streams, one event a second, through one gateway
process; the gateway's RSS once all N are open, against its RSS idle.

The upstream simulator and the client run in processes of their own, so the RSS is the
gateway's alone. Targets (one worker): 1,000 streams under 100 MB, 10,000 under 1 GB.

Each stream holds two descriptors in the gateway (client and upstream side), so the largest
count one process can hold is about half its hard descriptor limit. A count written `N@W`
spreads N streams over W worker processes (`server.workers: W`, Redis state) and reports the
RSS of the whole tree: supervisor and workers summed.

Usage: .venv/bin/python bench/streams.py [--streams 1000 9500 10000@2] [--events 120]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.procs import free_port, no_admin_listeners, tree_rss_kb, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402

KEY = "streams-key-0001"
HEADERS = {"x-api-key": KEY, "msgapi-version": "2023-06-01"}
TARGETS_MB = {1_000: 100, 10_000: 1024}


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def hold(url: str, streams: int, events: int) -> tuple[int, int, int]:
    """Open `streams` streams; once every one has its first event, return (opened, events seen
    so far, failures) and keep reading them to the end in the background."""
    first = asyncio.Semaphore(0)
    counts = {"events": 0, "failed": 0}
    kinds: dict[str, int] = {}
    body = {
        "model": "msgmodel-haiku-4-5",
        "max_tokens": events,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }

    async def one(http: aiohttp.ClientSession) -> None:
        seen = False
        try:
            async with http.post(url + "/v1/messages", json=body, headers=HEADERS) as answer:
                if answer.status != 200:
                    raise aiohttp.ClientResponseError(
                        answer.request_info, (), status=answer.status, message=(await answer.text())[:200]
                    )
                async for line in answer.content:
                    if line.startswith(b"event:"):
                        counts["events"] += 1
                        if not seen:
                            seen = True
                            first.release()
        except (TimeoutError, aiohttp.ClientError) as exc:
            counts["failed"] += 1
            kind = f"{type(exc).__name__} {getattr(exc, 'status', '')} {getattr(exc, 'message', '')}"[:160]
            kinds[kind] = kinds.get(kind, 0) + 1
            if not seen:
                first.release()

    connector = aiohttp.TCPConnector(limit=0)
    http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
    tasks = []
    for n in range(streams):
        tasks.append(asyncio.create_task(one(http)))
        # Clients arrive over seconds, not in one burst a listen backlog cannot hold.
        await asyncio.sleep(0.25 if n % 250 == 249 else 0)
    for _ in range(streams):
        await first.acquire()
    snapshot = (streams, counts["events"], counts["failed"])
    if kinds:
        print(f"{streams} streams, failures: {kinds}", flush=True)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await http.close()
    return snapshot


def parse_count(text: str) -> tuple[int, int]:
    """`1000` is 1,000 streams through one process; `10000@2` is 10,000 through two workers."""
    streams, _, workers = text.partition("@")
    return int(streams), int(workers or 1)


def gateway_config(port: int, sim_port: int, streams: int, workers: int) -> str:
    state = f"state: {{backend: redis, prefix: 'modelgate-streams-{port}:'}}\n" if workers > 1 else ""
    return (
        state + f"server: {{listen: '127.0.0.1:{port}', max_connections: {streams * 2}, workers: {workers}}}\n"
        f"keys: [{{name: s, key: {KEY}, limits: {{rpm: 100000000, tpm: 10000000000}}}}]\n"
        # the channel's pool as shipped: no cap on open connections
        f"channels: [{{name: upstream, base_url: 'http://127.0.0.1:{sim_port}'}}]\n"
        "observability: {logging: {access_log: false}}\n"
    )


async def measure(streams: int, workers: int, events: int, work: Path) -> dict[str, float]:
    port, sim_port = free_port(), free_port()
    simulator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "simulate",
            "--port",
            str(sim_port),
            "--chunk-delay-ms",
            "1000",
            "--output-tokens",
            str(events),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    config = work / f"streams-{streams}-{workers}.yaml"
    config.write_text(gateway_config(port, sim_port, streams, workers))
    gateway = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "-c", str(config)],
        stdout=(work / "gateway.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_port(port)
        wait_port(sim_port)
        await asyncio.sleep(1 + workers)
        idle_kb = tree_rss_kb(gateway.pid)
        started = time.monotonic()
        opened, seen, failed = await hold(f"http://127.0.0.1:{port}", streams, events)
        held_kb = tree_rss_kb(gateway.pid)
        return {
            "streams": opened,
            "failed": failed,
            "idle_mb": idle_kb / 1024,
            "held_mb": held_kb / 1024,
            "open_s": time.monotonic() - started,
            "events": seen,
        }
    finally:
        gateway.terminate()
        simulator.terminate()
        gateway.wait(timeout=90)
        simulator.wait(timeout=30)


async def main() -> int:
    no_admin_listeners()
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--streams",
        nargs="+",
        default=["1000", "9500", "10000@2"],
        help="stream counts; N@W spreads N streams over W worker processes",
    )
    parser.add_argument("--events", type=int, default=120)
    args = parser.parse_args()
    raise_fd_limit()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    work = Path(tempfile.mkdtemp(prefix="modelgate-streams-"))
    lines = [
        "## Slow streams held",
        "",
        f"`.venv/bin/python bench/streams.py --streams {' '.join(args.streams)}`: N message-format streams, "
        "one event a second, opened over a few seconds (250 every quarter second) through the gateway "
        "(default pipeline, access lines off, the channel's connection pool as shipped: no cap); its RSS "
        "once every stream has had its first event. "
        "Upstream simulator and client in processes of their own. Each stream holds two descriptors in "
        f"the gateway; this machine's hard limit of {hard:,} descriptors a process caps one worker "
        f"below {hard // 2:,} streams, so 10,000 are also measured over two workers (Redis state), "
        "whose RSS is the supervisor's and both workers' summed.",
        "",
        "| streams | worker processes | failed | gateway RSS idle | RSS with all open | per stream | target |",
        "|---|---|---|---|---|---|---|",
    ]
    ok = True
    for streams, workers in map(parse_count, args.streams):
        result = await measure(streams, workers, args.events, work)
        target = TARGETS_MB.get(streams)
        met = target is not None and result["held_mb"] < target and result["failed"] == 0
        ok = ok and (met or target is None)
        scope = "" if workers == 1 else f" (the one-worker target, held by {workers})"
        verdict = f"under {target:,} MB{scope} — {'met' if met else 'NOT met'}" if target else "-"
        per_stream = (result["held_mb"] - result["idle_mb"]) * 1024 / streams
        lines.append(
            f"| {streams:,} | {workers} | {result['failed']:.0f} | {result['idle_mb']:.1f} MB | "
            f"{result['held_mb']:.1f} MB | {per_stream:.1f} KB | {verdict} |"
        )
        print(lines[-1], flush=True)
    update_section("streams", "\n".join(lines))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
