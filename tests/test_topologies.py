"""Shared state in every Redis topology: what `state.url` may name, and the pieces that must
keep to a Cluster's slots (the limiter's scripts, the webhook queue's shelves)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.crc import key_slot

from plugins.webhook_queue.queue import QueuedWebhook, Shelf, WebhookQueue
from proxy.config import ConfigError
from proxy.config.model import StateConfig
from proxy.ratelimits import Check, Kind, LimiterUnavailable
from proxy.ratelimits.redis import RedisLimiter
from proxy.registry import parse_config
from proxy.state.connect import Mode, connect, parse
from proxy.state.redis import RedisStore
from tests.conftest import free_port
from tests.redis_topologies import redis_server

CHAT = {"model": "msgmodel-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def chat_headers(key: str) -> dict[str, str]:
    return {"x-api-key": key, "msgapi-version": "2023-06-01"}


@pytest.mark.parametrize(
    ("url", "mode", "nodes", "master", "db"),
    [
        ("redis://127.0.0.1:6379/2", Mode.SINGLE, (), "", 0),
        ("unix:///run/redis.sock", Mode.SINGLE, (), "", 0),
        ("redis+sentinel://s1:26379,s2/main/3", Mode.SENTINEL, (("s1", 26379), ("s2", 26379)), "main", 3),
        ("rediss+sentinel://:pw@s1:1/main", Mode.SENTINEL, (("s1", 1),), "main", 0),
        ("redis+cluster://n1:7000,[::1]:7001,n3", Mode.CLUSTER, (("n1", 7000), ("::1", 7001), ("n3", 6379)), "", 0),
        ("rediss+cluster://n1:7000?ssl_ca_certs=/etc/ca.pem", Mode.CLUSTER, (("n1", 7000),), "", 0),
    ],
)
def test_state_url_names_one_topology(url: str, mode: Mode, nodes: tuple, master: str, db: int) -> None:
    topology = parse(url)
    assert (topology.mode, topology.nodes, topology.master, topology.db) == (mode, nodes, master, db)
    assert StateConfig(url=url).url == url


@pytest.mark.parametrize(
    "url",
    [
        "http://u:s3cret-pass@h:1",
        "redis+foo://u:s3cret-pass@h:1",
        "redis+cluster://u:s3cret-pass@h:1/4",
        "redis+sentinel://u:s3cret-pass@h:1",
        "redis+sentinel://u:s3cret-pass@h:1/main/x",
        "redis+cluster://u:s3cret-pass@h:port",
        "redis+cluster://u:s3cret-pass@h,,k",
        "redis+cluster://u:s3cret-pass@h:70000",
        "redis+cluster://u:s3c?ret-pass@h:x",
        "redis+cluster://u:s3c/ret-pass@h,",
        "redis+sentinel://u:s3c#ret-pass@h/m/x",
        "redis://u:s3cret-pass@h:6379/zero",
        "redis://u:s3cret-pass@h:99999/0",
        "redis+sentinel://u:s3cret-pass@h/0",
        "redis+sentinel://u:s3cret-pass@h/m?sentinel_pasword=x",
        "redis+cluster://u:s3cret-pass@h?sentinel_password=x",
        "redis+cluster://u:s3cret-pass@h?ssl_ca_certs=/etc/ca.pem",
    ],
)
def test_a_state_url_naming_no_topology_is_refused_without_quoting_its_password(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(f"state: {{backend: redis, url: '{url}'}}\nplugins: {{webhook_queue: {{url: '{url}'}}}}", {})
    assert [p.split(":")[0] for p in refused.value.problems] == ["state.url", "plugins.webhook_queue.url"]
    assert "s3cret" not in str(refused.value.problems)
    assert "s3cret" not in repr(parse("redis+sentinel://u:s3cret-pass@h:1/main"))


async def test_a_burst_past_the_pool_waits_its_turn_instead_of_failing(redis_url: str) -> None:
    """300 checks at once on one client: none is taken for an outage (which would fail open).
    Each may wait 5 s, not the default half second: a loaded test host's stall is not an outage."""
    limiter = RedisLimiter(redis_url, "burst:", wait_s=5)
    checks = [Check("key:k:rpm", "key-rpm", Kind.REQUESTS, 100, 60, subject="key:k")]
    try:
        found = await asyncio.gather(*(limiter.acquire(checks, f"r{i}") for i in range(300)))
    finally:
        await limiter.close()
    assert [d.allowed for d in found].count(True) == 100


