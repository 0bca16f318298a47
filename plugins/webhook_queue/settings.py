"""`plugins.webhook_queue`: the queue's settings, and the queue and bounds they make."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy.config import GatewayConfig
from proxy.state import connect as topology

if TYPE_CHECKING:
    from plugins.webhook_queue.queue import Bounds, WebhookQueue

MB = 1024 * 1024


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
        int(settings.max_pending_mb * MB),
        settings.keep_delivered,
        int(settings.keep_delivered_mb * MB),
        int(settings.keep_dead_mb * MB),
    )
