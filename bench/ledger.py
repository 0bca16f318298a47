"""What the usage ledger costs a request: the gateway with the ledger off and on, side by side in
one run, interleaved, CPU per request read from /proc.

Both gateways run the default pipeline for `POST /v1/messages` in front of the canned upstream
(bench/upstream.py); 'on' prices every request and writes its record to a PostgreSQL database the
bench creates (and drops) at 127.0.0.1:5432. Gateways pinned to core 0, wrk and the upstream to
core 1, and so is the machine's PostgreSQL for the run (its processes are given their cores back
after). CPU is the gateway process's own: the database's side of the writes is not charged to it,
the gateway's side of them (building records, batching, COPY encoding) is.

Usage: python bench/ledger.py [--duration S] [--rounds N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.procs import free_port, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402
from bench.run import BODY, HEADERS, Target, run_wrk, start  # noqa: E402

HERE = Path(__file__).parent
POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
PRICES = 'prices: [{model: "msgmodel-*", input_per_mtok: 3, output_per_mtok: 15}]\n'


async def database(action: str, name: str) -> None:
    import asyncpg

    admin = await asyncpg.connect(POSTGRES)
    try:
        drop = f'DROP DATABASE "{name}" WITH (FORCE)'
        await admin.execute(f'CREATE DATABASE "{name}"' if action == "create" else drop)
    finally:
        await admin.close()


async def rows(url: str) -> int:
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        return int(await connection.fetchval("SELECT count(*) FROM usage_records"))
    finally:
        await connection.close()


def pin_postgres(core: int | None, saved: dict[int, set[int]] | None = None) -> dict[int, set[int]]:
    """Move the machine's PostgreSQL processes (and so the backends they fork) to `core`, so the
    database's work shares no core with the gateways (it would inflate their CPU through the
    caches); with `saved`, give each back the cores it had. Processes this user may not move are left."""
    import os

    found = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout.split()
    everywhere = set(range(os.cpu_count() or 1))
    before: dict[int, set[int]] = {}
    for pid in map(int, found):
        try:
            before[pid] = os.sched_getaffinity(pid)
            # Restoring: a backend forked during the run gets the cores the processes had before it.
            wanted = {core} if saved is None else saved.get(pid, next(iter(saved.values()), everywhere))
            os.sched_setaffinity(pid, wanted or everywhere)
        except OSError:
            continue
    return before


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="modelgate-ledger-bench-"))
    script = work / "post.lua"
    script.write_text(f"wrk.method = 'POST'\nwrk.body = '{BODY}'\n"
                      + "".join(f"wrk.headers['{k}'] = '{v}'\n" for k, v in HEADERS.items()))
    name = f"mg_ledger_bench_{uuid.uuid4().hex[:8]}"
    asyncio.run(database("create", name))
    ledger_url = POSTGRES.rsplit("/", 1)[0] + "/" + name
    up_port = free_port()
    upstream_url = f"http://127.0.0.1:{up_port}"
    procs = [start([sys.executable, str(HERE / "upstream.py"), str(up_port), "20"], 1, work / "upstream.log")]
    targets = []
    pinned = pin_postgres(1)
    try:
        wait_port(up_port)
        for label, extra in (("ledger off", ""),
                             ("ledger on", f"plugins: {{ledger: {{database_url: '{ledger_url}', "
                                           f"spool_dir: '{work / 'spool'}'}}}}\n" + PRICES)):
            port = free_port()
            config = work / f"{label.replace(' ', '-')}.yaml"
            config.write_text(f'server: {{listen: "127.0.0.1:{port}"}}\n'
                              "observability: {logging: {access_log: false}}\n"
                              "keys: [{name: bench, key: bench-key-0123}]\n"
                              f"channels: [{{name: bench, base_url: '{upstream_url}', credential: upstream-key}}]\n"
                              + extra)
            procs.append(start([sys.executable, "-m", "proxy", "serve", "-c", str(config)], 0, work / f"{port}.log"))
            targets.append(Target(label, f"http://127.0.0.1:{port}", procs[-1].pid))
            wait_port(port)
        for target in targets:  # warm up
            run_wrk(target, 16, 2, script)
            target.rps.clear(), target.cpu_ms.clear()
        for _ in range(args.rounds):
            for target in targets:
                run_wrk(target, args.concurrency, args.duration, script)
                print(f"{target.name:11} rps={target.rps[args.concurrency][-1]:7.0f} "
                      f"cpu={target.cpu_ms[args.concurrency][-1]:.4f} ms/request", flush=True)
        written = asyncio.run(rows(ledger_url))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=15)
        asyncio.run(database("drop", name))
        pin_postgres(None, pinned)
    off, on = (statistics.median(t.cpu_ms[args.concurrency]) for t in targets)
    rps_off, rps_on = (statistics.median(t.rps[args.concurrency]) for t in targets)
    # This machine's speed drifts by tens of percent from one round to the next: the cost is the
    # median of each round's difference (on less off, measured back to back), which drift cancels.
    paired = statistics.median(b - a for a, b in zip(targets[0].cpu_ms[args.concurrency],
                                                      targets[1].cpu_ms[args.concurrency]))
    lines = ["## Usage ledger cost", "",
             f"`python bench/ledger.py --duration {args.duration} --rounds {args.rounds} "
             f"--concurrency {args.concurrency}`: "
             "the gateway with the ledger off and on (records written to PostgreSQL, every request priced), "
             f"interleaved, {args.rounds} rounds of {args.duration} s at {args.concurrency} connections; medians. "
             "Gateways on core 0; wrk, the upstream and PostgreSQL on core 1; CPU is the gateway process's own. "
             "Target: at most 0.03 ms CPU per request.",
             "",
             "| ledger | requests/s | gateway CPU ms/request |", "|---|---|---|",
             f"| off | {rps_off:,.0f} | {off:.4f} |", f"| on | {rps_on:,.0f} | {on:.4f} |", "",
             f"The ledger costs {paired:.4f} ms of CPU a request, the median of the rounds' differences "
             f"({'met' if paired <= 0.03 else 'not met'}; the medians above differ by {on - off:.4f} ms); "
             f"{written:,} records were written in the run."]
    update_section("ledger", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
