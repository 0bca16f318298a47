"""The limiter's cost per request, memory vs Redis: a key with rpm, tpm and a concurrency
limit (acquire all three at once, then settle the tokens and release the lease, as the
plugin does). Redis at 127.0.0.1:6379 (database 13, flushed).

With `--baseline REF [REF ...]` the limiter as it was at each git REF is measured beside the
current one, round after round in the same run (each in a process of its own, pinned to core 0
like the current one), so the comparison is not between two days of a noisy machine.

Usage: .venv/bin/python bench/ratelimit.py [--requests N] [--rounds N] [--baseline REF ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
URL = "redis://127.0.0.1:6379/13"


def checks() -> list[Any]:
    """The key's three limits, built with the Check of whichever tree is measured (older ones had no subject)."""
    from proxy.ratelimits import Check, Kind

    subject = {"subject": "key:bench"} if "subject" in getattr(Check, "__dataclass_fields__", {}) else {}
    return [
        Check("key:bench:rpm", "key-rpm", Kind.REQUESTS, 10**9, 60, **subject),
        Check("key:bench:tpm", "key-tpm", Kind.TOKENS, 10**12, 60, cost=4200, **subject),
        Check("key:bench:concurrent", "key-concurrent", Kind.CONCURRENT, 10**6, 0, **subject),
    ]


async def measure(limiter: Any, requests: int) -> dict[str, float]:
    """Each request's check (its wait), the whole request's, and this process's CPU a request."""
    limits = checks()
    acquire_us, total_us = [], []
    cpu = time.process_time()
    for _ in range(requests):
        rid = uuid.uuid4().hex
        started = time.perf_counter()
        decision = await limiter.acquire(limits, rid)
        acquired = time.perf_counter()
        assert decision.allowed
        await limiter.finish(limits, rid, 180)
        acquire_us.append((acquired - started) * 1e6)
        total_us.append((time.perf_counter() - started) * 1e6)
    cpu_us = (time.process_time() - cpu) / requests * 1e6
    acquire_us.sort()
    return {
        "p50": statistics.median(acquire_us),
        "p99": acquire_us[int(len(acquire_us) * 0.99)],
        "whole": statistics.median(total_us),
        "cpu": cpu_us,
    }


async def measure_follow_up(limiter: Any, store: Any, requests: int, together: bool) -> list[float]:
    """A follow-up's Redis wait before its upstream call: the record of the id it follows and its
    limit check, one after the other (as before they shared a round trip) or started together."""
    limits = checks()
    waits = []
    for _ in range(requests):
        rid = uuid.uuid4().hex
        started = time.perf_counter()
        if together:
            record, decision = await asyncio.gather(store.get("pin:response:resp_bench"), limiter.acquire(limits, rid))
        else:
            record = await store.get("pin:response:resp_bench")
            decision = await limiter.acquire(limits, rid)
        waits.append((time.perf_counter() - started) * 1e6)
        assert decision.allowed and record is not None
        await limiter.finish(limits, rid, 180)
    return waits


async def one_tree(backend: str, requests: int) -> dict[str, float]:
    """One round of one backend, in the tree this process imports `proxy` from."""
    if backend == "memory":
        from proxy.ratelimits.memory import MemoryLimiter

        limiter: Any = MemoryLimiter()
    else:
        from proxy.ratelimits.redis import RedisLimiter

        limiter = RedisLimiter(URL, f"bench{uuid.uuid4().hex[:6]}:")
    await measure(limiter, 200)
    found = await measure(limiter, requests)
    await limiter.close()
    return found


