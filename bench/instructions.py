"""What the usage ledger costs a request, counted in instructions: each gateway runs under
valgrind's callgrind, which counts the instructions a process executes, so the figure is the
same, or nearly (below), whatever else the machine runs (bench/ledger.py's CPU seconds swing by
tens of percent from one round to the next on a shared machine).

Each variant of bench/ledger.py --state redis (ledger off, on, on without the journal; and the
same at each `--baseline` ref) is started under callgrind, warmed up, its counters zeroed,
sent `--requests` requests of `POST /v1/messages` (16 at a time), and its counters read. What a
gateway does by the clock alone (timers, probes, the writer's flushes) is counted too, and runs
far more often per request under callgrind's slowdown: it is measured with the gateway idle for
`--idle` seconds before the requests and taken out at the same rate. Instructions are not time
(a cache miss costs more than an add), and not quite the code's alone either: how many calls
share a Redis pipeline goes with timing, and the same gateway moved by up to 3% from one run to
the next. Compare within one run.

Usage: .venv/bin/python bench/instructions.py [--requests N] [--idle S] [--rounds R] [--baseline REF ...] [--print-only]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent.parent))
from bench.ledger import LIMITS, POSTGRES, PRICES, REDIS, database, forget  # noqa: E402
from bench.procs import free_port, no_admin_listeners, stop_all, wait_port  # noqa: E402
from bench.results import update_section  # noqa: E402
from bench.run import BODY, HEADERS, checkout, start  # noqa: E402

HERE = Path(__file__).parent
CONCURRENCY = 16
# The writer's batches as large as they are at full speed. Under callgrind a gateway serves some
# 70 requests a second, so at the default (a batch each second) each batch held ~70 records where
# it holds up to 1,000 unslowed: its fixed work (a transaction, the journal's measure, the spools'
# and the orphans' scans) came to 15,000-25,000 instructions a record that it does not cost, and
# the baseline's idle polling (10 million instructions a second) made its subtracted idle rate
# swing by a tenth of a request. A batch of 200 records, and no clock-driven turn in the counted
# window, for every tree alike (the baseline's writer takes both settings too).
WRITER = "batch_size: 200, flush_interval_s: 60"


@dataclass(slots=True)
class Count:
    name: str
    per_request: float  # instructions a request, the idle rate taken out
    idle_per_s: float  # instructions a second with nothing to serve
    seconds: float  # how long the requests took under callgrind


async def send(url: str, count: int, headers: dict[str, str] | None = None) -> None:
    """`count` requests at CONCURRENCY at once, each answered 200 (`headers`: the bench's key's, unless given)."""
    headers = headers or HEADERS
    left = count
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as http:

        async def one_after_another() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with http.post(url + "/v1/messages", data=BODY, headers=headers) as answer:
                    await answer.read()
                    if answer.status != 200:
                        raise RuntimeError(f"{url}: {answer.status}")

        await asyncio.gather(*(one_after_another() for _ in range(CONCURRENCY)))


def counted(pid: int, out: Path, action: object) -> tuple[float, float]:
    """Zero the process's counters, run `action`, dump them: (instructions, seconds taken)."""
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    began = time.monotonic()
    action()  # type: ignore[operator]
    seconds = time.monotonic() - began
    before = set(out.parent.glob(out.name + "*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    for _ in range(100):
        dumped = sorted(set(out.parent.glob(out.name + "*")) - before)
        if dumped and (found := re.search(r"^(?:summary|totals): (\d+)", dumped[-1].read_text(), re.M)):
            return float(found[1]), seconds
        time.sleep(0.1)
    raise RuntimeError(f"callgrind wrote no counts for {pid}")


def measure(
    name: str,
    config: Path,
    tree: Path | None,
    work: Path,
    requests: int,
    idle_s: float,
    prepare: Callable[[], dict[str, str]] | None = None,
) -> Count:
    """One gateway's instructions a request; `prepare()`, once it listens, readies it and says
    the headers its requests carry."""
    port = int(re.search(r"127\.0\.0\.1:(\d+)", config.read_text())[1])  # type: ignore[index]
    out = work / f"callgrind-{port}"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen(
        [
            "taskset",
            "-c",
            "0",
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}.%p",
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "-c",
            str(config),
        ],
        stdout=(work / f"{port}.log").open("wb"),
        stderr=subprocess.STDOUT,
        cwd=tree or HERE.parent,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_port(port, timeout=300)
        headers = prepare() if prepare is not None else HEADERS
        asyncio.run(send(url, 300, headers))  # warm: connections open, scripts loaded, caches filled
        time.sleep(3)  # the warm-up's records written
        # Idle first: after the requests, what they left to do (their records' writes) would be
        # taken for what the gateway does by the clock, and subtracted from them.
        idle, idle_seconds = counted(proc.pid, out, lambda: time.sleep(idle_s))
        loaded, seconds = counted(proc.pid, out, lambda: (asyncio.run(send(url, requests, headers)), time.sleep(2)))
    finally:
        stop_all([proc], 60)
    idle_rate = idle / idle_seconds
    count = Count(name, (loaded - idle_rate * seconds) / requests, idle_rate, seconds)
    print(f"{name:26} {count.per_request:12,.0f} instructions a request (idle {idle_rate:,.0f}/s)", flush=True)
    return count


def _fixed_bound(tree: Path | None) -> str:
    """A fixed bound on requests in flight, for a tree that has admission control: under
    callgrind's slowdown the event loop runs late by far more than `auto`'s target, and `auto`
    sheds the bench's requests as an overloaded worker's."""
    model = (tree or HERE.parent) / "proxy" / "config" / "model.py"
    return ", max_in_flight: 100000" if "max_in_flight" in model.read_text() else ""


def _median(found: list[Count]) -> Count:
    return sorted(found, key=lambda count: count.per_request)[len(found) // 2]


def main() -> int:
    no_admin_listeners()
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds the idle rate is measured over")
    parser.add_argument("--baseline", nargs="*", default=[], help="git refs whose gateways are counted too")
    parser.add_argument("--rounds", type=int, default=3, help="each gateway measured this many times, interleaved")
    parser.add_argument("--print-only", action="store_true", help="leave bench/RESULTS.md as it is")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="modelgate-instructions-"))
    name = f"mg_ledger_instr_{uuid.uuid4().hex[:8]}"
    asyncio.run(database("create", name))
    ledger_url = POSTGRES.rsplit("/", 1)[0] + "/" + name
    up_port = free_port()
    upstream = start([sys.executable, str(HERE / "upstream.py"), str(up_port), "20"], 1, work / "upstream.log")
    prefix = f"{name}:"
    measured: dict[str, list[Count]] = {}
    try:
        wait_port(up_port)
        on = (
            f"plugins: {{ledger: {{database_url: '{ledger_url}', spool_dir: '{work / 'spool'}', {WRITER}MORE}}}}\n"
            + PRICES
        )
        runs: list[tuple[str, Path | None, str]] = []
        for ref, tree in [("", None)] + [(ref, checkout(ref, work)) for ref in args.baseline]:
            at = f" at {ref}" if ref else ""
            runs += [("ledger off" + at, tree, ""), ("ledger on" + at, tree, on.replace("MORE", ""))]
            if not ref:
                runs.append(("ledger on, no journal", tree, on.replace("MORE", ", redis_spool: false")))
        # Round by round, every gateway once a round: what the machine did meanwhile (how many calls
        # then shared a Redis pipeline) falls on all of them alike; the median of the rounds is kept.
        for _ in range(args.rounds):
            for label, tree, extra in runs:
                port = free_port()
                config = work / f"{port}.yaml"
                config.write_text(
                    f'server: {{listen: "127.0.0.1:{port}", workers: 1{_fixed_bound(tree)}}}\n'
                    "observability: {logging: {access_log: false}}\n"
                    f"keys: [{{name: bench, key: bench-key-0123, {LIMITS}}}]\n"
                    f"channels: [{{name: bench, base_url: 'http://127.0.0.1:{up_port}', "
                    "credential: upstream-key}]\n"
                    f"state: {{backend: redis, url: '{REDIS}', prefix: '{prefix}{port}:'}}\n" + extra
                )
                measured.setdefault(label, []).append(measure(label, config, tree, work, args.requests, args.idle))
    finally:
        upstream.terminate()
        upstream.wait(timeout=15)
        asyncio.run(database("drop", name))
        asyncio.run(forget(prefix))
    counts = {label: _median(found) for label, found in measured.items()}
    lines = [
        "## Usage ledger cost in instructions, Redis state",
        "",
        f"`.venv/bin/python bench/instructions.py --requests {args.requests} --idle {args.idle:g} --rounds {args.rounds}"
        + (" --baseline " + " ".join(args.baseline) if args.baseline else "")
        + "`: each gateway of "
        "bench/ledger.py --state redis under callgrind, its instructions over the requests (16 at a time) "
        "less what it runs idle for as long, in rounds (each gateway once a round; the median round "
        "kept). The ledger's writer in every tree writes batches of 200 and turns by the clock once a "
        f"minute (`{WRITER}`: the batches it writes at full speed; see WRITER in bench/instructions.py). "
        "Target: ledger on not above the baseline's.",
        "",
        "| gateway | instructions a request (median) | rounds, lowest to highest | idle, a second |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c.name} | {c.per_request:,.0f} | "
        + " / ".join(f"{r.per_request:,.0f}" for r in sorted(measured[c.name], key=lambda r: r.per_request))
        + f" | {c.idle_per_s:,.0f} |"
        for c in counts.values()
    ]
    lines.append("")
    for ref in ["", *args.baseline]:
        at = f" at {ref}" if ref else ""
        off, on_ = counts["ledger off" + at].per_request, counts["ledger on" + at].per_request
        lines.append(f"- The ledger{at} costs {on_ - off:,.0f} instructions a request ({(on_ - off) / off:.1%}).")
    for ref in args.baseline:
        for variant in ("ledger on", "ledger off"):
            mine, theirs = counts[variant].per_request, counts[f"{variant} at {ref}"].per_request
            lines.append(
                f"- {variant}, this tree against {ref}: {mine - theirs:+,.0f} instructions a request "
                f"({(mine - theirs) / theirs:+.1%})."
            )
    section = "\n".join(lines)
    if not args.print_only:
        update_section("ledger-instructions", section)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