async def test_calls_gathered_into_one_pipeline_survive_a_redis_that_forgot_its_scripts(lone_redis: str) -> None:
    """Under load the limiter's calls share pipelines; after a restart or failover Redis knows no
    script, and the gathered calls are answered all the same (loaded, then sent once more)."""
    import redis.asyncio as aioredis

    limiter = RedisLimiter(lone_redis, "gathered:")
    client = aioredis.Redis.from_url(lone_redis)
    checks = [Check("key:g:rpm", "key-rpm", Kind.REQUESTS, 150, 60, subject="key:g")]
    try:
        first = await asyncio.gather(*(limiter.acquire(checks, f"a{i}") for i in range(100)))
        await client.script_flush()
        second = await asyncio.gather(*(limiter.acquire(checks, f"b{i}") for i in range(100)))
        assert [d.allowed for d in first + second].count(True) == 150
        assert await client.zcard("gathered:rl:key:g:rpm") == 150
    finally:
        await limiter.close()
        await client.aclose()


async def _stalled(client: Any, stall_us: int) -> asyncio.Future[Any]:
    """Redis busy with one script for `stall_us` (it runs nothing else meanwhile); the future ends with it."""
    busy = (
        "local t0 = redis.call('TIME') repeat local t = redis.call('TIME') "
        f"until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > {stall_us} return 1"
    )
    blocking = asyncio.ensure_future(client.eval(busy, 0))
    await asyncio.sleep(0.1)  # it has started
    return blocking


async def _emptied(limiter: RedisLimiter, client: Any, key: str, within_s: float) -> None:
    """Wait (at most `within_s`) for the limiter to have made what it kept, and the sorted set at
    `key` to hold nothing. An empty set alone proves nothing: once a stall ends, Redis may serve
    the test's read before the late check that was waiting on another connection."""
    for _ in range(int(within_s / 0.02)):
        if not limiter._unsettled and await client.zcard(key) == 0:
            return
        await asyncio.sleep(0.02)


async def _warmed(limiter: RedisLimiter) -> None:
    """Connections open and the script loaded; what a loaded test host's stall fails here is tried
    again (the warm-up is no part of what is tested)."""
    for _ in range(20):
        try:
            await limiter.acquire([LEASE], "warm")
            await limiter.finish([LEASE], "warm", None)
            return
        except LimiterUnavailable:
            await asyncio.sleep(0.1)
    raise AssertionError("the limiter never answered its warm-up")


@pytest.mark.parametrize("stall_us", [900_000, 2_600_000])  # past the limiter's wait; past the client's timeout too
async def test_a_check_answered_too_late_is_given_back_once_it_has_run(lone_redis: str, stall_us: int) -> None:
    """A check that waits past the limiter's deadline lets the fail mode decide; when Redis then
    runs it, what it took (a lease, which would hold its slot until it lapsed) is given back."""
    import redis.asyncio as aioredis

    limiter = RedisLimiter(lone_redis, "late:")
    client = aioredis.Redis.from_url(lone_redis)
    try:
        await _warmed(limiter)
        blocking = await _stalled(client, stall_us)
        with pytest.raises(LimiterUnavailable):
            await limiter.acquire([LEASE, KEY], "late")
        await blocking
        await _emptied(limiter, client, "late:rl:key:k:concurrent", within_s=3)
        assert await client.zcard("late:rl:key:k:concurrent") == 0
        assert await client.zcard("late:rl:key:k:rpm") == 0
    finally:
        await limiter.close()
        await client.aclose()


async def test_a_check_waits_as_long_as_state_check_timeout_s_says(lone_redis: str) -> None:
    """`state.check_timeout_s` is the limiter's wait: a stall of most of a second, past the default
    half second, is waited out by a limiter told to wait a second and a half."""
    import redis.asyncio as aioredis

    limiter = RedisLimiter(lone_redis, "patient:", wait_s=1.5)
    client = aioredis.Redis.from_url(lone_redis)
    try:
        await _warmed(limiter)
        blocking = await _stalled(client, 900_000)
        assert (await limiter.acquire([LEASE, KEY], "patient")).allowed
        await blocking
        await limiter.finish([LEASE, KEY], "patient", None)
    finally:
        await limiter.close()
        await client.aclose()