async def follow_ups(requests: int) -> list[str]:
    from proxy.ratelimits.redis import RedisLimiter
    from proxy.state.redis import RedisStore

    limiter, store = RedisLimiter(URL, "bench:"), RedisStore(URL, "bench:")
    await store.set("pin:response:resp_bench", '{"channel":"c","owner":"t"}', 600)
    rows = []
    for together, label in (
        (False, "check after the followed id's record"),
        (True, "check with the followed id's record (one pipeline)"),
    ):
        await measure_follow_up(limiter, store, 200, together)
        waits = sorted(await measure_follow_up(limiter, store, requests, together))
        rows.append(
            f"| redis, {label} | {statistics.median(waits):.1f} | {waits[int(len(waits) * 0.99)]:.1f} "
            f"| - | - | {'1' if together else '2'} before the upstream call |"
        )
        print(rows[-1], flush=True)
    await store.close()
    await limiter.close()
    return rows


def run_tree(tree: Path, backend: str, requests: int) -> dict[str, float]:
    """One round in a process of its own, importing `proxy` from `tree`, pinned to core 0."""
    done = subprocess.run(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            str(Path(__file__).resolve()),
            "--tree",
            str(tree),
            "--backend",
            backend,
            "--requests",
            str(requests),
        ],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def export(ref: str, work: Path) -> Path:
    """The tree of `ref`, exported into `work` (no worktree left behind)."""
    target = work / ref
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


async def ping_us() -> float:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(URL)
    await client.flushdb()
    pings = []
    for _ in range(2000):
        started = time.perf_counter()
        await client.ping()
        pings.append((time.perf_counter() - started) * 1e6)
    await client.aclose()
    return statistics.median(pings[200:])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests a round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each tree, interleaved")
    parser.add_argument("--baseline", nargs="*", default=[], help="git refs whose limiter runs beside this one")
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # one round, in a process of its own
    parser.add_argument("--backend", default="redis", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.tree) if args.tree else HERE.parent))
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as the gateway runs (older trees name it elsewhere)
    if args.tree:
        print(json.dumps(asyncio.run(one_tree(args.backend, args.requests))))
        return 0
    from bench.results import update_section

    with tempfile.TemporaryDirectory(prefix="ratelimit-bench-") as work:
        trees = [("this tree", "", HERE.parent)] + [
            (f"at {ref}", ref, export(ref, Path(work))) for ref in args.baseline
        ]
        runs: dict[tuple[str, str], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for backend in ("memory", "redis"):
                for name, _ref, tree in trees if backend == "redis" else trees[:1]:
                    runs.setdefault((backend, name), []).append(run_tree(tree, backend, args.requests))
        ping = asyncio.run(ping_us())
        rows = [
            "## Rate-limit cost per request",
            "",
            f"A key with rpm, tpm and a concurrency limit: one check of all three, then one call that settles the "
            f"tokens and releases the lease, as the plugin does; {args.requests:,} sequential requests a round "
            f"after a warm-up, {args.rounds} rounds (medians of the rounds), each in a process of its own pinned "
            f"to core 0; Redis 7 on the same machine, uvloop. `.venv/bin/python bench/ratelimit.py"
            f"{' --baseline ' + ' '.join(args.baseline) if args.baseline else ''}`. A row 'at REF' is the "
            f"limiter of that commit, measured in the same run. CPU is the client process's, a whole request "
            f"(check and settlement). For scale: one PING through a plain redis-py client costs {ping:.0f} us "
            "here. The last two rows are a follow-up's (a `previous_response_id`, a video poll) wait on Redis "
            "before its upstream call: the record of the id it follows and the check.",
            "",
            "| backend | check p50 us | check p99 us | whole request p50 us | client CPU us/request | round trips |",
            "|---|---|---|---|---|---|",
        ]
        for (backend, name), found in runs.items():

            def mid(field: str, found: list[dict[str, float]] = found) -> float:
                return statistics.median(r[field] for r in found)

            label = backend if name == "this tree" else f"{backend}, {name}"
            trips = "0" if backend == "memory" else "1, and 1 after the answer"
            rows.append(
                f"| {label} | {mid('p50'):.1f} | {mid('p99'):.1f} | {mid('whole'):.1f} | {mid('cpu'):.1f} | {trips} |"
            )
            print(rows[-1], flush=True)
        rows += asyncio.run(follow_ups(args.requests))
    update_section("ratelimit", "\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
