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
from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy.config import GatewayConfig
from proxy.plugin import Joins, Plugin, PluginCommand
from proxy.request.body import body_limits
from proxy.request.exchange import Exchange
from proxy.state import connect as topology
from proxy.wire import jsonutil
from proxy.wire.routes import ROUTES_BY_NAME

WEBHOOK_QUEUED = Counter(
    "modelgate_webhooks_queued",
    "Payment webhooks offered to the durable queue, by outcome "
    "(stored, full: its entries or bytes, unreplicated, unavailable)",
    ["outcome"],
)
# Whether the queue is on or not: the route takes anyone's bytes, so its bounds are watched.
WEBHOOK_REFUSED = Counter(
    "modelgate_webhooks_refused",
    "Payment webhooks refused before the queue or the backend "
    "saw them, by reason (too_large: over routes.payment_webhook.max_body_mb, 413; "
    "rate_limited: 429)",
    ["reason"],
)
WEBHOOK_TRIMMED = Counter(
    "modelgate_webhooks_trimmed",
    "Settled webhooks dropped, oldest first, to keep the delivered or dead shelf within its entries and bytes",
    ["shelf"],
)
# Listed from the start (the deliverer, which feeds them, loads only where the queue is on).
WEBHOOK_DELIVERIES = Counter(
    "modelgate_webhook_deliveries",
    "Queued webhook delivery attempts, by result (delivered, dead: refused by the backend, retry)",
    ["result"],
)
WEBHOOK_QUEUE_DEPTH = Gauge(
    "modelgate_webhook_queue_depth", "Webhooks stored and not yet delivered", multiprocess_mode="max"
)
WEBHOOK_QUEUE_BYTES = Gauge(
    "modelgate_webhook_queue_bytes",
    "Bytes the webhooks stored and not yet delivered hold (of max_pending_mb)",
    multiprocess_mode="max",
)
for _reason in ("too_large", "rate_limited"):  # a panel reads each
    WEBHOOK_REFUSED.labels(_reason)
for _shelf in ("delivered", "dead"):
    WEBHOOK_TRIMMED.labels(_shelf)
_MB = 1024 * 1024

if TYPE_CHECKING:
    from plugins.webhook_queue.deliverer import Deliverer
    from plugins.webhook_queue.queue import Bounds, WebhookQueue


class QueueSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    url: str | None = None  # Redis; default: state.url
    prefix: str | None = None  # default: state.prefix
    max_pending: int = Field(default=1_000_000, ge=1)
    # Bytes as stored (bodies, headers, target): past it a callback is a 503 the provider retries.
    max_pending_mb: float = Field(default=64.0, gt=0)
    keep_delivered: int = Field(default=10_000, ge=0)  # recent deliveries kept for replay
    keep_delivered_mb: float = Field(default=16.0, ge=0)  # ... and their bytes: the oldest go past either
    keep_dead_mb: float = Field(default=16.0, ge=0)  # refused callbacks kept for an operator: the oldest go past it
    accept_status: int = Field(default=200, ge=200, le=299)
    backoff_s: float = Field(default=0.5, gt=0)
    max_backoff_s: float = Field(default=30.0, gt=0)
    lease_s: float = Field(default=15.0, ge=1)
    # Replicas that must hold a callback before it is answered as stored: default 1 under
    # Sentinel, 0 on one server. A Cluster takes 0 only (WAIT has no key to route by).
    replica_acks: int | None = Field(default=None, ge=0)
    replica_wait_s: float = Field(default=2.0, gt=0)

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None:
            topology.parse(value)
        return value


def queue_for(config: GatewayConfig, settings: QueueSettings) -> WebhookQueue:
    from plugins.webhook_queue.queue import WebhookQueue  # the Redis client loads only where the queue is on

    return WebhookQueue(
        settings.url or config.state.url,
        settings.prefix or config.state.prefix,
        bounds_of(settings),
        settings.replica_acks,
        settings.replica_wait_s,
    )


def bounds_of(settings: QueueSettings) -> Bounds:
    """What each shelf may hold, in entries and bytes, as the settings say."""
    from plugins.webhook_queue.queue import Bounds

    return Bounds(
        settings.max_pending,
        int(settings.max_pending_mb * _MB),
        settings.keep_delivered,
        int(settings.keep_delivered_mb * _MB),
        int(settings.keep_dead_mb * _MB),
    )


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
        body_mb = body_limits(config, ROUTES_BY_NAME["payment_webhook"])[0] / _MB
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
