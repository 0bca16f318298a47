"""The webhook route takes anyone's bytes without a key: what they may leave in the shared Redis is
bounded per body (413), per shelf in bytes (503 on `pending`, the oldest dropped from the settled
shelves) and per client IP (429), queue on or off, and keyed traffic does not notice."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from plugins.webhook_queue.queue import Backlog, Bounds, QueuedWebhook, QueueFull, Shelf, WebhookQueue
from tests.conftest import MESSAGE_HEADERS
from tests.test_webhook_queue import SIGNED, Backend, backend  # noqa: F401 (the fixture, shared)

MB = 1024 * 1024
FIVE_MB = b"x" * (5 * MB)
CHAT = {"model": "msgmodel-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
ABUSER = {**SIGNED, "X-Forwarded-For": "203.0.113.7"}
PROVIDER = {**SIGNED, "X-Forwarded-For": "198.51.100.1"}


def bounded_config(backend_port: int, redis_url: str, queue: str = "", extra: str = "") -> str:
    return f"""
state: {{url: '{redis_url}'}}
channels:
  - {{name: accounts, base_url: 'http://127.0.0.1:{backend_port}', formats: [account]}}
  - {{name: simulator, base_url: simulator, formats: [messages]}}
resilience: {{breaker_open_s: 0.1}}
plugins:
  webhook_queue: {{enabled: true, prefix: 'bounded:', backoff_s: 0.05, max_backoff_s: 0.2{queue}}}
  ratelimit: {{trusted_proxies: ['127.0.0.1/32']}}
{extra}
"""


async def post(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    """A webhook's status and JSON answer; (0, {}) when the gateway closed before answering (it may,
    for a body it refused unread)."""
    try:
        async with http.post(f"{url}/api/stripe/webhook", data=body, headers=headers) as answer:
            found = await answer.json(content_type=None)
            return answer.status, {"json": found, "retry_after": answer.headers.get("Retry-After")}
    except aiohttp.ClientError:
        return 0, {}


async def flood(http: aiohttp.ClientSession, url: str, count: int, at_once: int = 4) -> list[tuple[int, dict]]:
    """`count` anonymous 5 MB posts from one address, `at_once` in flight."""
    slots = asyncio.Semaphore(at_once)

    async def one() -> tuple[int, dict]:
        async with slots:
            return await post(http, url, FIVE_MB, ABUSER)

    return await asyncio.gather(*(one() for _ in range(count)))


async def queue_memory(redis_url: str, prefix: str) -> int:
    """What the queue's keys take in Redis, every node of every stream counted (SAMPLES 0)."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        total = 0
        for key in await client.keys(f"{prefix}webhooks:*"):
            total += await client.memory_usage(key, samples=0) or 0
        return total
    finally:
        await client.aclose()


async def chat(http: aiohttp.ClientSession, url: str) -> int:
    async with http.post(url + "/v1/messages", json=CHAT, headers=MESSAGE_HEADERS) as answer:
        await answer.read()
        return answer.status


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_hundred_anonymous_5mb_webhooks_are_413s_and_leave_nothing_in_redis(
    start_gateway: Callable, http: aiohttp.ClientSession, backend: Backend, redis_url: str
) -> None:  # noqa: F811
    """The defaults: a webhook body over 1 MB is a 413 in the account shape before it is read or
    stored; keyed chat goes on meanwhile; a payment callback of a few KB is stored and delivered."""
    await backend.start()
    gw = await start_gateway(bounded_config(backend.port, redis_url))
    refused_before = metric("modelgate_webhooks_refused_total", reason="too_large")
    answers, chats = await asyncio.gather(
        flood(http, gw.url, 100), asyncio.gather(*(chat(http, gw.url) for _ in range(5)))
    )
    answered = [(status, found) for status, found in answers if status]
    assert chats == [200] * 5
    assert {status for status, _ in answered} == {413} and len(answered) == 100, [s for s, _ in answers]
    error = answered[0][1]["json"]["error"]
    assert "over the 1048576-byte limit" in error["message"] and error["type"] == "invalid_request_error"
    assert metric("modelgate_webhooks_refused_total", reason="too_large") - refused_before == len(answered)
    assert backend.received == [] and await queue_memory(redis_url, "bounded:") < 64 * 1024

    event = json.dumps({"id": "evt_paid", "type": "invoice.paid"}).encode()
    status, found = await post(http, gw.url, event, PROVIDER)
    assert status == 200 and found["json"]["queued"] is True
    await backend.wait_for(1)
    assert backend.received[0][2] == event


