"""The webhook queue's metrics, listed from the start whether the queue is on or not (the
deliverer, which feeds some of them, loads only where it is)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

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