async def test_a_check_whose_client_went_away_is_given_back_once_it_has_run(lone_redis: str) -> None:
    """A client that leaves while its check waits on Redis cancels the check, not what Redis does
    with it: the lease it takes then is given back, not held until it lapses."""
    import redis.asyncio as aioredis

    limiter = RedisLimiter(lone_redis, "gone:")
    client = aioredis.Redis.from_url(lone_redis)
    try:
        await _warmed(limiter)
        blocking = await _stalled(client, 400_000)
        check = asyncio.ensure_future(limiter.acquire([LEASE, KEY], "gone"))
        await asyncio.sleep(0.1)
        check.cancel()  # as aiohttp cancels the handler of a client that closed its connection
        with pytest.raises(asyncio.CancelledError):
            await check
        await blocking
        await _emptied(limiter, client, "gone:rl:key:k:concurrent", within_s=3)
        assert await client.zcard("gone:rl:key:k:concurrent") == 0
        assert await client.zcard("gone:rl:key:k:rpm") == 0
    finally:
        await limiter.close()
        await client.aclose()


async def test_a_give_back_that_reaches_redis_first_stops_the_check_that_comes_later(redis_url: str) -> None:
    """Connections do not keep each other's order: a give-back may run before the check it gives
    back. Its mark makes that check take nothing."""
    import redis.asyncio as aioredis

    limiter = RedisLimiter(redis_url, "mark:")
    client = aioredis.Redis.from_url(redis_url)
    try:
        await limiter._call_finish([LEASE, KEY], "early", "undo")
        assert not (await limiter.acquire([LEASE, KEY], "early")).allowed
        assert await client.zcard("mark:rl:key:k:concurrent") == 0 and await client.zcard("mark:rl:key:k:rpm") == 0
        assert (await limiter.acquire([LEASE, KEY], "another")).allowed  # the mark is the request's alone
        assert 0 < await client.pttl("mark:rl:undone:early") <= 60_000
    finally:
        await limiter.close()
        await client.aclose()


async def test_a_settlement_redis_could_not_take_is_made_once_it_can(lone_redis: str) -> None:
    """A stream that ends while Redis is away must not hold its lease (a concurrency slot) until it
    lapses: the limiter tries the settlement again every second until Redis takes it."""
    import redis.asyncio as aioredis

    limiter = RedisLimiter(lone_redis, "unsettled:")
    client = aioredis.Redis.from_url(lone_redis)
    try:
        assert (await limiter.acquire([LEASE], "streamed")).allowed
        assert (await limiter.acquire([LEASE], "unsent")).allowed
        blocking = await _stalled(client, 700_000)
        with pytest.raises(LimiterUnavailable):  # it may still run when Redis is free again
            await limiter.finish([LEASE], "streamed", None)
        limiter.finish_later([LEASE], "unsent", None)  # the store's probe said away: never sent but for the retry
        await blocking
        await _emptied(limiter, client, "unsettled:rl:key:k:concurrent", within_s=5)
        assert await client.zcard("unsettled:rl:key:k:concurrent") == 0
        assert not limiter._unsettled
    finally:
        await limiter.close()
        await client.aclose()


async def test_gathered_calls_all_hear_that_redis_is_away() -> None:
    limiter = RedisLimiter(f"redis://127.0.0.1:{free_port()}/0", "away:")
    checks = [Check("key:a:rpm", "key-rpm", Kind.REQUESTS, 10, 60, subject="key:a")]
    try:
        async with asyncio.timeout(5):
            found = await asyncio.gather(*(limiter.acquire(checks, f"r{i}") for i in range(50)), return_exceptions=True)
    finally:
        await limiter.close()
    assert all(isinstance(f, LimiterUnavailable) for f in found), {type(f).__name__ for f in found}


