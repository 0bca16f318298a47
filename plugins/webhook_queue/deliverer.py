"""The deliverer: takes queued webhooks to their backend, oldest first, until each is settled.

A 2xx settles a callback as delivered; a 4xx other than 408 and 429 is the backend's final
word (a bad signature, say) and puts it on the dead shelf; anything else (no channel, a
refused connection, a timeout, a 5xx) keeps it at the head of the queue and is tried again
after a pause that doubles up to `max_backoff_s`. Nothing behind it goes first: order holds.
A crash between the backend's answer and the settling sends that callback again, so
delivery is at least once; backends dedupe by the provider's event id, as they must anyway.
"""

from __future__ import annotations

import asyncio
import logging
import os

from multidict import CIMultiDict

from plugins.webhook_queue.metrics import WEBHOOK_DELIVERIES, WEBHOOK_QUEUE_BYTES, WEBHOOK_QUEUE_DEPTH, WEBHOOK_TRIMMED
from plugins.webhook_queue.queue import QueuedWebhook, RedisError, Shelf, WebhookQueue
from proxy.policy.channels import ChannelSet
from proxy.upstream import PoolExhausted, UpstreamError
from proxy.wire.routes import Route

log = logging.getLogger("modelgate.webhooks")


class Deliverer:
    """One background task per running config; the lease decides which instance delivers."""

    def __init__(
        self,
        queue: WebhookQueue,
        channels: ChannelSet,
        route: Route,
        backoff_s: float,
        max_backoff_s: float,
        lease_s: float,
    ) -> None:
        self.queue = queue
        self.channels = channels
        self.route = route
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.lease_ms = int(lease_s * 1000)
        self.token = os.urandom(12).hex()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="webhook deliverer")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        try:
            await self.queue.release_lease(self.token)
        except (RedisError, OSError):
            pass  # the lease lapses on its own

    async def _run(self) -> None:
        pause = self.backoff_s
        while True:
            try:
                delivered = await self._turn()
            except (RedisError, OSError) as exc:
                log.warning("webhook queue unreachable: %s", exc)
                delivered = False
            except Exception:  # anything else: logged, and tried again; a dead deliverer strands the queue
                log.exception("webhook delivery failed unexpectedly")
                delivered = False
            if delivered:
                pause = self.backoff_s
                continue
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.max_backoff_s)

    async def _turn(self) -> bool:
        """Deliver the oldest callback if this instance holds the lease; False means wait."""
        if not await self.queue.hold_lease(self.token, self.lease_ms):
            WEBHOOK_QUEUE_DEPTH.set(0)  # the gauge is the max over processes: the lease holder's says it
            WEBHOOK_QUEUE_BYTES.set(0)
            return False
        # Read before the callback is: a queue that can be counted but not read (a failed node, a
        # broken stream) still shows its growing backlog, and ModelgateWebhookBacklog fires.
        backlog = await self.queue.backlog()
        WEBHOOK_QUEUE_DEPTH.set(backlog.entries)
        WEBHOOK_QUEUE_BYTES.set(backlog.bytes)
        webhook = await self.queue.oldest(block_ms=min(1000, self.lease_ms // 3))
        if webhook is None:
            return True  # nothing waiting: look again at once, the read itself waited
        outcome, shelf = await self.deliver(webhook)
        if shelf is None:
            WEBHOOK_DELIVERIES.labels("retry").inc()
            log.warning(
                "webhook delivery failed; will retry",
                extra={"webhook_id": webhook.id, "request_id": webhook.request_id, "outcome": outcome},
            )
            return False
        dropped = await self.queue.settle(webhook, outcome, shelf)
        if dropped > 0:  # the shelf's oldest, settled long ago, made room within its bounds
            WEBHOOK_TRIMMED.labels(shelf.value).inc(dropped)
        WEBHOOK_DELIVERIES.labels(shelf.value).inc()
        level = logging.INFO if shelf is Shelf.DELIVERED else logging.ERROR
        log.log(
            level,
            "webhook %s",
            shelf.value,
            extra={
                "webhook_id": webhook.id,
                "request_id": webhook.request_id,
                "target": webhook.target,
                "outcome": outcome,
            },
        )
        return True

    async def deliver(self, webhook: QueuedWebhook) -> tuple[str, Shelf | None]:
        """Send one callback; the shelf it belongs on now, or None to try again later."""
        channel = self.channels.pick(self.route, None)
        if channel is None or channel.pool is None:
            return "no healthy channel serves the webhook", None
        headers = CIMultiDict(webhook.headers)
        if channel.credential:
            self.route.format.place_credential(channel.credential, headers)
        try:
            answer = await channel.pool.request(webhook.method, webhook.target, headers, webhook.body)
            try:
                await answer.read(limit=1024 * 1024)
            finally:
                answer.release()
            status = answer.status
        except (UpstreamError, ValueError) as exc:
            if not isinstance(exc, PoolExhausted):  # a full pool is the gateway's limit, not the backend's fault
                channel.health.record(True)
            return f"{channel.name}: {type(exc).__name__}", None
        channel.health.record(status >= 500)
        if 200 <= status < 300:
            return f"{status} from {channel.name}", Shelf.DELIVERED
        if 400 <= status < 500 and status not in (408, 429):
            return f"{status} from {channel.name}", Shelf.DEAD
        return f"{status} from {channel.name}", None
