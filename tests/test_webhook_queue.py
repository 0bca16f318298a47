"""The durable webhook queue: accepted while the account backend is down, delivered once it is
back, at least once and in order; refused callbacks kept for replay; a 503 whenever the queue
itself cannot keep a callback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from plugins.webhook_queue.queue import Backlog, Shelf, WebhookQueue
from tests.conftest import free_port
from tests.polling import within

SIGNED = {
    "Stripe-Signature": "t=1700000000,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd",
    "Content-Type": "application/json",
}


@dataclass
class Backend:
    """An account backend on a real socket: answers each webhook with the next planned status."""

    port: int
    statuses: list[int] = field(default_factory=list)  # planned answers; 200 once they run out
    received: list[tuple[str, CIMultiDict[str], bytes]] = field(default_factory=list)
    runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def webhook(request: web.Request) -> web.Response:
            self.received.append((request.path_qs, request.headers.copy(), await request.read()))
            return web.json_response({"ok": True}, status=self.statuses.pop(0) if self.statuses else 200)

        app = web.Application(client_max_size=64 * 1024 * 1024)  # what a route may be allowed to take
        app.router.add_post("/api/{provider}/webhook", webhook)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.received) < count:
                await asyncio.sleep(0.02)


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    made = Backend(free_port())
    yield made
    await made.stop()


def queued_config(port: int, redis_url: str, extra: str = "") -> str:
    return f"""
state: {{url: '{redis_url}'}}
channels: [{{name: accounts, base_url: 'http://127.0.0.1:{port}', formats: [account]}}]
resilience: {{breaker_open_s: 0.1}}
plugins:
  webhook_queue: {{enabled: true, prefix: 'test:', backoff_s: 0.05, max_backoff_s: 0.2{extra}}}
