"""The durable webhook queue: with `enabled`, a payment webhook is answered once Redis holds it,
and a deliverer takes it to the account backend later, at least once and in order.

Off (the default), a webhook goes straight to its backend and an unreachable backend is a 503,
so the payment provider retries. On, the provider's 2xx means "stored": a backend that is down
delays delivery, nothing more. With Redis unreachable or the queue full (its entries or bytes)
the answer is a 503 again, so the provider keeps the callback. `modelgate webhooks` inspects and
replays the queue. Every shelf is bounded in bytes as well as entries (plugins/webhook_queue/queue.py):
the route needs no key, so what anyone may leave in the shared Redis must be.
Under Sentinel the 2xx also waits for a replica to hold the callback (`replica_acks`), so a
failover right after it loses nothing; too few replicas in time is a 503 as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aiohttp import web

# The metrics are listed (made) as the plugin loads, whether the queue is on or not.
from plugins.webhook_queue.metrics import WEBHOOK_QUEUED, WEBHOOK_REFUSED
from plugins.webhook_queue.settings import MB, QueueSettings, bounds_of, queue_for
from proxy.config import GatewayConfig
from proxy.core import jsonutil
from proxy.core.exchange import Exchange
from proxy.core.plugin import Joins, Plugin, PluginCommand
from proxy.request.body import body_limits
from proxy.state import connect as topology
from proxy.wire.routes import ROUTES_BY_NAME

if TYPE_CHECKING:
    from plugins.webhook_queue.deliverer import Deliverer
    from plugins.webhook_queue.queue import WebhookQueue


class WebhookQueuePlugin(Plugin):
    name = "webhook_queue"
    Settings = QueueSettings
    joins = Joins(routes=frozenset({"payment_webhook"}))  # it does nothing until enabled
    order = 800

    @classmethod
    def commands(cls) -> Sequence[PluginCommand]:
        from plugins.webhook_queue.command import arguments, run_command

        return (PluginCommand("webhooks", "inspect and replay the durable webhook queue", arguments, run_command),)

    @classmethod
    def config_problems(cls, config: GatewayConfig, workers: int) -> list[str]:
        queue = config.plugins.get(cls.name, {})
        if not isinstance(queue, dict):
            return []  # the settings' own check says what is wrong with them
        try:
            cluster = topology.mode_of(queue.get("url") or config.state.url) is topology.Mode.CLUSTER
        except (TypeError, ValueError):
            return []  # ditto: a URL naming no topology
        problems = []
        if cluster and queue.get("replica_acks"):
            problems.append(
                f"plugins.{cls.name}.replica_acks: a Redis Cluster takes 0 only: the wait for replicas "
                "cannot be routed to the shard that holds the queue"
            )
        problems += cls._body_over_bound(config, queue)
        prefix = queue.get("prefix")
        if cluster and isinstance(prefix, str) and ("{" in prefix or "}" in prefix):
            problems.append(
                f"plugins.{cls.name}.prefix: no {{ or }} on a Redis Cluster: the queue's keys share "
                "a hash tag made of it"
            )
        return problems

    @staticmethod
    def _body_over_bound(config: GatewayConfig, queue: dict[str, object]) -> list[str]:
        """A webhook body the route takes but the pending shelf could never hold would be a 503
        for ever: the provider retrying it, and every callback behind it in its own queue, in vain."""
        if not queue.get("enabled"):
            return []
        try:
            settings = QueueSettings.model_validate(queue)
        except ValueError:
            return []  # the settings' own check says what is wrong with them
        body_mb = body_limits(config, ROUTES_BY_NAME["payment_webhook"])[0] / MB
        if body_mb <= settings.max_pending_mb:
            return []
        return [
            f"plugins.webhook_queue.max_pending_mb: {settings.max_pending_mb:g} MB is less than the largest "
            f"webhook body the route takes ({body_mb:g} MB, routes.payment_webhook.max_body_mb): such a "
            "callback could never be queued"
        ]

    def configure(self, config: GatewayConfig) -> None:
        self.config = config
        self.queue: WebhookQueue | None = None
        self.deliverer: Deliverer | None = None

    async def start(self) -> None:
        settings: QueueSettings = self.settings
        if not settings.enabled:
            return
        from plugins.webhook_queue.deliverer import Deliverer

        url, prefix = settings.url or self.config.state.url, settings.prefix or self.config.state.prefix
        slot = f"webhooks.queue:{url}:{prefix}"
        if slot not in self.resources:  # one connection pool per Redis for the gateway's life; a reload keeps it
            self.resources[slot] = queue_for(self.config, settings)
        self.queue = self.resources[slot]
        self.queue.bounds = bounds_of(settings)  # ... and takes the bounds it now says
        assert self.channels is not None
        self.deliverer = Deliverer(
            self.queue,
            self.channels,
            ROUTES_BY_NAME["payment_webhook"],
            settings.backoff_s,
            settings.max_backoff_s,
            settings.lease_s,
        )
        self.deliverer.start()

    async def stop(self) -> None:
        if self.deliverer is not None:
            await self.deliverer.stop()

    async def on_complete(self, ex: Exchange) -> None:
        # Counted here, queue on or off: the 413 is the core's (before any plugin ran), the 429 ratelimit's.
        if ex.route.name != "payment_webhook":
            return
        if ex.outcome.status == 413:
            WEBHOOK_REFUSED.labels("too_large").inc()
        elif ex.outcome.status == 429:
            WEBHOOK_REFUSED.labels("rate_limited").inc()

    async def on_request(self, ex: Exchange) -> web.StreamResponse | None:
        if self.queue is None or ex.route.name != "payment_webhook":
            return None
        from plugins.webhook_queue.queue import QueuedWebhook, QueueFull, QueueUnsafe, RedisError

        assert ex.target is not None
        path, query = ex.target.path(), ex.target.query_string()  # built, never the client's raw target
        webhook = QueuedWebhook(
            method=ex.request.method,
            target=f"{path}?{query}" if query else path,
            headers=list(ex.headers.items()),
            body=ex.body or b"",
            request_id=ex.request_id,
        )
        try:
            entry_id = await self.queue.put(webhook)
        except QueueFull as exc:
            WEBHOOK_QUEUED.labels("full").inc()
            return ex.error_response(
                503,
                f"the webhook queue is full ({exc}); retry later",
                "webhook_queue_full",
                headers={"Retry-After": "60"},
            )
        except QueueUnsafe as exc:
            WEBHOOK_QUEUED.labels("unreplicated").inc()
            return ex.error_response(
                503,
                f"the webhook queue could not confirm the callback ({exc}); retry later",
                "webhook_queue_unavailable",
                headers={"Retry-After": "10"},
            )
        except (RedisError, OSError) as exc:
            WEBHOOK_QUEUED.labels("unavailable").inc()
            return ex.error_response(
                503,
                f"the webhook queue is unreachable ({type(exc).__name__}); retry later",
                "webhook_queue_unavailable",
                headers={"Retry-After": "10"},
            )
        WEBHOOK_QUEUED.labels("stored").inc()
        return web.Response(
            status=self.settings.accept_status,
            content_type="application/json",
            body=jsonutil.dumps({"queued": True, "id": entry_id, "request_id": ex.request_id}),
        )
