"""The limiter's cost per request, memory vs Redis: a key with rpm, tpm and a concurrency
limit (acquire all three at once, then settle the tokens and release the lease, as the
plugin does). Redis at 127.0.0.1:6379 (database 13, flushed).

Usage: python bench/ratelimit.py [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.results import update_section  # noqa: E402
from proxy.limits import Check, Kind  # noqa: E402
from proxy.limits.memory import MemoryLimiter  # noqa: E402
from proxy.limits.redis import RedisLimiter  # noqa: E402
from proxy.state.redis import RedisStore  # noqa: E402

CHECKS = [Check("key:bench:rpm", "key-rpm", Kind.REQUESTS, 10**9, 60, subject="key:bench"),
          Check("key:bench:tpm", "key-tpm", Kind.TOKENS, 10**12, 60, cost=4200, subject="key:bench"),
          Check("key:bench:concurrent", "key-concurrent", Kind.CONCURRENT, 10**6, 0, subject="key:bench")]


async def measure(limiter: object, requests: int) -> tuple[list[float], list[float]]:
    acquire_us, total_us = [], []
    for _ in range(requests):
        rid = uuid.uuid4().hex
        started = time.perf_counter()
        decision = await limiter.acquire(CHECKS, rid)  # type: ignore[attr-defined]
        acquired = time.perf_counter()
        assert decision.allowed
        await limiter.finish(CHECKS, rid, 180)  # type: ignore[attr-defined]
        acquire_us.append((acquired - started) * 1e6)
        total_us.append((time.perf_counter() - started) * 1e6)
    return acquire_us, total_us


async def measure_follow_up(limiter: RedisLimiter, store: RedisStore, requests: int,
                            together: bool) -> list[float]:
    """A follow-up's Redis wait before its upstream call: the record of the id it follows and its
    limit check, one after the other (as before they shared a round trip) or started together."""
    waits = []
    for _ in range(requests):
        rid = uuid.uuid4().hex
        started = time.perf_counter()
        if together:
            record, decision = await asyncio.gather(store.get("pin:response:resp_bench"), limiter.acquire(CHECKS, rid))
        else:
            record = await store.get("pin:response:resp_bench")
            decision = await limiter.acquire(CHECKS, rid)
        waits.append((time.perf_counter() - started) * 1e6)
        assert decision.allowed and record is not None
        await limiter.finish(CHECKS, rid, 180)
    return waits


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url("redis://127.0.0.1:6379/13")
    await client.flushdb()
    pings = []
    for _ in range(2000):
        started = time.perf_counter()
        await client.ping()
        pings.append((time.perf_counter() - started) * 1e6)
    await client.aclose()
    rows = ["## Rate-limit cost per request", "",
            f"A key with rpm, tpm and a concurrency limit: one check of all three, then one call that settles the "
            f"tokens and releases the lease, as the plugin does; {args.requests:,} sequential requests after a warm-up; "
            "Redis 7 on the same machine, uvloop. `python bench/ratelimit.py`. For scale: one PING through the "
            "same client costs PING_US us here. The last two rows are a follow-up's (a `previous_response_id`, a "
            "video poll) wait on Redis before its upstream call: the record of the id it follows and the check.", "",
            "| backend | check p50 us | check p99 us | whole request p50 us | round trips |", "|---|---|---|---|---|"]
    for name, limiter, trips in (("memory", MemoryLimiter(), "0"),
                                 ("redis", RedisLimiter("redis://127.0.0.1:6379/13", "bench:"), "1, and 1 after the answer")):
        await measure(limiter, 200)
        acquire, total = await measure(limiter, args.requests)
        acquire.sort()
        rows.append(f"| {name} | {statistics.median(acquire):.1f} | {acquire[int(len(acquire) * 0.99)]:.1f} | "
                    f"{statistics.median(total):.1f} | {trips} |")
        print(rows[-1])
        if name == "redis":
            store = RedisStore("redis://127.0.0.1:6379/13", "bench:")
            await store.set("pin:response:resp_bench", '{"channel":"c","owner":"t"}', 600)
            for together, label in ((False, "check after the followed id's record"),
                                    (True, "check with the followed id's record (one pipeline)")):
                await measure_follow_up(limiter, store, 200, together)
                waits = sorted(await measure_follow_up(limiter, store, args.requests, together))
                rows.append(f"| redis, {label} | {statistics.median(waits):.1f} | {waits[int(len(waits) * 0.99)]:.1f} "
                            f"| - | {'1' if together else '2'} before the upstream call |")
                print(rows[-1])
            await store.close()
        await limiter.close()
    update_section("ratelimit", "\n".join(rows).replace("PING_US", f"{statistics.median(pings[200:]):.0f}"))
    return 0


if __name__ == "__main__":
    from proxy.process.server import install_uvloop

    install_uvloop()  # as the gateway runs
    raise SystemExit(asyncio.run(main()))