# A request's limits of three subjects: on a Cluster each lands in a slot of its own.
KEY = Check("key:k:rpm", "key-rpm", Kind.REQUESTS, 100, 60, subject="key:k")
TOKENS = Check("key:k:model:m:tpm", "key-model-tpm", Kind.TOKENS, 2000, 60, cost=400, subject="key:k:model:m")
ROUTE = Check("route:messages:rpm", "route-rpm", Kind.REQUESTS, 2, 60, subject="route:messages")
LEASE = Check("key:k:concurrent", "key-concurrent", Kind.CONCURRENT, 5, 0, subject="key:k")


def test_a_subjects_counters_share_a_slot_and_subjects_spread() -> None:
    limiter = RedisLimiter.__new__(RedisLimiter)
    limiter._prefix, limiter._by_slot = "mg:rl:", True
    slots = {c.subject: {key_slot(k.encode()) for k in limiter._keys([c], "r1")} for c in (KEY, TOKENS, ROUTE, LEASE)}
    assert all(len(s) == 1 for s in slots.values())  # every key of one subject (window, amounts, total)
    assert slots["key:k"] != slots["route:messages"] != slots["key:k:model:m"]


async def test_on_a_cluster_a_refusal_by_one_subject_gives_back_what_the_others_took(redis_cluster) -> None:
    redis_cluster.flush()
    limiter = RedisLimiter(redis_cluster.url, "mg:")
    client = connect(redis_cluster.url)
    checks = [KEY, TOKENS, LEASE, ROUTE]
    try:
        assert [(await limiter.acquire(checks, f"r{i}")).allowed for i in range(3)] == [True, True, False]
        refused = await limiter.acquire(checks, "r3")
        assert not refused.allowed and refused.check == ROUTE
        # The refused requests hold nothing: two requests' worth in each window, two leases.
        assert await client.zcard("mg:rl:{key:k}:rpm") == 2
        assert await client.zcard("mg:rl:{key:k}:concurrent") == 2
        assert int(await client.get("mg:rl:{key:k:model:m}:tpm:t")) == 800
        await limiter.finish(checks, "r0", 150)  # settled to what it spent; its lease released
        assert int(await client.get("mg:rl:{key:k:model:m}:tpm:t")) == 550
        assert await client.zcard("mg:rl:{key:k}:concurrent") == 1
    finally:
        await limiter.close()
        await client.aclose()


async def test_the_state_store_and_the_webhook_shelves_work_on_a_cluster(redis_cluster) -> None:
    redis_cluster.flush()
    store = RedisStore(redis_cluster.url, "mg:")
    queue = WebhookQueue(redis_cluster.url, "mg:")
    try:
        assert await store.add("pin:resp_1", "a", 60) and not await store.add("pin:resp_1", "b", 60)
        for n in range(3):
            await store.push("video:tasks:t", f"task{n}", 60, keep=2)
        assert await store.recent("video:tasks:t", 5) == ["task2", "task1"]
        keys = [queue.key(s) for s in Shelf] + [queue.counter(s) for s in Shelf] + [queue.key_lease]
        assert len({key_slot(key.encode()) for key in keys}) == 1
        for n in range(3):
            await queue.put(QueuedWebhook("POST", "/api/stripe/webhook", [], f"evt_{n}".encode(), f"r{n}"))
        first = await queue.oldest(block_ms=10)
        assert first is not None and first.body == b"evt_0"
        await queue.settle(first, "200", Shelf.DELIVERED)
        assert [w.body for w in await queue.entries(Shelf.PENDING)] == [b"evt_1", b"evt_2"]
        assert await queue.replay(Shelf.DELIVERED, None)
        assert await queue.depth(Shelf.PENDING) == 3
    finally:
        await store.close()
        await queue.close()


