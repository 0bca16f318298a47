"""`Observer`: turns what an exchange did into metrics, once per request and a few times per stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.config.model import GatewayConfig
from proxy.core.exchange import Exchange
from proxy.observability import metrics as m
from proxy.observability.metrics import child
from proxy.policy.channels import Channel


@dataclass(slots=True, frozen=True)
class _RouteMetrics:
    """The children every request of a route touches, found with one lookup instead of three."""

    in_flight: Any
    duration: Any
    overhead: Any


_BY_ROUTE: dict[str, _RouteMetrics] = {}


def _route_metrics(route: str) -> _RouteMetrics:
    found = _BY_ROUTE.get(route)
    if found is None:
        found = _BY_ROUTE[route] = _RouteMetrics(
            child(m.IN_FLIGHT, route), child(m.DURATION, route), child(m.OVERHEAD, route)
        )
    return found


class Observer:
    __slots__ = ("enabled", "model_label")

    def __init__(self, config: GatewayConfig) -> None:
        self.enabled = config.observability.metrics.enabled
        self.model_label = m.ModelLabels(config)
        if self.enabled:
            # A refused credential is counted from 0, so an alert on its increase sees the first one
            # (a series that appears at 1 shows Prometheus no increase).
            for channel in config.channels:
                child(m.UPSTREAM_ERRORS, channel.name, m.CREDENTIAL_REFUSED)

    def started(self, ex: Exchange) -> None:
        if self.enabled:
            _route_metrics(ex.route.name).in_flight.inc()

    def finished(self, ex: Exchange, now: float, overhead_s: float) -> None:
        if not self.enabled:
            return
        route = ex.route.name
        per_route = _route_metrics(route)
        per_route.in_flight.dec()
        model = self.model_label(ex.model)
        channel = ex.channel.name if ex.channel is not None else "none"
        child(m.REQUESTS, route, ex.format.name, model, channel, m.status_class(ex.outcome.status)).inc()
        per_route.duration.observe(now - ex.started)
        per_route.overhead.observe(overhead_s)
        outcome = ex.outcome
        if outcome.backoff_s:
            m.BACKOFF_WAIT.observe(outcome.backoff_s)
        if outcome.pool_wait_s:
            m.POOL_WAIT.observe(outcome.pool_wait_s)
        if ex.outcome.upstream_headers_at is not None and ex.outcome.upstream_started is not None:
            child(m.UPSTREAM_TTFB, route, channel).observe(ex.outcome.upstream_headers_at - ex.outcome.upstream_started)
        usage = ex.usage
        if usage.known:
            key = ex.key_name or "anonymous"
            if usage.input_tokens:
                child(m.TOKENS, model, key, "input").inc(usage.input_tokens)
            if usage.output_tokens:
                child(m.TOKENS, model, key, "output").inc(usage.output_tokens)
        if ex.outcome.client_aborted:
            child(m.CLIENT_ABORTS, route, "mid_answer" if ex.outcome.bytes_out else "before_first_byte").inc()

    def stream_opened(self, ex: Exchange) -> None:
        if self.enabled:
            child(m.STREAMS_OPEN, ex.route.name).inc()

    def stream_closed(self, ex: Exchange, events: int, first_byte_at: float | None, now: float) -> None:
        if not self.enabled:
            return
        route = ex.route.name
        child(m.STREAMS_OPEN, route).dec()
        if events:
            child(m.STREAM_EVENTS, route).inc(events)
        if first_byte_at is not None:
            child(m.STREAM_FIRST_EVENT, route).observe(first_byte_at - ex.started)
        child(m.STREAM_DURATION, route).observe(now - ex.started)

    def upstream_result(self, channel: Channel, failure: str | None) -> None:
        """Count a failed attempt by kind (a full pool, the gateway's own limit, apart), and keep
        the up/down gauge from the channel's health, which the forwarder has fed."""
        if not self.enabled:
            return
        if failure == "pool_exhausted":
            child(m.POOL_EXHAUSTED, channel.name).inc()
        elif failure is not None:
            child(m.UPSTREAM_ERRORS, channel.name, failure).inc()
        child(m.CHANNEL_UP, channel.name).set(1 if channel.health.up else 0)

    def retried(self, ex: Exchange, reason: str) -> None:
        if self.enabled:
            child(m.UPSTREAM_RETRIES, ex.route.name, reason).inc()
