"""`SpanExport`: finished spans queued, and handed in batches to where they go, from the event loop.

A request's own spans are queued together when it ends, already in the form the sink sends
(OTLP/JSON bytes: the records are freed at once, and the queue holds nothing the garbage
collector walks); spans third-party code made through the SDK are queued one by one. Every
`interval_s`, or as soon as `batch_size` spans wait, a batch goes to the sink: OTLP/HTTP (JSON or
protobuf) over the gateway's own HTTP client on the loop that made the spans (the SDK's exporter
posts from a thread that takes the GIL from the loop), or an SDK exporter (`console`). Past
`max_queue` waiting spans, or `max_queue_bytes` of encoded ones, new ones are dropped (before
they are encoded) and counted, so a collector that is down costs bounded memory and little CPU.
A batch refused with 429/502/503/504, or not delivered at all, is tried again with a growing
pause, up to `attempts` times.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter

from proxy.observability.metrics import TRACE_SPANS
from proxy.observability.otlp import encode, encode_protobuf, readable, records_json
from proxy.observability.spans import SpanRecord
from proxy.upstream import UpstreamError, UpstreamPool

log = logging.getLogger("modelgate.tracing")

_RETRYABLE = frozenset({429, 502, 503, 504})  # OTLP/HTTP: try these again later; any other refusal is final


@dataclass(slots=True, frozen=True)
class Queued:
    """A request's own spans as its sink prepared them (`payload`), or one SDK span."""

    count: int
    size: int  # bytes, as far as known (an encoded payload's)
    payload: Any
    sdk: bool = False


class Sink(Protocol):
    def prepare(self, own: list[SpanRecord]) -> tuple[Any, int]:
        """What the queue keeps of a request's own spans, and its size in bytes."""

    async def send(self, own: list[Any], sdk: list[ReadableSpan], count: int) -> float | None:
        """Deliver one batch (`own`: prepared payloads; `count` spans in all). None when it is
        settled (delivered, or refused for good); otherwise how long to wait before trying
        again (-1: not said)."""

    async def close(self) -> None: ...


class SpanExport:
    """The queue between the requests that end and the sink their spans go to (see above)."""

    def __init__(
        self,
        sink: Sink,
        *,
        batch_size: int = 512,
        max_queue: int = 8192,
        max_queue_bytes: int = 16 * 1024 * 1024,
        interval_s: float = 1.0,
        attempts: int = 5,
    ) -> None:
        self.sink = sink
        self.batch_size = batch_size
        self.max_queue = max_queue
        self.max_queue_bytes = max_queue_bytes
        self.interval_s = interval_s
        self.attempts = attempts
        self._queue: deque[Queued] = deque()
        self._queued = 0  # spans, not items
        self._queued_bytes = 0
        self._in_flight: list[Queued] = []  # the batch being delivered: queued again if close() cuts it off
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def add(self, spans: list[SpanRecord]) -> None:
        """A request's own spans, as it ends."""
        if self._queued + len(spans) > self.max_queue:  # full: not worth encoding
            TRACE_SPANS.labels("dropped").inc(len(spans))
            return
        payload, size = self.sink.prepare(spans)
        self._put(Queued(len(spans), size, payload))

    def add_sdk(self, span: ReadableSpan) -> None:
        """One span the SDK made (third-party code's), as it ends."""
        self._put(Queued(1, 0, span, sdk=True))

    def _put(self, item: Queued) -> None:
        if self._queued + item.count > self.max_queue or self._queued_bytes + item.size > self.max_queue_bytes:
            TRACE_SPANS.labels("dropped").inc(item.count)
            return
        self._queue.append(item)
        self._queued += item.count
        self._queued_bytes += item.size
        if self._queued >= self.batch_size and self._wake is not None:
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
            for item in reversed(self._in_flight):
                self._queue.appendleft(item)
                self._queued += item.count
                self._queued_bytes += item.size
            self._in_flight = []
        batch: list[Queued] = []
        try:
            async with asyncio.timeout(timeout_s):
                while self._queue:
                    batch = self._take()
                    if await self._send(batch) is not None:
                        TRACE_SPANS.labels("failed").inc(_count(batch))
                    batch = []
        except TimeoutError:
            TRACE_SPANS.labels("failed").inc(_count(batch))
        if self._queue:
            TRACE_SPANS.labels("failed").inc(self._queued)
            self._queue.clear()
            self._queued = self._queued_bytes = 0
        await self.sink.close()

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
                    TRACE_SPANS.labels("failed").inc(_count(batch))
                if self._queued < self.batch_size:
                    break

    def _take(self) -> list[Queued]:
        queue, batch, taken, size = self._queue, [], 0, 0
        while queue and taken < self.batch_size:
            item = queue.popleft()
            batch.append(item)
            taken += item.count
            size += item.size
        self._queued -= taken
        self._queued_bytes -= size
        return batch

    async def _deliver(self, batch: list[Queued]) -> None:
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
        TRACE_SPANS.labels("failed").inc(_count(batch))

    async def _send(self, batch: list[Queued]) -> float | None:
        own = [item.payload for item in batch if not item.sdk]
        sdk = [item.payload for item in batch if item.sdk]
        return await self.sink.send(own, sdk, _count(batch))