async def test_on_a_cluster_the_queue_delivers_with_its_clients_first_node_gone(tmp_path) -> None:
    """A node that is not the queue's fails: callbacks are still stored, read in order and settled,
    whichever node the client first knew (redis-py asks that one where XREAD's key lives)."""
    from tests.redis_topologies import Cluster

    cluster = await asyncio.to_thread(Cluster.start, tmp_path / "cluster", False)
    queue = WebhookQueue(cluster.url, "mg:")
    try:
        await queue.put(QueuedWebhook("POST", "/api/stripe/webhook", [], b"evt_0", "r0"))
        client = queue._client
        holder = (await client.node_for(queue.key(Shelf.PENDING))).port
        gone = next(port for port in cluster.ports if port != holder)
        client.set_default_node(client.get_node("127.0.0.1", gone))
        await asyncio.to_thread(cluster.processes.kill, gone)
        await queue.put(QueuedWebhook("POST", "/api/stripe/webhook", [], b"evt_1", "r1"))
        for expected in (b"evt_0", b"evt_1"):
            head = await queue.oldest(block_ms=10)
            assert head is not None and head.body == expected
            await queue.settle(head, "200", Shelf.DELIVERED)
    finally:
        await queue.close()
        await asyncio.to_thread(cluster.processes.stop)


async def test_on_a_cluster_the_store_is_away_while_any_primary_is_though_one_node_answers(tmp_path) -> None:
    """The probe behind /readyz and modelgate_state_store_up asks every primary: the node redis-py
    asks by itself answers PING while another's slots, and the keys in them, are unserved."""
    from tests.redis_topologies import Cluster

    cluster = await asyncio.to_thread(Cluster.start, tmp_path / "cluster", False)
    store = RedisStore(cluster.url, "mg:")
    try:
        assert await store.ping()
        default = store._shared.client.get_default_node().port
        await asyncio.to_thread(cluster.processes.kill, next(p for p in cluster.ports if p != default))
        with pytest.raises(Exception):  # noqa: B017 (the probe takes whatever the client raises for away)
            await store.ping()
    finally:
        await store.close()
        await asyncio.to_thread(cluster.processes.stop)


async def test_a_callback_no_replica_confirmed_is_refused_but_kept(lone_redis: str) -> None:
    """`replica_acks` on a server without replicas: the add happens (and is delivered, at least once),
    but the provider is told to retry; so too after Redis forgot the queue's script."""
    import redis.asyncio as aioredis

    from plugins.webhook_queue.queue import QueueUnsafe

    queue = WebhookQueue(lone_redis, "unsafe:", replica_acks=1, replica_wait_s=0.05)
    client = aioredis.Redis.from_url(lone_redis)
    try:
        for n in range(2):
            with pytest.raises(QueueUnsafe):
                await queue.put(QueuedWebhook("POST", "/api/stripe/webhook", [], f"evt_{n}".encode(), "r"))
            await client.script_flush()
        assert [w.body for w in await queue.entries(Shelf.PENDING)] == [b"evt_0", b"evt_1"]
    finally:
        await queue.close()
        await client.aclose()


async def test_off_a_cluster_keys_keep_the_names_an_older_release_reads(redis_url: str) -> None:
    """During an upgrade on one server or under Sentinel, old and new instances count in the same
    windows and share one webhook queue: the hash tags are a Cluster's alone."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    limiter = RedisLimiter(redis_url, "old:")
    queue = WebhookQueue(redis_url, "old:")
    try:
        await limiter.acquire([KEY, TOKENS], "r1")
        assert (
            await client.zcard("old:rl:key:k:rpm") == 1 and int(await client.get("old:rl:key:k:model:m:tpm:t")) == 400
        )
        await queue.put(QueuedWebhook("POST", "/api/stripe/webhook", [], b"evt", "r"))
        assert await client.xlen("old:webhooks:pending") == 1 and queue.key_lease == "old:webhooks:lease"
    finally:
        await limiter.close()
        await queue.close()
        await client.aclose()


async def test_a_cluster_that_never_answers_leaves_the_gateway_serving_per_the_fail_mode(start_gateway) -> None:
    """No node answers from the start: the gateway starts, says so on /readyz, serves chat with limits
    failing open, and answers webhooks 503: never a 500."""
    dead = f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    gw = await start_gateway(f"""
