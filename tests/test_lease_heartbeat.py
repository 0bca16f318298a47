"""Leases owned by live processes: a concurrency lease is renewed by the process that holds it,
so one whose holder died (kill -9) is reclaimed within seconds, in every Redis topology."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from pathlib import Path

import aiohttp
import pytest

import proxy.ratelimits.redis
from proxy.ratelimits import Check, Kind
from proxy.ratelimits.heartbeat import LEASE_LIFE_S, RENEW_EVERY_S, Heartbeat
from proxy.ratelimits.redis import RedisLimiter
from proxy.state.connect import connect
from tests.conftest import REDIS_URL

KEY = "leased-key-0001"
LIMIT = 10
MSG = {"x-api-key": KEY, "msgapi-version": "2023-06-01"}
# A stream of 400 events 250 ms apart: it holds its lease far longer than any test here runs.
SLOW = {**MSG, "x-sim-chunk-delay-ms": "250", "x-sim-output-tokens": "400"}
STREAM = {
    "model": "msgmodel-haiku-4-5",
    "max_tokens": 400,
    "stream": True,
    "messages": [{"role": "user", "content": "a long story"}],
}
REFUSED = "rate limit 'key-concurrent'"


def gateway_config(state_url: str, upstream_url: str, workers: int) -> str:
    return f"""
server: {{listen: "127.0.0.1:{{PORT}}", workers: {workers}}}
state: {{backend: redis, url: "{state_url}", prefix: "heartbeat:"}}
observability: {{logging: {{access_log: false}}}}
keys: [{{name: leased, key: {KEY}, limits: {{concurrent: {LIMIT}}}}}]
channels: [{{name: up, base_url: "{upstream_url}"}}]
"""


async def open_stream(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse | None:
    """A stream under way (its answer left open, its lease held), or None when the key's
    concurrency refused it. A connection the killed worker had taken (queued on its socket, or
    kept alive) is tried again, as a client would."""
    for _ in range(5):
        try:
            answer = await http.post(url + "/v1/messages", json=STREAM, headers=SLOW)
            break
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    else:
        raise AssertionError("no worker took the request")
    if answer.status == 200:
        return answer
    message = (await answer.json())["error"]["message"]
    answer.release()
    assert answer.status == 429 and REFUSED in message, message
    return None


async def refused(http: aiohttp.ClientSession, url: str) -> bool:
    stream = await open_stream(http, url)
    if stream is not None:
        stream.close()
    return stream is None


def worker_of(answer: aiohttp.ClientResponse, gateway_port: int, workers: list[int]) -> int:
    """The worker serving `answer`: the one holding the socket whose peer is the client's end."""
    assert answer.connection is not None and answer.connection.transport is not None
    client_port = answer.connection.transport.get_extra_info("sockname")[1]
    wanted = f"0100007F:{gateway_port:04X} 0100007F:{client_port:04X}"
    inode = next(
        line.split()[9]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if " ".join(line.split()[1:3]) == wanted
    )
    for pid in workers:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:  # closed meanwhile
                continue
    raise LookupError(f"no worker holds the connection from port {client_port}")


# Lease lives short enough to outlive several times over within a test, renewed five times a life;
# a second, not half of one: an in-process gateway's loop held up on a loaded CI host (three test
# processes, each with gateways of its own) let a half-second lease lapse now and then.
LIFE_S, EVERY_S = 1.0, 0.2