def _count(batch: list[Queued]) -> int:
    return sum(item.count for item in batch)


class OtlpHttp:
    """OTLP/HTTP: a batch posted as one ExportTraceServiceRequest, in JSON or protobuf."""

    def __init__(
        self,
        endpoint: str,
        resource: Resource,
        headers: Mapping[str, str] | None = None,
        *,
        protocol: str = "http/json",
        gzip: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        self.endpoint = endpoint
        self.resource = resource
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
        self.protobuf = protocol == "http/protobuf"
        content_type = "application/x-protobuf" if self.protobuf else "application/json"
        self.headers = {"Content-Type": content_type, **(headers or {})}
        if gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.gzip = gzip
        self._reachable = True  # warn once when the collector starts failing, not once a batch

    def prepare(self, own: list[SpanRecord]) -> tuple[Any, int]:
        """JSON: the spans encoded now, once (the records go at once); protobuf: the records,
        converted when their batch is sent (a rough size: about 400 bytes a span)."""
        if self.protobuf:
            return own, 400 * len(own)
        encoded = records_json(own)
        return encoded, len(encoded)

    async def send(self, own: list[Any], sdk: list[ReadableSpan], count: int) -> float | None:
        if self.protobuf:
            body = encode_protobuf(sdk, [record for records in own for record in records], self.resource)
        else:
            body = encode(sdk, own, self.resource)
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
            return min(float(retry_after), 60.0) if retry_after.isascii() and retry_after.isdigit() else -1.0
        if not self._reachable:
            self._reachable = True
            log.info("trace collector reachable again", extra={"endpoint": self.endpoint})
        if answer.status >= 300:
            TRACE_SPANS.labels("rejected").inc(count)
            log.warning(
                "trace collector refused spans",
                extra={"status": answer.status, "spans": count, "reply": reply[:300].decode("utf-8", "replace")},
            )
            return None
        rejected = min(_rejected(reply, self.protobuf), count)  # a collector may say anything
        TRACE_SPANS.labels("exported").inc(count - rejected)
        if rejected:
            TRACE_SPANS.labels("rejected").inc(rejected)
        return None

    async def close(self) -> None:
        await self.pool.close()

    def _failing(self, error: str) -> None:
        if self._reachable:
            self._reachable = False
            log.warning(
                "trace collector failing; spans wait and are tried again",
                extra={"endpoint": self.endpoint, "error": error},
            )


class SdkSink:
    """An SDK exporter (the console's, or one a test passes in) taking batches as ReadableSpans."""

    def __init__(self, exporter: SpanExporter, resource: Resource) -> None:
        self.exporter = exporter
        self.resource = resource

    def prepare(self, own: list[SpanRecord]) -> tuple[Any, int]:
        return own, 400 * len(own)

    async def send(self, own: list[Any], sdk: list[ReadableSpan], count: int) -> float | None:
        self.export_now([record for records in own for record in records], sdk)
        return None

    def export_now(self, own: list[SpanRecord], sdk: list[ReadableSpan]) -> None:
        self.exporter.export([*(readable(record, self.resource) for record in own), *sdk])
        TRACE_SPANS.labels("exported").inc(len(own) + len(sdk))

    async def close(self) -> None:
        self.exporter.shutdown()


def _rejected(reply: bytes, protobuf: bool) -> int:
    """The spans a collector's partial success turned away (0 when it says nothing)."""
    try:
        if protobuf:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

            return max(0, int(ExportTraceServiceResponse.FromString(reply).partial_success.rejected_spans))
        if not reply.startswith(b"{"):
            return 0
        partial = orjson.loads(reply).get("partialSuccess") or {}
        return max(0, int(partial.get("rejectedSpans") or 0))
    except Exception:  # a reply that is not the protocol's says nothing of rejections
        return 0