state: {{backend: redis, url: "{dead}"}}
keys: [{{name: k, key: cluster-down-key, limits: {{rpm: 5}}}}]
channels: [{{name: sim, base_url: simulator}}]
plugins: {{ratelimit: {{fail: open}}, webhook_queue: {{enabled: true}}}}
""")
    async with aiohttp.ClientSession() as http:
        async with http.get(gw.admin + "/readyz") as ready:
            assert ready.status == 200 and (await ready.json())["state_store"] == "unreachable"
        chats = []
        for _ in range(8):
            async with http.post(gw.url + "/v1/messages", json=CHAT, headers=chat_headers("cluster-down-key")) as a:
                chats.append(a.status)
        async with http.post(gw.url + "/api/stripe/webhook", data=b"{}") as answer:
            webhook = answer.status
    assert chats == [200] * 8 and webhook == 503


@pytest.mark.parametrize(
    ("yaml_text", "problem"),
    [
        ("state: {backend: redis, url: 'redis+cluster://h:7000', prefix: 'mg{1}:'}", "state: prefix: no { or }"),
        (
            "state: {backend: redis, url: 'redis+cluster://h:7000'}\nplugins: {webhook_queue: {prefix: 'q{'}}",
            "plugins.webhook_queue.prefix: no { or }",
        ),
        (
            "state: {backend: redis, url: 'redis+cluster://h:7000'}\nplugins: {webhook_queue: {replica_acks: 1}}",
            "plugins.webhook_queue.replica_acks: a Redis Cluster takes 0 only",
        ),
        (
            "plugins: {webhook_queue: {url: 'redis+cluster://h:x', replica_acks: 1}}",
            "plugins.webhook_queue.url: value error, a port that is not a number",
        ),
    ],
)
def test_a_cluster_config_that_cannot_keep_to_its_slots_is_refused(yaml_text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(yaml_text, {})
    assert any(p.startswith(problem) for p in refused.value.problems), refused.value.problems


FAILOVER_CONFIG = """
server: {{listen: "127.0.0.1:{{PORT}}", workers: 1}}
state: {{backend: redis, url: "{url}"}}
keys:
  - {{name: busy, key: failover-key-busy, limits: {{rpm: 100000}}}}
  - {{name: later, key: failover-key-later, limits: {{rpm: 5}}}}
channels:
  - {{name: sim, base_url: "{sim}", formats: [messages]}}
  - {{name: accounts, base_url: "http://127.0.0.1:{accounts}", formats: [account]}}
plugins:
  ratelimit: {{fail: open}}
  webhook_queue: {{enabled: true, backoff_s: 0.05, max_backoff_s: 0.5, lease_s: 2}}
observability: {{logging: {{access_log: false}}}}
"""


async def test_a_sentinel_failover_mid_load_keeps_serving_and_loses_no_accepted_webhook(spawn, tmp_path) -> None:
    """The primary dies under load: chat goes on (limits fail open meanwhile), the gateways find the new
    primary by themselves, and every webhook answered 200 reaches the backend."""
    from tests.redis_topologies import SentinelSetup
    from tests.test_webhook_queue import SIGNED, Backend

    setup = await asyncio.to_thread(SentinelSetup.start, tmp_path / "sentinel", 2)
    backend = Backend(free_port())
    await backend.start()
    try:
        sim = spawn("simulator", "--chunk-delay-ms", "0")
        text = FAILOVER_CONFIG.format(url=setup.url, sim=sim.url, accounts=backend.port)
        started = [spawn("gateway", config=text) for _ in range(2)]
        gateways = [gateway.url for gateway in started]
        chats: list[int] = []
        accepted: list[bytes] = []
        refused: list[int] = []
        stop = asyncio.Event()

        async def load(http: aiohttp.ClientSession, lane: int) -> None:
            n = 0
            while not stop.is_set():
                url = gateways[(lane + n) % 2]
                async with http.post(url + "/v1/messages", json=CHAT, headers=chat_headers("failover-key-busy")) as a:
                    await a.read()
                    chats.append(a.status)
                body = json.dumps({"id": f"evt_{lane}_{n}", "type": "invoice.paid"}).encode()
                async with http.post(url + "/api/stripe/webhook", data=body, headers=SIGNED) as a:
                    await a.read()
                    (accepted.append(body) if a.status == 200 else refused.append(a.status))
                n += 1
                await asyncio.sleep(0.01)

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            lanes = [asyncio.create_task(load(http, lane)) for lane in range(4)]
            await asyncio.sleep(1.5)
            before = len(accepted)
            old = await asyncio.to_thread(setup.kill_primary)
            async with asyncio.timeout(30):
                while (await asyncio.to_thread(setup.current_primary)) == old:
                    await asyncio.sleep(0.1)
                during = len(accepted)
                while len(accepted) < during + 20:
                    await asyncio.sleep(0.1)  # the new primary takes webhooks again
            stop.set()
            await asyncio.gather(*lanes)

            assert before > 0 and set(chats) == {200}, sorted(set(chats))  # served all along, limits failing open
            assert set(refused) <= {503}
            lost = set(accepted)  # duplicates may come (delivery is at least once); losses may not
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    while lost := lost - {body for _, _, body in backend.received}:
                        await asyncio.sleep(0.1)
            assert not lost, f"{len(lost)} of {len(accepted)} webhooks answered 200 never reached the backend"

            async with asyncio.timeout(10):  # each gateway's probe finds the store again by itself
                for gateway in started:
                    while (await (await http.get(gateway.admin + "/readyz")).json())["state_store"] != "ok":
                        await asyncio.sleep(0.1)
            later = []
            for n in range(8):  # the limiter found the new primary: a fresh key's limit holds exactly
                async with http.post(
                    gateways[n % 2] + "/v1/messages", json=CHAT, headers=chat_headers("failover-key-later")
                ) as answer:
                    later.append(answer.status)
            assert later.count(200) == 5 and later.count(429) == 3
            for url in gateways:
                async with http.get(url + "/readyz") as ready:
                    assert ready.status == 200
    finally:
        await backend.stop()
        setup.processes.stop()


def _certificates(work: Path) -> None:
    """A CA of its own and a certificate it signed for 127.0.0.1, as a managed Redis has."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=modelgate-test-ca",
    )
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "redis.key", "-out", "redis.csr", "-subj", "/CN=127.0.0.1"
    )
    (work / "san").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "redis.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "redis.crt",
        "-days",
        "2",
        "-extfile",
        "san",
    )


