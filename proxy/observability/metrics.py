"""Prometheus metrics: what every request, stream, upstream attempt and reload did.

Label values stay bounded: models are counted by name only when the spec or the config
names them (anything else is `other`), channels and keys come from config, validation
rules are schema paths with their indices folded. With PROMETHEUS_MULTIPROC_DIR set
(several worker processes), /metrics aggregates every process through prometheus-client's
multiprocess mode.
"""

from __future__ import annotations

import os
import re
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
)
from prometheus_client.exposition import choose_encoder

from proxy.config.model import GatewayConfig
from proxy.formats.catalogue import SPEC_MODELS
from proxy.observability.tally import Fold, fold

# Set in each worker process to its slot (proxy/process/workers.py sets it, metrics read it).
WORKER_ENV = "MODELGATE_WORKER"

_GLOB = re.compile(r"[*?\[]")
_INDEX = re.compile(r"\[\d+\]")

# Folds the request path's plain tallies (proxy/observability/tally.py) into the families below
# whenever the registry is read: registered before them, so it runs first.
REGISTRY.register(Fold())

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)

REQUESTS = Counter(
    "modelgate_requests",
    "Requests answered, by route, format, the format the upstream was asked in, model, channel and status class",
    ["route", "format", "upstream_format", "model", "channel", "status_class"],
)
DURATION = Histogram(
    "modelgate_request_duration_seconds", "Total time per request, until the last byte", ["route"], buckets=_LATENCY
)
UPSTREAM_TTFB = Histogram(
    "modelgate_upstream_ttfb_seconds",
    "Upstream time to first byte (its headers)",
    ["route", "channel"],
    buckets=_LATENCY,
)
OVERHEAD = Histogram(
    "modelgate_overhead_seconds",
    "The gateway's own time: total minus upstream time, the pauses between attempts and waits for a pool's connection",
    ["route"],
    buckets=_OVERHEAD,
)
# What a request waited that is neither the gateway's work nor an upstream's, once per request
# that waited at all: the pauses between failover attempts (resilience.backoff_s, doubling) and
# waits for a connection a channel's capped pool may open. Its two series exist from the start.
WAITED = Histogram(
    "modelgate_request_wait_seconds",
    "Time a request waited outside the gateway's work and the upstream's: failover backoff, a pool's connection slot",
    ["phase"],
    buckets=_LATENCY,
)
BACKOFF_WAIT = WAITED.labels("failover_backoff")
POOL_WAIT = WAITED.labels("pool_slot")
IN_FLIGHT = Gauge("modelgate_in_flight_requests", "Requests being served", ["route"], multiprocess_mode="livesum")
STREAM_FIRST_EVENT = Histogram(
    "modelgate_stream_first_event_seconds", "Request start to the first streamed byte", ["route"], buckets=_LATENCY
)
STREAM_DURATION = Histogram("modelgate_stream_duration_seconds", "Length of streams", ["route"], buckets=_LATENCY)
STREAM_EVENTS = Counter("modelgate_stream_events", "SSE events relayed", ["route"])
STREAMS_OPEN = Gauge("modelgate_streams_open", "Streams being relayed", ["route"], multiprocess_mode="livesum")
CLIENT_ABORTS = Counter(
    "modelgate_client_aborts", "Clients that went away before their answer ended", ["route", "phase"]
)
TOKENS = Counter("modelgate_tokens", "Tokens the upstream reported", ["model", "key", "direction"])
UPSTREAM_ERRORS = Counter("modelgate_upstream_errors", "Failed upstream attempts", ["channel", "kind"])
# Its kind for an upstream refusing a channel's credential (a 401; a row of the forwarder's
# FAILURES), counted from 0 for every channel; and for one refusing a request alone (a 403).
CREDENTIAL_REFUSED = "status_auth"
REQUEST_FORBIDDEN = "status_forbidden"
POOL_EXHAUSTED = Counter(
    "modelgate_upstream_pool_exhausted",
    "Requests that found every connection a channel's "
    "pool may open (pool.max_connections) busy past the connect timeout",
    ["channel"],
)
UPSTREAM_RETRIES = Counter(
    "modelgate_upstream_retries", "Requests sent again to another channel, by why", ["route", "reason"]
)
CHANNEL_UP = Gauge(
    "modelgate_channel_up",
    "1 while a channel's breaker is closed; 0 while it is open",
    ["channel"],
    multiprocess_mode="liveall",
)
# By the parser's exception class (aiohttp has a dozen): a bounded label. The log shows one line
# per kind per 10 s (proxy/process/log_guard.py); this counts them all.
MALFORMED_REQUESTS = Counter(
    "modelgate_malformed_requests",
    "Requests the HTTP parser refused (answered 400 or 431 in JSON, on either listener), by the parser's exception",
    ["kind"],
)
CONNECTIONS_REFUSED = Counter(
    "modelgate_connections_refused",
    "Client connections closed as they were accepted: past server.max_connections and its headroom",
)
# Admission control (proxy/process/admission.py): what was refused before its body was read, and the bound.
SHED = Counter(
    "modelgate_requests_shed",
    "Requests answered 503 before their body was read: the worker at its "
    "bound on requests in flight (overloaded), or draining past its cut point (server_shutting_down)",
    ["route", "reason"],
)
IN_FLIGHT_LIMIT = Gauge(
    "modelgate_in_flight_limit",
    "The bound on requests in flight (server.max_in_flight), summed over live workers",
    multiprocess_mode="livesum",
)
LOOP_DELAY = Gauge(
    "modelgate_loop_delay_seconds",
    "How late the event loop ran a timer, median over the last "
    "tenth of a second (with max_in_flight auto); the worst live worker's",
    multiprocess_mode="livemax",
)
ADMIN_REQUESTS = Counter(
    "modelgate_admin_requests", "Admin API requests by the caller's role and the answer's status", ["role", "status"]
)
CPU_BUSY = Gauge(
    "modelgate_cpu_busy_ratio",
    "The share of the CPU it may use that a worker's event loop kept busy "
    "over the last tenth of a second (server.max_cpu_busy); the busiest live worker's",
    multiprocess_mode="livemax",
)
TRACE_SPANS = Counter(
    "modelgate_trace_spans",
    "Finished spans by what became of them: exported, rejected by the "
    "collector, dropped (export queue full) or failed (never delivered)",
    ["outcome"],
)
STATE_STORE_UP = Gauge(
    "modelgate_state_store_up",
    "1 while the shared state store answers its probe, 0 while not",
    multiprocess_mode="livemin",
)
PENDING_PINS = Gauge(
    "modelgate_affinity_pending_pins",
    "Ids handed out while the state store was away, kept in this process until it can record them",
    multiprocess_mode="livesum",
)
# The auth plugin's refusals (bad or missing keys) and the core's own of an id followed by a tenant
# that did not make it ("not_owner"): one series, whoever refused.
AUTH_REFUSALS = Counter(
    "modelgate_auth_refusals",
    "Requests refused for who sent them: their key, or an id that is not their tenant's",
    ["route", "reason"],
)
PINS_DROPPED = Counter(
    "modelgate_affinity_pins_dropped",
    "Ids handed out during a state-store outage whose "
    "record was dropped (the local buffer was full): their follow-ups find no channel",
)
# Both describe the gateway, not a worker: a reload is counted once (by the first worker, which
# reloads like every other), and a digest's info is the highest value among live workers (1 while
# any still runs it; 0 once every one has moved on), whatever the number of workers.
CONFIG_RELOADS = Counter("modelgate_config_reloads", "Config reloads by outcome, once per gateway", ["outcome"])
CONFIG_INFO = Gauge(
    "modelgate_config_info",
    "The loaded config, by digest: 1 loaded, 0 replaced",
    ["digest"],
    multiprocess_mode="livemax",
)


