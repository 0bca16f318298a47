"""The key store's cost on the request path: CPU per request with 10,000 stored keys against a
gateway whose keys are the config file's alone.

A stored key is found in memory by digest, as a configured key is, so the figure should not move.
Both gateways (same process count, access lines and metrics on, a fixed bound on requests in
flight) are pinned to core 0 in turn,
wrk to core 1 (64 connections, 5 s, `POST /v1/messages` to the fast bench upstream), rounds
alternating so that a drift of the machine falls on both; the gateway's CPU seconds are read from
/proc. The 10,000 keys are written straight into the store's table (their digests random, as any
secret's is), and the key wrk presents is made through the admin API, as an operator would.

With `--instructions`, each gateway runs under callgrind instead (bench/instructions.py's way:
instructions a request, 16 at a time, the idle rate taken out), which a busy machine moves far
less than CPU seconds: each round starts both gateways afresh, the stored one filled and holding
every key before it is counted.

Usage: .venv/bin/python bench/key_store.py [--rounds R] [--keys N] [--instructions] [--print-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.ledger import POSTGRES  # noqa: E402
from bench.overload import KEY, wrk  # noqa: E402
from bench.procs import cpu_model, free_port, stop_all, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402

HERE = Path(__file__).parent
OWNER = "bench-owner-token-0123456789"


async def fill(url: str, count: int) -> None:
    """`count` stored keys, written in one statement once the gateway has made the tables."""
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "INSERT INTO stored_keys (name, sha256, spec, revision, created_by, updated_by) "
            "SELECT 'bulk-' || n, sha256(gen_random_uuid()::text::bytea), '{\"limits\": {\"rpm\": 600}}', "
            "nextval('key_store_revision'), 'bench', 'bench' FROM generate_series(1, $1) AS n",
            count,
        )
        await connection.execute("SELECT pg_notify('modelgate_key_store', 'bulk')")
    finally:
        await connection.close()


def _admin(url: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        url + path,
        method=method,
        data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Bearer {OWNER}", "Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=60).read())


def _held(admin: str) -> int:
    text = urllib.request.urlopen(admin + "/metrics", timeout=60).read().decode()
    line = next(
        (line for line in text.splitlines() if line.startswith('modelgate_keys{source="stored",state="active"}')), "x 0"
    )
    return int(float(line.split()[-1]))


def instructions(args: argparse.Namespace) -> int:
    from bench.instructions import measure

    work = Path(tempfile.mkdtemp(prefix="modelgate-keystore-instr-"))
    database = f"mg_bench_ks_{uuid.uuid4().hex[:8]}"
    subprocess.run(["psql", POSTGRES, "-qc", f'CREATE DATABASE "{database}"'], check=True)
    db_url = POSTGRES.rsplit("/", 1)[0] + "/" + database
    up_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "upstream.py"), str(up_port)],
        stdout=(work / "upstream.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    stored: dict[str, str] = {}  # the stored key's secret, once made
    counts: dict[str, list[float]] = {"config keys only": [], f"{args.keys:,} stored keys": []}
    try:
        wait_port(up_port)
        for _ in range(args.rounds):
            for name in counts:
                port, admin = free_port(), free_port()
                # No full resync in the counted windows: it runs by the clock (each resync_s, 30 by
                # default) whatever the traffic, and under callgrind's slowdown one landing among a
                # thousand requests made them look 10% dearer. Its own cost is measured apart.
                extra = f"key_store: {{database_url: '{db_url}', resync_s: 3600}}\n" if "stored" in name else ""
                config = work / f"{port}.yaml"
                config.write_text(
                    f"server: {{listen: '127.0.0.1:{port}', admin_listen: '127.0.0.1:{admin}', "
                    f"admin_token: {OWNER}, workers: 1, max_in_flight: 100000}}\n{extra}"
                    "observability: {logging: {access_log: false}}\n"
                    f"keys: [{{name: bench, key: {KEY}}}]\n"
                    f"channels: [{{name: bench, base_url: 'http://127.0.0.1:{up_port}', credential: up}}]\n"
                )
                admin_url = f"http://127.0.0.1:{admin}"

                def prepare(stored_gateway: bool = "stored" in name, admin_url: str = admin_url) -> dict[str, str]:
                    headers = {"Content-Type": "application/json", "msgapi-version": "2023-06-01", "x-api-key": KEY}
                    if not stored_gateway:
                        return headers
                    wait_port(int(admin_url.rsplit(":", 1)[1]), timeout=300)
                    if not stored:
                        asyncio.run(fill(db_url, args.keys))
                        stored["secret"] = _admin(admin_url, "POST", "/admin/v1/keys", {"name": "bench-stored"})[
                            "secret"
                        ]
                    deadline = time.monotonic() + 600
                    while _held(admin_url) < args.keys + 1:  # every key made live (slow under callgrind)
                        if time.monotonic() > deadline:
                            raise RuntimeError("the stored gateway never held every key")
                        time.sleep(1)
                    return {**headers, "x-api-key": stored["secret"]}

                counts[name].append(measure(name, config, None, work, args.requests, args.idle, prepare).per_request)
    finally:
        stop_all([upstream], 30)
        subprocess.run(["psql", POSTGRES, "-qc", f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'])
    base, with_keys = (statistics.median(values) for values in counts.values())
    lines = [
        "## The key store on the request path, in instructions",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `.venv/bin/python bench/key_store.py "
        f"--instructions --rounds {args.rounds} --keys {args.keys} --requests {args.requests}`. Machine: "
        f"{os.cpu_count()} cores ({cpu_model()}). One worker each under callgrind (bench/instructions.py's "
        "way): instructions a request, 16 at a time, `POST /v1/messages`, the idle rate taken out; each round "
        "starts both afresh, the stored one holding every key (and the key presented a stored one).",
        "",
        "| gateway | instructions a request (median) | rounds |",
        "|---|---|---|",
    ]
    for name, values in counts.items():
        lines.append(f"| {name} | {statistics.median(values):,.0f} | {' / '.join(f'{v:,.0f}' for v in values)} |")
    lines += [
        "",
        f"Stored against config-only: {with_keys - base:+,.0f} instructions a request "
        f"({(with_keys / base - 1) * 100:+.1f}%).",
        "",
    ]
    section = "\n".join(lines)
    print(section)
    if not args.print_only:
        update_section("key_store_instructions", section)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind")
    parser.add_argument("--requests", type=int, default=1000, help="with --instructions: requests counted")
    parser.add_argument("--idle", type=float, default=10.0, help="with --instructions: seconds of idle measured")
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args()
    if args.instructions:
        return instructions(args)
    work = Path(tempfile.mkdtemp(prefix="modelgate-keystore-"))
    database = f"mg_bench_ks_{uuid.uuid4().hex[:8]}"
    subprocess.run(["psql", POSTGRES, "-qc", f'CREATE DATABASE "{database}"'], check=True)
    db_url = POSTGRES.rsplit("/", 1)[0] + "/" + database
    up_port = free_port()
    procs = [
        subprocess.Popen(
            ["taskset", "-c", "1", sys.executable, str(HERE / "upstream.py"), str(up_port)],
            stdout=(work / "upstream.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
    ]
    gateways: dict[str, tuple[str, int]] = {}
    try:
        wait_port(up_port)
        for name, extra in (
            ("config keys only", ""),
            (f"{args.keys:,} stored keys", f"key_store: {{database_url: '{db_url}'}}\n"),
        ):
            port, admin = free_port(), free_port()
            config = work / f"{port}.yaml"
            # A fixed bound on requests in flight: what is measured is a request's cost, and `auto`
            # admission, which now and then refuses some of a closed loop saturating the CPU (both
            # gateways alike), would mix cheap refusals into it (and fail the run).
            config.write_text(
                f"server: {{listen: '127.0.0.1:{port}', admin_listen: '127.0.0.1:{admin}', "
                f"admin_token: {OWNER}, workers: 1, max_in_flight: 100000}}\n{extra}"
                f"keys: [{{name: bench, key: {KEY}}}]\n"
                f"channels: [{{name: bench, base_url: 'http://127.0.0.1:{up_port}', credential: up}}]\n"
            )
            procs.append(
                subprocess.Popen(
                    ["taskset", "-c", "0", sys.executable, "-m", "proxy", "serve", "-c", str(config)],
                    stdout=(work / f"{port}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                    cwd=HERE.parent,
                )
            )
            wait_port(port)
            wait_port(admin)
            gateways[name] = (f"http://127.0.0.1:{port}", procs[-1].pid, f"http://127.0.0.1:{admin}")
        stored_name = next(n for n in gateways if "stored" in n)
        asyncio.run(fill(db_url, args.keys))
        request = urllib.request.Request(
            gateways[stored_name][2] + "/admin/v1/keys",
            method="POST",
            data=json.dumps({"name": "bench-stored"}).encode(),
            headers={"Authorization": f"Bearer {OWNER}", "Content-Type": "application/json"},
        )
        stored_key = json.loads(urllib.request.urlopen(request, timeout=30).read())["secret"]
        time.sleep(2)  # held by the gateway (a notice, then a read of 10,000 rows)
        held = urllib.request.urlopen(urllib.request.Request(gateways[stored_name][2] + "/metrics")).read().decode()
        presented = {name: (KEY if "config" in name else stored_key) for name in gateways}
        cpu: dict[str, list[float]] = {name: [] for name in gateways}
        for name, (url, pid, _) in gateways.items():
            wrk(url, pid, work, {"x-api-key": presented[name]})  # warm-up
        for _ in range(args.rounds):
            for name, (url, pid, _) in gateways.items():
                _, ok, ms = wrk(url, pid, work, {"x-api-key": presented[name]})
                assert ok == 1, f"{name}: not every answer was 2xx"
                cpu[name].append(ms)
    finally:
        stop_all(procs, 30)
        subprocess.run(["psql", POSTGRES, "-qc", f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'])
    active = next(
        (line for line in held.splitlines() if line.startswith('modelgate_keys{source="stored",state="active"}')), ""
    )
    base, stored = (statistics.median(values) for values in cpu.values())
    lines = [
        "## The key store on the request path",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `.venv/bin/python bench/key_store.py --rounds "
        f"{args.rounds} --keys {args.keys}`. Machine: {os.cpu_count()} cores ({cpu_model()}). One worker each "
        "(a fixed bound on requests in flight), pinned to core 0 in turn; wrk on core 1, 64 connections, 5 s, `POST /v1/messages`; the gateway's CPU "
        f"per request, median of {args.rounds} alternating rounds (each round's figure in brackets). The stored "
        f"gateway held its keys as the run began (`{active.strip()}`), and the key presented was a stored one.",
        "",
        "| gateway | CPU ms a request | rounds |",
        "|---|---|---|",
    ]
    for name, values in cpu.items():
        lines.append(f"| {name} | {statistics.median(values):.3f} | {', '.join(f'{v:.3f}' for v in values)} |")
    lines += [
        "",
        f"Stored against config-only: {stored / base:.2f}x (target: unchanged within the rounds' spread).",
        "",
    ]
    section = "\n".join(lines)
    print(section)
    if not args.print_only:
        update_section("key_store", section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
