"""`Observer`: turns what an exchange did into metrics, once per request and a few times per stream.

What every request touches is tallied in plain numbers and folded into the Prometheus families
when they are read (proxy/observability/tally.py); what few requests touch (a client gone, a
failover's pause, an upstream's failure) goes to the families at once."""

from __future__ import annotations

from proxy.config.model import GatewayConfig
from proxy.core.exchange import Exchange
from proxy.observability import metrics as m
from proxy.observability.metrics import child
from proxy.observability.tally import CounterTally, GaugeTally, HistogramTally
from proxy.policy.channels import Channel

# The request path's metrics, as plain tallies folded into the families when read (tally.py).
_IN_FLIGHT = GaugeTally(m.IN_FLIGHT)
_REQUESTS = CounterTally(m.REQUESTS)
_DURATION = HistogramTally(m.DURATION)
_OVERHEAD = HistogramTally(m.OVERHEAD)
_TTFB = HistogramTally(m.UPSTREAM_TTFB)
_TOKENS = CounterTally(m.TOKENS)
_STREAMS_OPEN = GaugeTally(m.STREAMS_OPEN)
_STREAM_EVENTS = CounterTally(m.STREAM_EVENTS)
_STREAM_FIRST_EVENT = HistogramTally(m.STREAM_FIRST_EVENT)
_STREAM_DURATION = HistogramTally(m.STREAM_DURATION)


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
            _IN_FLIGHT.add((ex.route.name,), 1)

    def finished(self, ex: Exchange, now: float, overhead_s: float) -> None:
        if not self.enabled:
            return
        route = (ex.route.name,)
        _IN_FLIGHT.add(route, -1)
        model = self.model_label(ex.model)
        channel = ex.channel.name if ex.channel is not None else "none"
        outcome = ex.outcome
        upstream_format = ex.upstream_format or "none"
        _REQUESTS.add((route[0], ex.format.name, upstream_format, model, channel, m.status_class(outcome.status)))
        # A traced request's id goes with its latencies as their bucket's exemplar.
        trace = ex.trace
        trace_id = trace.trace_id if trace is not None and ex.span is not None and trace.sampled else None
        _DURATION.observe(route, now - ex.started, trace_id)
        _OVERHEAD.observe(route, overhead_s, trace_id)
        if outcome.backoff_s:
            m.BACKOFF_WAIT.observe(outcome.backoff_s)
        if outcome.pool_wait_s:
            m.POOL_WAIT.observe(outcome.pool_wait_s)
        if outcome.upstream_headers_at is not None and outcome.upstream_started is not None:
            _TTFB.observe((route[0], channel), outcome.upstream_headers_at - outcome.upstream_started, trace_id)
        usage = ex.usage
        if usage.known:
            key = ex.key_name or "anonymous"
            if usage.input_tokens:
                _TOKENS.add((model, key, "input"), usage.input_tokens)
            if usage.output_tokens:
                _TOKENS.add((model, key, "output"), usage.output_tokens)
        if outcome.client_aborted:
            child(m.CLIENT_ABORTS, route[0], "mid_answer" if outcome.bytes_out else "before_first_byte").inc()

    def stream_opened(self, ex: Exchange) -> None:
        if self.enabled:
            _STREAMS_OPEN.add((ex.route.name,), 1)

    def stream_closed(self, ex: Exchange, events: int, first_byte_at: float | None, now: float) -> None:
        if not self.enabled:
            return
        route = (ex.route.name,)
        _STREAMS_OPEN.add(route, -1)
        if events:
            _STREAM_EVENTS.add(route, events)
        if first_byte_at is not None:
            _STREAM_FIRST_EVENT.observe(route, first_byte_at - ex.started)
        _STREAM_DURATION.observe(route, now - ex.started)

    def upstream_result(self, channel: Channel, failure: str | None) -> None:
        """Count a failed attempt by kind (a full pool, the gateway's own limit, apart), and keep
        the up/down gauge from the channel's health, which the forwarder has fed."""
        if not self.enabled:
            return
        if failure == "pool_exhausted":
            child(m.POOL_EXHAUSTED, channel.name).inc()
        elif failure is not None:
            child(m.UPSTREAM_ERRORS, channel.name, failure).inc()
        m.channel_up(channel.name, channel.health.up)

    def retried(self, ex: Exchange, reason: str) -> None:
        if self.enabled:
            child(m.UPSTREAM_RETRIES, ex.route.name, reason).inc()