async def test_the_shelves_hold_their_bytes_whatever_is_posted_and_the_ip_rate_bites(
    start_gateway: Callable, http: aiohttp.ClientSession, backend: Backend, redis_url: str
) -> None:  # noqa: F811
    """Bodies allowed up to 6 MB, the pending shelf 12 MB, the delivered 6 MB, 50 a minute from one
    address: of a hundred 5 MB posts two are stored, the rest are 503 (queue full: the provider
    retries) until the address's rate is spent, then 429; Redis holds the bounds and no more."""
    gw = await start_gateway(
        bounded_config(
            backend.port,
            redis_url,
            ", max_pending_mb: 12, keep_delivered_mb: 6",
            "  # and a body limit raised to let 5 MB in\nroutes: {payment_webhook: {max_body_mb: 6}}",
        ).replace("ratelimit: {", "ratelimit: {per_ip: {payment_webhook: {rpm: 50}}, ")
    )
    full_before = metric("modelgate_webhooks_queued_total", outcome="full")
    answers, chats = await asyncio.gather(
        flood(http, gw.url, 100, at_once=1), asyncio.gather(*(chat(http, gw.url) for _ in range(5)))
    )
    statuses = [status for status, _ in answers]
    assert chats == [200] * 5
    # The first 50 are within the rate whatever the time they take; the rest are over it (if the
    # machine is slow enough for the minute to pass meanwhile, some of those meet the full queue).
    assert statuses[:50] == [200] * 2 + [503] * 48
    assert 429 in statuses[50:] and set(statuses[50:]) <= {429, 503}
    full, limited = answers[2][1], answers[statuses.index(429)][1]
    assert full["json"]["error"]["code"] == "webhook_queue_full" and full["retry_after"]
    assert "12582912 bytes" in full["json"]["error"]["message"]
    assert limited["json"]["error"]["code"] == "rate_limited" and int(limited["retry_after"]) >= 1
    assert metric("modelgate_webhooks_queued_total", outcome="full") - full_before == statuses.count(503)
    held = await queue_memory(redis_url, "bounded:")
    assert 10 * MB < held <= 12 * MB + 64 * 1024, held

    # The provider, at its own address, is not limited by the abuser's rate, and its callback of a
    # few KB still fits where another 5 MB would not: stored, and delivered once the backend is up.
    event = json.dumps({"id": "evt_paid", "type": "invoice.paid"}).encode()
    assert (await post(http, gw.url, event, PROVIDER))[0] == 200
    trimmed_before = metric("modelgate_webhooks_trimmed_total", shelf="delivered")
    await backend.start()
    await backend.wait_for(3)
    assert [len(body) for _, _, body in backend.received] == [5 * MB, 5 * MB, len(event)]
    assert backend.received[2][2] == event
    queue = WebhookQueue(redis_url, "bounded:")
    try:
        for _ in range(100):
            if await queue.depth(Shelf.PENDING) == 0:
                break
            await asyncio.sleep(0.02)
        # The delivered shelf keeps 6 MB: the first 5 MB delivery made way for the second.
        delivered = await queue.entries(Shelf.DELIVERED)
        assert [len(w.body) for w in delivered] == [5 * MB, len(event)]
        assert (await queue.backlog(Shelf.DELIVERED)).bytes <= 6 * MB
        assert (await queue.backlog(Shelf.PENDING)).bytes == 0
    finally:
        await queue.close()
    assert metric("modelgate_webhooks_trimmed_total", shelf="delivered") - trimmed_before == 1
    assert await queue_memory(redis_url, "bounded:") <= 6 * MB + 64 * 1024