async def test_a_stream_held_past_several_lease_lives_keeps_counting(start_gateway, shared_redis, monkeypatch) -> None:
    """Renewal works: a stream lasting six lease lives holds its slot to the end, then frees it."""
    monkeypatch.setattr(
        proxy.ratelimits.redis,
        "RedisLimiter",
        functools.partial(RedisLimiter, lease_life_s=LIFE_S, renew_every_s=EVERY_S),
    )
    gw = await start_gateway(f"""
state: {{backend: redis, url: "{shared_redis}", prefix: "renewed:"}}
keys: [{{name: leased, key: {KEY}, limits: {{concurrent: 1}}}}]
channels: [{{name: sim, base_url: simulator}}]
""")
    async with aiohttp.ClientSession() as http:
        started = time.monotonic()
        stream = await http.post(
            gw.url + "/v1/messages",
            json=STREAM,
            headers={**MSG, "x-sim-chunk-delay-ms": "100", "x-sim-output-tokens": "60"},
        )
        assert stream.status == 200
        while time.monotonic() - started < 4 * LIFE_S:
            await asyncio.sleep(0.2)
            assert await refused(http, gw.url)
        await stream.read()  # six seconds: six lives
        assert time.monotonic() - started > 6 * LIFE_S
        deadline = time.monotonic() + 2  # the client reads the end a moment before the gateway releases
        while await refused(http, gw.url):
            assert time.monotonic() < deadline, "the slot was never freed"
            await asyncio.sleep(0.05)


LEASE = Check("key:k:concurrent", "key-concurrent", Kind.CONCURRENT, 100, 0, subject="key:k")


async def test_a_released_lease_is_never_put_back_by_a_renewal_racing_its_release(shared_redis: str) -> None:
    """A round's leases are read before their release, and the renewal and the release reach
    Redis in either order (on a Cluster, over connections of their own): none comes back."""
    limiter = RedisLimiter(shared_redis, "race:", lease_life_s=60, renew_every_s=60)  # no round of its own
    client = connect(shared_redis)
    lease_set = limiter._window(LEASE)
    try:
        for i in range(40):
            assert (await limiter.acquire([LEASE], f"r{i}")).allowed
        for i in range(40):
            round_of = {s: list(ids) for s, ids in limiter._heartbeat.held.items()}  # read before the release
            release = limiter.finish([LEASE], f"r{i}", None)
            renewal = limiter._renew(round_of)
            found = await asyncio.gather(*((release, renewal) if i % 2 else (renewal, release)))
            assert f"r{i}" not in limiter._heartbeat.held.get(lease_set, ())
            assert await client.zscore(lease_set, f"r{i}") is None, i
            gone = found[0 if i % 2 == 0 else 1]
            assert set(gone) <= {(lease_set, f"r{i}")}  # found gone only when the release came first
        assert await client.exists(lease_set) == 0 and not limiter._heartbeat.held
    finally:
        await limiter.close()
        await client.aclose()


async def test_a_lease_whose_holder_stops_renewing_lapses_and_one_renewed_does_not(shared_redis: str) -> None:
    """Two holders of one key's leases; one stops renewing (as a killed process does). Its lease
    lapses within a life; the other's, renewed, outlives several, through a Redis that forgot its
    scripts (a restart or a failover) meanwhile where the server is the tests' own (the Cluster and
    the Sentinel-named primary; the one server every test process shares keeps its scripts)."""
    one = Check("key:k:concurrent", "key-concurrent", Kind.CONCURRENT, 2, 0, subject="key:k")
    alive = RedisLimiter(shared_redis, "lapse:", lease_life_s=LIFE_S, renew_every_s=EVERY_S)
    dead = RedisLimiter(shared_redis, "lapse:", lease_life_s=LIFE_S, renew_every_s=EVERY_S)
    client = connect(shared_redis)
    try:
        assert (await alive.acquire([one], "alive")).allowed and (await dead.acquire([one], "dead")).allowed
        await dead._heartbeat.close()  # renews no more; its lease is not released
        assert not (await alive.acquire([one], "third")).allowed
        await asyncio.sleep(LIFE_S / 2)
        if shared_redis != REDIS_URL:
            await client.script_flush()
        deadline = time.monotonic() + 4 * LIFE_S
        while not (await alive.acquire([one], "third")).allowed:
            assert time.monotonic() < deadline, "the dead holder's lease never lapsed"
            await asyncio.sleep(EVERY_S)
        await asyncio.sleep(4 * LIFE_S)
        assert not (await alive.acquire([one], "fourth")).allowed  # "alive" and "third", both renewed
        assert await client.zcard(alive._window(one)) == 2
    finally:
        await alive.close()
        await dead.close()
        await client.aclose()


