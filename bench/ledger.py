"""What the usage ledger costs a request: the gateway with the ledger off and on, side by side in
one run, interleaved, CPU per request read from /proc.

Both gateways run the default pipeline for `POST /v1/messages` in front of the canned upstream
(bench/upstream.py); 'on' prices every request and writes its record to a PostgreSQL database the
bench creates (and drops) at 127.0.0.1:5432. Gateways pinned to core 0, wrk and the upstream to
core 1, and so are the machine's PostgreSQL and Redis for the run (their processes are given their
cores back after). CPU is the gateway process's own: the database's side of the writes is not
charged to it, the gateway's side of them (building records, batching, COPY encoding) is.

`--state redis`: both gateways keep their state in Redis (127.0.0.1:6379, database 13, a prefix of
the run's own) and the bench key has rate limits, as a gateway sharing state runs: with the ledger
on, each record is journaled in Redis in the request's post-answer round trip, which the rate
limits' settlement makes anyway. `--baseline REF [REF ...]`: the pair of gateways as they were at
each git REF runs beside this tree's, interleaved, so a change's cost is read in one run.
`--print-only`: bench/RESULTS.md is left as it is.

Usage: .venv/bin/python bench/ledger.py [--duration S] [--rounds N] [--concurrency C] [--state memory|redis]
                              [--baseline REF ...] [--print-only]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.procs import free_port, no_admin_listeners, stop_all, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402
from bench.run import BODY, HEADERS, Target, checkout, run_wrk, start  # noqa: E402

HERE = Path(__file__).parent
POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS = "redis://127.0.0.1:6379/13"
LIMITS = "limits: {rpm: 100000000, tpm: 1000000000, concurrent: 100000}"
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


async def forget(prefix: str) -> None:
    """The run's keys in Redis (its journal is empty by now; limit windows would lapse anyway)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS)
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def redis_pid() -> list[int]:
    """The process of the Redis the bench uses (not the other servers on the machine: test clusters)."""
    import redis

    with redis.Redis.from_url(REDIS) as client:
        return [int(client.info("server")["process_id"])]