async def test_with_the_queue_off_the_body_cap_and_the_ip_rate_still_hold(
    start_gateway: Callable, http: aiohttp.ClientSession, backend: Backend, redis_url: str
) -> None:  # noqa: F811
    await backend.start()
    gw = await start_gateway(
        bounded_config(backend.port, redis_url)
        .replace("enabled: true", "enabled: false")
        .replace("ratelimit: {", "ratelimit: {per_ip: {payment_webhook: {rpm: 3}}, ")
    )
    chunked_status = 0

    async def trickle():  # (no Content-Length: refused once 1 MB has passed)
        for _ in range(8):
            yield b"y" * (256 * 1024)

    try:
        async with http.post(gw.url + "/api/stripe/webhook", data=trickle(), headers=ABUSER) as answer:
            chunked_status = answer.status
            assert answer.headers["Content-Type"].startswith("application/json")
    except aiohttp.ClientError:
        pytest.fail("a chunked body over the cap is answered, not cut")
    assert chunked_status == 413
    statuses = [(await post(http, gw.url, b'{"id":"evt"}', ABUSER))[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert len(backend.received) == 3
    assert (await post(http, gw.url, b'{"id":"evt"}', PROVIDER))[0] == 200  # another address, its own rate


async def test_two_instances_fill_the_pending_shelf_to_its_bytes_exactly(redis_url: str) -> None:
    """Bytes as stored (every field name and value), counted beside the stream by the script that
    adds: two instances adding at once overfill it by nothing."""
    bounds = Bounds(max_pending_bytes=1 * MB)
    first, second = WebhookQueue(redis_url, "race:", bounds), WebhookQueue(redis_url, "race:", bounds)
    body = b"z" * (100 * 1024)
    try:

        async def put(queue: WebhookQueue, n: int) -> bool:
            try:
                await queue.put(
                    QueuedWebhook(
                        "POST", "/api/stripe/webhook", [("Stripe-Signature", "t=1")], body, f"r{n:02d}", received_at=1.5
                    )
                )
                return True
            except QueueFull:
                return False

        stored = await asyncio.gather(*(put(first if n % 2 else second, n) for n in range(30)))
        entries = await first.entries(Shelf.PENDING, 100)
        size = sum(len(k) + len(v if isinstance(v, bytes) else v.encode()) for k, v in entries[0].fields().items())
        assert sum(stored) == len(entries) == MB // size
        assert (await first.backlog()).bytes == len(entries) * size
    finally:
        await first.close()
        await second.close()


async def test_settled_shelves_drop_their_oldest_past_their_bytes_and_replay_keeps_the_pending_bound(
    redis_url: str,
) -> None:
    bounds = Bounds(max_pending_bytes=300 * 1024, keep_delivered_bytes=300 * 1024, keep_dead_bytes=150 * 1024)
    queue = WebhookQueue(redis_url, "shelves:", bounds)
    client = aioredis.Redis.from_url(redis_url)
    try:
        for n in range(3):
            await queue.put(QueuedWebhook("POST", "/api/stripe/webhook", [], bytes([65 + n]) * (90 * 1024), f"r{n}"))
        with pytest.raises(QueueFull, match="307200 bytes"):
            await queue.put(QueuedWebhook("POST", "/api/stripe/webhook", [], b"D" * (90 * 1024), "r3"))
        dropped = []
        for shelf in (Shelf.DEAD, Shelf.DEAD, Shelf.DELIVERED):
            head = await queue.oldest(block_ms=10)
            assert head is not None
            dropped.append(await queue.settle(head, "400" if shelf is Shelf.DEAD else "200", shelf))
            assert await queue.settle(head, "again", shelf) == -1  # settled once, whoever tries again
        assert dropped == [0, 1, 0]  # the second dead entry pushed the first out
        assert [w.body[:1] for w in await queue.entries(Shelf.DEAD)] == [b"B"]
        assert (await queue.backlog(Shelf.PENDING)).bytes == 0
        dead = await queue.backlog(Shelf.DEAD)
        assert dead.entries == 1 and 90 * 1024 < dead.bytes <= 150 * 1024

        # A counter lost (or a shelf an older release wrote) is seeded from Redis's estimate of the
        # stream's memory, which errs high; it is exact again once the shelf has emptied (below).
        await client.delete(queue.counter(Shelf.DEAD))
        seeded = await queue.backlog(Shelf.DEAD)
        assert seeded.entries == 1 and dead.bytes <= seeded.bytes < dead.bytes + 64 * 1024
        # Replay goes through the pending shelf's bounds too.
        await queue.put(QueuedWebhook("POST", "/api/stripe/webhook", [], b"E" * (250 * 1024), "r4"))
        with pytest.raises(QueueFull):
            await queue.replay(Shelf.DEAD, None)
        assert (await queue.backlog(Shelf.DEAD)).entries == 1  # not taken off its shelf
        head = await queue.oldest(block_ms=10)
        assert head is not None and await queue.settle(head, "200", Shelf.DELIVERED) == 1
        assert len(await queue.replay(Shelf.DEAD, None)) == 1
        assert await queue.backlog(Shelf.DEAD) == Backlog(0, 0)
        assert await client.get(queue.counter(Shelf.DEAD)) == b"0"
    finally:
        await queue.close()
        await client.aclose()


def test_check_config_says_when_no_webhook_the_route_takes_could_be_queued() -> None:
    from plugins.webhook_queue import WebhookQueuePlugin
    from proxy.config import GatewayConfig

    config = GatewayConfig.model_validate(
        {
            "routes": {"payment_webhook": {"max_body_mb": 8}},
            "plugins": {"webhook_queue": {"enabled": True, "max_pending_mb": 4}},
        }
    )
    problems = WebhookQueuePlugin.config_problems(config, 1)
    assert any(
        "max_pending_mb: 4 MB is less than the largest webhook body the route takes (8 MB" in p for p in problems
    )
    config = GatewayConfig.model_validate({"plugins": {"webhook_queue": {"enabled": True, "max_pending_mb": 4}}})
    assert WebhookQueuePlugin.config_problems(config, 1) == []