async def test_a_round_redis_cannot_take_is_made_up_by_the_next(caplog: pytest.LogCaptureFixture) -> None:
    """A blip fails rounds, never the heartbeat: it says so once, renews again when Redis is back,
    and forgets (saying so) a lease found gone while its request runs."""
    answers: list[object] = [ConnectionError("away"), ConnectionError("away"), [], [("set", "b")]]
    rounds: list[dict[str, list[str]]] = []

    async def renew(held: dict[str, list[str]]) -> list[tuple[str, str]]:
        rounds.append(held)
        answer = answers.pop(0) if answers else []
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    heartbeat = Heartbeat(renew, life_s=LIFE_S, every_s=0.01)
    caplog.set_level(logging.INFO, "modelgate.ratelimit")
    heartbeat.hold("set", "a")
    heartbeat.hold("set", "b")
    while answers:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("could not renew" in m for m in messages) == 1
    assert sum("renewed again" in m for m in messages) == 1
    assert any("lapsed while their requests ran" in m for m in messages)
    assert heartbeat.held == {"set": {"a"}}  # the lapsed one is renewed no more
    heartbeat.release("set", "a")
    await asyncio.sleep(0.05)
    assert heartbeat._beating is not None and heartbeat._beating.done()  # nothing held: no task runs
    await heartbeat.close()


async def test_an_older_release_s_lease_keeps_its_set_alive(redis_url: str) -> None:
    """During an upgrade, instances of the older release hold 30-minute leases in the same set:
    taking and renewing a short one never shortens the set's own expiry under them."""
    limiter = RedisLimiter(redis_url, "mixed:", lease_life_s=LIFE_S, renew_every_s=EVERY_S)
    client = connect(redis_url)
    lease_set = limiter._window(LEASE)
    try:
        seconds, _ = await client.time()
        await client.zadd(lease_set, {"older": (seconds + 1800) * 1000})
        await client.pexpire(lease_set, 1_800_000)
        assert (await limiter.acquire([LEASE], "newer")).allowed
        await asyncio.sleep(3 * EVERY_S)  # renewed meanwhile
        assert await client.pttl(lease_set) > 1_700_000
        await limiter.finish([LEASE], "newer", None)
        assert await client.zrange(lease_set, 0, -1) == [b"older"]
    finally:
        await limiter.close()
        await client.aclose()


@pytest.mark.parametrize("by_slot", [False, True])
def test_a_round_s_calls_carry_a_bounded_number_of_leases_and_one_slot_each(by_slot: bool) -> None:
    from redis.crc import key_slot

    limiter = RedisLimiter.__new__(RedisLimiter)
    limiter._by_slot, limiter._lease_ms = by_slot, 6000
    held = {
        "{key:a}:concurrent": [f"a{i}" for i in range(1200)],
        "{key:b}:concurrent": ["b0"],
        "{key:c}:concurrent": ["c0", "c1"],
    }
    calls = limiter._renewals(held)
    renewed: dict[str, list[str]] = {}
    for keys, args in calls:
        assert args[0] == 6000 and len(args) - 1 - len(keys) <= 500
        assert len(keys) == len(set(keys))
        if by_slot:
            assert len({key_slot(k.encode()) for k in keys}) == 1
        at = 1
        for key in keys:
            renewed.setdefault(key, []).extend(args[at + 1 : at + 1 + args[at]])
            at += 1 + args[at]
        assert at == len(args)
    assert renewed == held
    assert len(calls) == (5 if by_slot else 3)


def test_the_lease_life_reclaims_within_ten_seconds_and_forgives_a_late_holder() -> None:
    """Reclaimed with seconds to spare; three rounds may fail or come late (a Redis blip, a
    stalled event loop) before a live holder's lease lapses."""
    assert LEASE_LIFE_S <= 10 - 3 and LEASE_LIFE_S // RENEW_EVERY_S - 1 >= 3
