"""OTLP/HTTP export of finished spans from the event loop, in OTLP's JSON encoding.

The SDK's OTLP exporter builds a protobuf object for every span, attribute and value (about
22 us a span here) and posts each batch with `requests` from a thread that takes the GIL
from the event loop: tracing every request spent 0.24 ms of CPU a request on exporting
alone. OTLP/HTTP receivers take JSON as well as protobuf (the protocol defines both);
orjson writes it in a third of the time, and the batch goes out over the gateway's own
HTTP client on the loop that made the spans.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

from proxy.observability.metrics import TRACE_SPANS
from proxy.upstream import UpstreamError, UpstreamPool

log = logging.getLogger("modelgate.tracing")

_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags: whether the parent's remoteness is known, and is it
_RETRYABLE = frozenset({429, 502, 503, 504})  # OTLP/HTTP: try these again later; any other refusal is final


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """An ExportTraceServiceRequest in OTLP/JSON: ids in hex, 64-bit integers as strings."""
    groups: dict[tuple[int, int], tuple[ReadableSpan, list[dict[str, Any]]]] = {}
    for span in spans:
        key = (id(span.resource), id(span.instrumentation_scope))
        group = groups.get(key)
        if group is None:
            group = groups[key] = (span, [])
        group[1].append(_span(span))
    resources: dict[int, dict[str, Any]] = {}
    for first, encoded in groups.values():
        resource = first.resource
        entry = resources.get(id(resource))
        if entry is None:
            entry = resources[id(resource)] = {
                "resource": {"attributes": _attributes(resource.attributes)},
                "scopeSpans": [],
            }
            if resource.schema_url:
                entry["schemaUrl"] = resource.schema_url
        entry["scopeSpans"].append(_scope_spans(first, encoded))
    return orjson.dumps({"resourceSpans": list(resources.values())})


def _scope_spans(first: ReadableSpan, spans: list[dict[str, Any]]) -> dict[str, Any]:
    scope = first.instrumentation_scope
    if scope is None:
        return {"scope": {}, "spans": spans}
    encoded: dict[str, Any] = {"name": scope.name}
    if scope.version:
        encoded["version"] = scope.version
    if scope.attributes:
        encoded["attributes"] = _attributes(scope.attributes)
    group = {"scope": encoded, "spans": spans}
    if scope.schema_url:
        group["schemaUrl"] = scope.schema_url
    return group


def _span(span: ReadableSpan) -> dict[str, Any]:
    context = span.context
    parent = span.parent
    encoded: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "name": span.name,
        "kind": _KIND[span.kind],
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "flags": _HAS_IS_REMOTE | (_IS_REMOTE if parent is not None and parent.is_remote else 0),
    }
    if context.trace_state:
        encoded["traceState"] = context.trace_state.to_header()
    if parent is not None:
        encoded["parentSpanId"] = f"{parent.span_id:016x}"
    if span.attributes:
        encoded["attributes"] = _attributes(span.attributes)
    if span.events:
        encoded["events"] = [_event(event) for event in span.events]
    if span.links:
        encoded["links"] = [_link(link) for link in span.links]
    status = span.status
    encoded["status"] = (
        {"code": status.status_code.value, "message": status.description}
        if status.description
        else ({"code": status.status_code.value} if status.status_code.value else {})
    )
    for name, count in (
        ("droppedAttributesCount", span.dropped_attributes),
        ("droppedEventsCount", span.dropped_events),
        ("droppedLinksCount", span.dropped_links),
    ):
        if count:
            encoded[name] = count
    return encoded


def _event(event: Any) -> dict[str, Any]:
    encoded: dict[str, Any] = {"timeUnixNano": str(event.timestamp), "name": event.name}
    if event.attributes:
        encoded["attributes"] = _attributes(event.attributes)
    if event.dropped_attributes:
        encoded["droppedAttributesCount"] = event.dropped_attributes
    return encoded


def _link(link: Any) -> dict[str, Any]:
    context = link.context
    encoded: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "flags": _HAS_IS_REMOTE | (_IS_REMOTE if context.is_remote else 0),
    }
    if link.attributes:
        encoded["attributes"] = _attributes(link.attributes)
    if link.dropped_attributes:
        encoded["droppedAttributesCount"] = link.dropped_attributes
    return encoded


def _attributes(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in attributes.items()]


def _value(value: Any) -> dict[str, Any]:
    # bool before int (a bool is an int), str and bytes before Sequence (both are sequences).
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [_value(item) for item in value]}}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": [{"key": str(key), "value": _value(item)} for key, item in value.items()]}}
    return {}


class LoopSpanProcessor(SpanProcessor):
    """Queues finished, sampled spans and posts them in batches from the running loop: every
    `interval_s`, or as soon as `batch_size` are waiting. Past `max_queue` waiting spans new
    ones are dropped (and counted), so a collector that is down costs bounded memory. A batch
    refused with 429/502/503/504, or not delivered at all, is tried again with a growing pause,
    up to `attempts` times."""

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str] | None = None,
        *,
        gzip: bool = False,
        batch_size: int = 512,
        max_queue: int = 8192,
        interval_s: float = 1.0,
        timeout_s: float = 10.0,
        attempts: int = 5,
    ) -> None:
        self.endpoint = endpoint
        parts = urlsplit(endpoint)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.pool = UpstreamPool(
            f"{parts.scheme}://{parts.netloc}",
            max_connections=1,
            keepalive_s=30.0,
            connect_s=timeout_s,
            first_byte_s=timeout_s,
            idle_s=timeout_s,
            total_s=timeout_s,
        )
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        if gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.gzip = gzip
        self.batch_size = batch_size
        self.max_queue = max_queue
        self.interval_s = interval_s
        self.attempts = attempts
        self._queue: deque[ReadableSpan] = deque()
        self._in_flight: list[ReadableSpan] = []  # the batch being delivered: queued again if close() cuts it off
        self._reachable = True  # warn once when the collector starts failing, not once a batch
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        if len(self._queue) >= self.max_queue:
            TRACE_SPANS.labels("dropped").inc()
            return
        self._queue.append(span)
        if len(self._queue) >= self.batch_size and self._wake is not None:
            self._wake.set()

    def start(self) -> None:
        """Start exporting from the running loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop, then send what is still queued: one try each batch, within `timeout_s` in all."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            self._queue.extendleft(reversed(self._in_flight))
        batch: list[ReadableSpan] = []
        try:
            async with asyncio.timeout(timeout_s):
                while self._queue:
                    batch = self._take()
                    if await self._send(batch) is not None:
                        TRACE_SPANS.labels("failed").inc(len(batch))
                    batch = []
        except TimeoutError:
            TRACE_SPANS.labels("failed").inc(len(batch))
        if self._queue:
            TRACE_SPANS.labels("failed").inc(len(self._queue))
            self._queue.clear()
        await self.pool.close()

    def shutdown(self) -> None:
        """The SDK's synchronous hook: nothing to do here, `close()` sends what is left."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if self._wake is not None:
            self._wake.set()
        return True

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            while self._queue:
                batch = self._take()
                try:
                    await self._deliver(batch)
                except Exception:  # a span that cannot be encoded must not stop every later export
                    log.exception("spans could not be exported")
                    self._in_flight = []
                    TRACE_SPANS.labels("failed").inc(len(batch))
                if len(self._queue) < self.batch_size:
                    break

    def _take(self) -> list[ReadableSpan]:
        queue = self._queue
        return [queue.popleft() for _ in range(min(self.batch_size, len(queue)))]

    async def _deliver(self, batch: list[ReadableSpan]) -> None:
        self._in_flight = batch
        pause = 1.0
        for attempt in range(1, self.attempts + 1):
            retry_after = await self._send(batch)
            if retry_after is None:
                self._in_flight = []
                return
            if attempt < self.attempts:
                await asyncio.sleep(pause if retry_after < 0 else retry_after)
                pause = min(pause * 2, 30.0)
        self._in_flight = []
        TRACE_SPANS.labels("failed").inc(len(batch))

    async def _send(self, batch: list[ReadableSpan]) -> float | None:
        """Post one batch. None when it is settled (exported or refused for good); otherwise
        how long the collector asked us to wait before trying again (-1: it did not say)."""
        body = encode(batch)
        if self.gzip:
            body = zlib.compress(body, 1, wbits=31)
        try:
            answer = await self.pool.request("POST", self.target, self.headers, body)
            try:
                reply = await answer.read(limit=1024 * 1024)
            except ValueError:  # a reply this large holds nothing the status does not say
                reply = b""
            finally:
                answer.release()
        except (UpstreamError, TimeoutError, OSError) as exc:
            self._failing(str(exc) or type(exc).__name__)
            return -1.0
        if answer.status in _RETRYABLE:
            self._failing(f"status {answer.status}")
            retry_after = answer.headers.get("Retry-After", "")
            return min(float(retry_after), 60.0) if retry_after.isdigit() else -1.0
        if not self._reachable:
            self._reachable = True
            log.info("trace collector reachable again", extra={"endpoint": self.endpoint})
        if answer.status >= 300:
            TRACE_SPANS.labels("rejected").inc(len(batch))
            log.warning(
                "trace collector refused spans",
                extra={"status": answer.status, "spans": len(batch), "reply": reply[:300].decode("utf-8", "replace")},
            )
            return None
        rejected = _rejected(reply)
        TRACE_SPANS.labels("exported").inc(len(batch) - rejected)
        if rejected:
            TRACE_SPANS.labels("rejected").inc(rejected)
        return None

    def _failing(self, error: str) -> None:
        if self._reachable:
            self._reachable = False
            log.warning(
                "trace collector failing; spans wait and are tried again",
                extra={"endpoint": self.endpoint, "error": error},
            )


def _rejected(reply: bytes) -> int:
    """The spans a collector's partial success turned away (OTLP/JSON; 0 when it says nothing)."""
    if not reply.startswith(b"{"):
        return 0
    try:
        partial = orjson.loads(reply).get("partialSuccess") or {}
        return int(partial.get("rejectedSpans") or 0)
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 0