"""


@pytest.fixture
async def queue(redis_url: str) -> AsyncIterator[WebhookQueue]:
    made = WebhookQueue(redis_url, "test:")
    yield made
    await made.close()


async def post_webhook(http: aiohttp.ClientSession, url: str, body: bytes, provider: str = "stripe") -> dict:
    async with http.post(f"{url}/api/{provider}/webhook?attempt=1", data=body, headers=SIGNED) as answer:
        assert answer.status == 200, await answer.text()
        return await answer.json()


async def test_webhooks_with_the_backend_down_are_delivered_in_order_once_it_returns(
    start_gateway: Callable, http: aiohttp.ClientSession, backend: Backend, shared_redis: str
) -> None:
    gw = await start_gateway(queued_config(backend.port, shared_redis))
    queue = WebhookQueue(shared_redis, "test:")
    bodies = [json.dumps({"id": f"evt_{n}", "type": "invoice.paid", "amount": n}).encode() + b" \n" for n in range(5)]
    for body in bodies:
        stored = await post_webhook(http, gw.url, body)
        assert stored["queued"] is True and stored["id"]
    await asyncio.sleep(0.3)  # the deliverer has tried, and failed, by now
    assert [w.body for w in await queue.entries(Shelf.PENDING)] == bodies

    backend.statuses = [503, 500]  # back, but flaky at first: the head is tried again, nothing overtakes it
    await backend.start()
    await backend.wait_for(len(bodies) + 2)
    delivered = [body for _, _, body in backend.received]
    assert delivered[2:] == bodies and delivered[:2] == [bodies[0], bodies[0]]
    target, headers, _ = backend.received[-1]
    assert target == "/api/stripe/webhook?attempt=1"
    assert headers["Stripe-Signature"] == SIGNED["Stripe-Signature"] and headers["X-Request-Id"]

    async def all_delivered() -> bool:
        return await queue.depth(Shelf.PENDING) == 0 and await queue.depth(Shelf.DELIVERED) == len(bodies)

    await within(5, all_delivered, "every webhook moved to the delivered shelf")
    await queue.close()


async def test_a_queued_webhook_survives_a_gateway_restart(
    start_gateway: Callable, http: aiohttp.ClientSession, backend: Backend, redis_url: str
) -> None:
    first = await start_gateway(queued_config(backend.port, redis_url))
    await post_webhook(http, first.url, b'{"id":"evt_restart"}')
    await first.runner.cleanup()  # the gateway that accepted it is gone before the backend returns
    await backend.start()
    await start_gateway(queued_config(backend.port, redis_url))
    await backend.wait_for(1)
    assert backend.received[0][2] == b'{"id":"evt_restart"}'


async def test_a_refused_webhook_is_kept_dead_and_replays_with_the_command(
    start_gateway: Callable,
    http: aiohttp.ClientSession,
    backend: Backend,
    redis_url: str,
    queue: WebhookQueue,
    tmp_path: Path,
) -> None:
    backend.statuses = [400]  # the backend's final word: no retry, but nothing dropped
    await backend.start()
    config = queued_config(backend.port, redis_url)
    gw = await start_gateway(config)
    await post_webhook(http, gw.url, b'{"id":"evt_refused"}')
    await post_webhook(http, gw.url, b'{"id":"evt_next"}')
    await backend.wait_for(2)
    await within(5, lambda: queue.depth(Shelf.DEAD), "the refused webhook on the dead shelf")
    dead = await queue.entries(Shelf.DEAD)
    assert [w.body for w in dead] == [b'{"id":"evt_refused"}'] and dead[0].outcome.startswith("400")

    path = tmp_path / "queue.yaml"
    path.write_text(config)
    listed = await run_cli("webhooks", "list", "--shelf", "dead", "--bodies", "-c", str(path))  # -c last works too
    assert json.loads(listed)["body"] == '{"id":"evt_refused"}'
    await run_cli("webhooks", "-c", str(path), "replay", "1-0", expect=1)  # no such entry: said, not silently 0
    await run_cli("webhooks", "-c", str(path), "replay", "--all")
    await backend.wait_for(3)
    assert backend.received[2][2] == b'{"id":"evt_refused"}'
    assert await queue.depth(Shelf.DEAD) == 0


async def run_cli(*args: str, expect: int = 0) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
    )
    out, err = await process.communicate()
    assert process.returncode == expect, err.decode()
    return out.decode()


async def test_with_redis_unreachable_a_queued_webhook_is_a_503_so_the_provider_retries(
    start_gateway: Callable, http: aiohttp.ClientSession, backend: Backend
) -> None:
    await backend.start()
    gw = await start_gateway(queued_config(backend.port, "redis://127.0.0.1:1/0"))
    async with http.post(gw.url + "/api/stripe/webhook", data=b"{}", headers=SIGNED) as answer:
        assert answer.status == 503
        assert (await answer.json())["error"]["code"] == "webhook_queue_unavailable"
    assert backend.received == []


async def test_a_full_queue_is_a_503_and_keeps_what_it_holds(
    start_gateway: Callable, http: aiohttp.ClientSession, backend: Backend, redis_url: str, queue: WebhookQueue
) -> None:
    gw = await start_gateway(queued_config(backend.port, redis_url, ", max_pending: 1"))
    await post_webhook(http, gw.url, b'{"id":"evt_1"}')
    async with http.post(gw.url + "/api/stripe/webhook", data=b'{"id":"evt_2"}', headers=SIGNED) as answer:
        assert answer.status == 503 and answer.headers["Retry-After"]
        assert (await answer.json())["error"]["code"] == "webhook_queue_full"
    assert [w.body for w in await queue.entries(Shelf.PENDING)] == [b'{"id":"evt_1"}']


async def test_the_backlog_gauge_counts_a_queue_that_can_be_counted_but_not_read() -> None:
    """A failed node or a broken stream: the deliverer cannot read the head, but the backlog it
    reports (and ModelgateWebhookBacklog watches) still grows; a process without the lease says 0."""
    from prometheus_client import REGISTRY

    from plugins.webhook_queue.deliverer import Deliverer
    from plugins.webhook_queue.queue import RedisError
    from proxy.wire.routes import ROUTES_BY_NAME

    class Unreadable:
        leased = True

        async def hold_lease(self, token: str, ttl_ms: int) -> bool:
            return self.leased

        async def backlog(self) -> Backlog:
            return Backlog(7, 7000)

        async def oldest(self, block_ms: int) -> None:
            raise RedisError("the node that holds the queue is gone")

    queue = Unreadable()
    deliverer = Deliverer(queue, None, ROUTES_BY_NAME["payment_webhook"], 0.05, 0.1, 1)  # type: ignore[arg-type]
    with pytest.raises(RedisError):
        await deliverer._turn()
    assert REGISTRY.get_sample_value("modelgate_webhook_queue_depth") == 7
    assert REGISTRY.get_sample_value("modelgate_webhook_queue_bytes") == 7000
    queue.leased = False
    assert not await deliverer._turn()
    assert REGISTRY.get_sample_value("modelgate_webhook_queue_depth") == 0
    assert REGISTRY.get_sample_value("modelgate_webhook_queue_bytes") == 0