async def test_state_over_tls_with_a_ca_of_its_own(start_gateway, http, tmp_path) -> None:
    """`rediss://...?ssl_ca_certs=`: limits and a response chain kept in a Redis reached over TLS
    whose certificate chains to a private CA; without that CA the store is away, never trusted."""
    _certificates(tmp_path)
    port = free_port()
    redis = subprocess.Popen(
        redis_server(
            0,
            tmp_path,
            *("--tls-port", str(port), "--tls-cert-file", "redis.crt", "--tls-key-file", "redis.key"),
            *("--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"),
        ),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"rediss://127.0.0.1:{port}/0"
        channels = "channels: [{name: simulator, base_url: simulator, simulator: {chunk_delay_ms: 0}}]"
        keys = "keys: [{name: tls, key: tls-key-0123, limits: {rpm: 3}}]"
        gw = await start_gateway(
            f'state: {{backend: redis, url: "{base}?ssl_ca_certs={tmp_path}/ca.crt"}}\n{keys}\n{channels}\n'
        )
        bearer = {"Authorization": "Bearer tls-key-0123"}
        async with http.get(gw.url + "/readyz") as ready:
            assert ready.status == 200, await ready.text()
        async with http.post(
            gw.url + "/v1/responses", json={"model": "respmodel-4o", "input": "hi"}, headers=bearer
        ) as made:
            assert made.status == 200, await made.text()
            first = (await made.json())["id"]
        follow = {"model": "respmodel-4o", "input": "and?", "previous_response_id": first}
        statuses = []
        for _ in range(3):
            async with http.post(gw.url + "/v1/responses", json=follow, headers=bearer) as answer:
                statuses.append(answer.status)
        assert statuses == [200, 200, 429]  # the chain followed, and the window counted, in the TLS Redis
        untrusting = await start_gateway(f'state: {{backend: redis, url: "{base}"}}\n{keys}\n{channels}\n')
        assert not untrusting.owner.probe.ok  # the server's certificate is not trusted: the store is away
        for _ in range(2):  # and the fail mode (open) serves, counting nothing in it
            async with http.post(
                untrusting.url + "/v1/responses", json={"model": "respmodel-4o", "input": "hi"}, headers=bearer
            ) as answer:
                assert answer.status == 200
    finally:
        redis.terminate()
        redis.wait(timeout=10)