def pin_postgres(
    core: int | None, saved: dict[int, set[int]] | None = None, pids: list[int] | None = None
) -> dict[int, set[int]]:
    """Move the machine's PostgreSQL processes (and so the backends they fork) to `core`, so the
    database's work shares no core with the gateways (it would inflate their CPU through the
    caches); with `saved`, give each back the cores it had. Processes this user may not move are
    left. `pids`: those processes instead (the bench's Redis)."""
    import os

    found = (
        pids
        if pids is not None
        else subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout.split()
    )
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
    no_admin_listeners()
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--state", choices=("memory", "redis"), default="memory")
    parser.add_argument("--baseline", nargs="*", default=[], help="git refs whose gateways run beside this tree's")
    parser.add_argument("--print-only", action="store_true", help="leave bench/RESULTS.md as it is")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="modelgate-ledger-bench-"))
    script = work / "post.lua"
    script.write_text(
        f"wrk.method = 'POST'\nwrk.body = '{BODY}'\n"
        + "".join(f"wrk.headers['{k}'] = '{v}'\n" for k, v in HEADERS.items())
    )
    name = f"mg_ledger_bench_{uuid.uuid4().hex[:8]}"
    asyncio.run(database("create", name))
    ledger_url = POSTGRES.rsplit("/", 1)[0] + "/" + name
    up_port = free_port()
    upstream_url = f"http://127.0.0.1:{up_port}"
    procs = [start([sys.executable, str(HERE / "upstream.py"), str(up_port), "20"], 1, work / "upstream.log")]
    targets: dict[str, Target] = {}
    redis = args.state == "redis"
    prefix = f"{name}:"
    pinned = pin_postgres(1)
    pinned_redis = pin_postgres(1, pids=redis_pid()) if redis else {}
    # wrk spins on the core it shares with Redis: at its own priority Redis starved, answered the
    # gateways' probes late (seen as the store away) and rounds fell to a tenth of their rate.
    niceness = {pid: os.getpriority(os.PRIO_PROCESS, pid) for pid in pinned_redis}
    for pid in niceness:
        os.setpriority(os.PRIO_PROCESS, pid, -10)
    try:
        wait_port(up_port)
        trees: list[tuple[str, Path | None]] = [("", None)] + [(ref, checkout(ref, work)) for ref in args.baseline]
        on = f"plugins: {{ledger: {{database_url: '{ledger_url}', spool_dir: '{work / 'spool'}'MORE}}}}\n" + PRICES
        for ref, tree in trees:
            variants = [("ledger off", ""), ("ledger on", on.replace("MORE", ""))]
            if redis and not ref:  # the journal alone: this tree's ledger with it and without (redis_spool off)
                variants.append(("ledger on, no journal", on.replace("MORE", ", redis_spool: false")))
            for label, extra in variants:
                label += f" at {ref}" if ref else ""
                port = free_port()
                config = work / f"{label.replace(' ', '-').replace(',', '')}.yaml"
                # One process (workers: 1), whose CPU is read; each its own prefix, so limits never bind.
                state = f"state: {{backend: redis, url: '{REDIS}', prefix: '{prefix}{port}:'}}\n" if redis else ""
                config.write_text(
                    f'server: {{listen: "127.0.0.1:{port}", workers: 1}}\n'
                    "observability: {logging: {access_log: false}}\n"
                    f"keys: [{{name: bench, key: bench-key-0123{', ' + LIMITS if redis else ''}}}]\n"
                    f"channels: [{{name: bench, base_url: '{upstream_url}', credential: upstream-key}}]\n"
                    + state
                    + extra
                )
                # `python -m` puts its working directory first on the path: a checkout there is what runs.
                procs.append(
                    start(
                        [sys.executable, "-m", "proxy", "serve", "-c", str(config)], 0, work / f"{port}.log", cwd=tree
                    )
                )
                targets[label] = Target(label, f"http://127.0.0.1:{port}", procs[-1].pid)
                wait_port(port)
        for target in targets.values():  # warm up
            run_wrk(target, 16, 2, script)
            target.rps.clear(), target.cpu_ms.clear()
        order = list(targets.values())
        for round_ in range(args.rounds):
            # Each round starts one further along, so no gateway is always measured first (or last).
            for target in order[round_ % len(order) :] + order[: round_ % len(order)]:
                run_wrk(target, args.concurrency, args.duration, script)
                print(
                    f"{target.name:24} rps={target.rps[args.concurrency][-1]:7.0f} "
                    f"cpu={target.cpu_ms[args.concurrency][-1]:.4f} ms/request",
                    flush=True,
                )
        written = asyncio.run(rows(ledger_url))
    finally:
        stop_all(procs, 15)
        for pid, nice in niceness.items():
            os.setpriority(os.PRIO_PROCESS, pid, nice)
        asyncio.run(database("drop", name))
        pin_postgres(None, pinned)
        if redis:
            pin_postgres(None, pinned_redis, pids=list(pinned_redis))
            asyncio.run(forget(prefix))
    c = args.concurrency

    # This machine's speed drifts by tens of percent from one round to the next: a cost is the
    # median of each round's difference (measured back to back), which drift cancels.
    def paired(a: Target, b: Target) -> float:
        return statistics.median(y - x for x, y in zip(a.cpu_ms[c], b.cpu_ms[c]))

    command = (
        f"`.venv/bin/python bench/ledger.py --duration {args.duration} --rounds {args.rounds} --concurrency {c}"
        + (" --state redis" if redis else "")
        + (" --baseline " + " ".join(args.baseline) if args.baseline else "")
        + "`"
    )
    lines = [
        f"## Usage ledger cost{', Redis state' if redis else ''}",
        "",
        f"{command}: the gateway with the ledger off and on (records written to PostgreSQL, every request "
        f"priced{'; state in Redis, the key rate-limited, each record journaled in Redis' if redis else ''}), "
        f"interleaved (each round starting one further along), {args.rounds} rounds of {args.duration} s at {c} "
        "connections; medians. "
        f"Gateways on core 0; wrk, the upstream, PostgreSQL{' and Redis' if redis else ''} on core 1; CPU is "
        "the gateway process's own. Target: at most 0.03 ms CPU per request.",
        "",
        "| gateway | requests/s | gateway CPU ms/request |",
        "|---|---|---|",
    ]
    for target in targets.values():
        lines.append(
            f"| {target.name} | {statistics.median(target.rps[c]):,.0f} | {statistics.median(target.cpu_ms[c]):.4f} |"
        )
    lines.append("")
    for ref in ["", *args.baseline]:
        at = f" at {ref}" if ref else ""
        off, on = targets["ledger off" + at], targets["ledger on" + at]
        cost = paired(off, on)
        lines.append(
            f"- The ledger{at} costs {cost:.4f} ms of CPU a request, the median of the rounds' differences "
            f"({'met' if cost <= 0.03 else 'not met'}; the medians above differ by "
            f"{statistics.median(on.cpu_ms[c]) - statistics.median(off.cpu_ms[c]):.4f} ms)."
        )
    if "ledger on, no journal" in targets:
        lines.append(
            f"- The journal costs {paired(targets['ledger on, no journal'], targets['ledger on']):+.4f} ms "
            "a request (ledger on, with it and without)."
        )
    for ref in args.baseline:
        lines.append(
            f"- This tree against {ref}, ledger on: "
            f"{paired(targets[f'ledger on at {ref}'], targets['ledger on']):+.4f} ms a request; ledger off: "
            f"{paired(targets[f'ledger off at {ref}'], targets['ledger off']):+.4f} ms (medians of the "
            "rounds' differences)."
        )
    lines.append(f"- {written:,} records were written in the run.")
    if not args.print_only:
        update_section("ledger-redis" if redis else "ledger", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