class ModelLabels:
    """The model label: a name the spec or the config names, else `other` (bounded cardinality)."""

    __slots__ = ("_known",)

    def __init__(self, config: GatewayConfig) -> None:
        known = set(SPEC_MODELS) | set(config.observability.metrics.models) | set(config.models)
        for channel in config.channels:
            known.update(p for p in channel.models if not _GLOB.search(p))
            known.update(channel.rename)
        self._known = frozenset(known)

    def __call__(self, model: str | None) -> str:
        if model is None:
            return "none"
        return model if model in self._known else "other"


def rule_label(path: str) -> str:
    """A validation rule as a bounded label: the field path without list indices."""
    return _INDEX.sub("[]", path)[:120] or "body"


_CHILDREN: dict[tuple[object, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """The labelled child of a metric, looked up once. prometheus-client's `labels()` takes a lock
    and validates its arguments on every call; label values are bounded (see above), so is this."""
    key = (metric, labels)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN[key] = metric.labels(*labels)
    return found


_CHANNEL_UP: dict[str, bool] = {}


def channel_up(channel: str, up: bool) -> None:
    """`modelgate_channel_up` for a channel, set only when it changes (it is told after every attempt)."""
    if _CHANNEL_UP.get(channel) is not up:
        _CHANNEL_UP[channel] = up
        child(CHANNEL_UP, channel).set(1 if up else 0)


def status_class(status: int) -> str:
    return f"{status // 100}xx" if status else "none"


def set_config_info(digest: str, previous: str | None = None) -> None:
    if previous and previous != digest:
        CONFIG_INFO.labels(previous).set(0)  # (removing a series does not reach the other workers' files)
    CONFIG_INFO.labels(digest).set(1)


def count_reload(outcome: str) -> None:
    """A reload's outcome, counted once per gateway: by its only process, or its first worker."""
    if os.environ.get(WORKER_ENV, "0") == "0":
        CONFIG_RELOADS.labels(outcome).inc()


def exposition(accept: str = "") -> tuple[bytes, str]:
    """The /metrics body: this process's metrics, or every worker's in multiprocess mode; in
    the OpenMetrics format (with the latency histograms' exemplars) when `accept` asks for it,
    as Prometheus does, else in Prometheus's text format."""
    encoder, content_type = choose_encoder(accept)
    if multiprocess_mode():
        fold()  # this worker's latest; the others' are at most a second old
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return encoder(registry), content_type
    return encoder(REGISTRY), content_type


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
