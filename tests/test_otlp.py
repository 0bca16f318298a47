"""Span export over OTLP/HTTP in its JSON encoding: the same message the protocol-buffers encoder
builds, posted from the event loop, retried when the collector asks, bounded when it is down."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from prometheus_client import REGISTRY

from proxy.observability.otlp import LoopSpanProcessor, encode
from tests.conftest import free_port

MSG = {"x-api-key": "sk-demo-key", "msgapi-version": "2023-06-01"}
BODY = {"model": "msgmodel-haiku-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}]}


def finished_spans() -> list[ReadableSpan]:
    """Spans with every feature the encoding has: attribute types, events, links, an error,
    a remote parent with trace state, a resource schema and two instrumentation scopes."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "modelgate", "deployment": "test"}, schema_url="https://opentelemetry.io/schemas/1.21.0"
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("modelgate", "1.2.3")
    other = provider.get_tracer("plugins.custom", schema_url="https://example.test/schema")
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "x1")]),
    )
    server = tracer.start_span(
        "POST /v1/messages",
        context=trace.set_span_in_context(NonRecordingSpan(remote)),
        kind=SpanKind.SERVER,
        attributes={
            "http.response.status_code": 200,
            "modelgate.overhead_ms": 0.25,
            "modelgate.client_aborted": False,
            "url.path": "/v1/messages",
            "tags": ("a", "b"),
            "counts": [1, 2, 3],
            "big": 2**62,
        },
    )
    context = trace.set_span_in_context(server)
    child = other.start_span("auth on_request", context=context, links=[Link(remote, {"why": "retry"})])
    child.add_event("key checked", {"key_name": "demo", "cached": True})
    child.set_status(Status(StatusCode.ERROR, "refused"))
    child.end()
    client = tracer.start_span("POST upstream simulator", context=context, kind=SpanKind.CLIENT)
    client.end()
    server.end()
    return list(exporter.get_finished_spans())


def _hex_ids_to_base64(node: object) -> None:
    """OTLP/JSON writes ids in hex; protobuf's JSON mapping reads bytes as base64."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


def test_the_json_encoding_is_the_message_the_protobuf_encoder_builds():
    spans = finished_spans()
    decoded = json.loads(encode(spans))
    _hex_ids_to_base64(decoded)
    ours = json_format.ParseDict(decoded, ExportTraceServiceRequest())
    assert ours == encode_spans(spans)
    assert len(ours.resource_spans) == 1 and len(ours.resource_spans[0].scope_spans) == 2


def test_ids_are_hex_and_64_bit_integers_strings_as_otlp_json_requires():
    scopes = json.loads(encode(finished_spans()))["resourceSpans"][0]["scopeSpans"]
    span = next(span for scope in scopes for span in scope["spans"] if span["kind"] == 2)
    assert span["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert span["parentSpanId"] == "b7ad6b7169203331"
    assert isinstance(span["startTimeUnixNano"], str)
    big = next(a for a in span["attributes"] if a["key"] == "big")
    assert big["value"] == {"intValue": str(2**62)}


@dataclass
class Collector:
    """An OTLP/HTTP receiver that answers with the statuses it is told to, then 200."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    posts: list[tuple[dict[str, str], dict]] = field(default_factory=list)
    reply: bytes = b"{}"
    answering: asyncio.Event = field(default_factory=asyncio.Event)  # cleared: requests stall until set
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def spans(self) -> list[dict]:
        return [
            span
            for _, body in self.posts
            for resource in body["resourceSpans"]
            for scope in resource["scopeSpans"]
            for span in scope["spans"]
        ]


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    found = Collector()
    found.answering.set()

    async def receive(request: web.Request) -> web.Response:
        raw = await request.read()  # aiohttp undoes a Content-Encoding: gzip
        await found.answering.wait()
        status = found.statuses.pop(0) if found.statuses else 200
        if status == 200:
            found.posts.append((dict(request.headers), json.loads(raw)))
            found.arrived.set()
        return web.Response(
            status=status,
            body=found.reply if status == 200 else b"busy",
            content_type="application/json",
            headers={"Retry-After": "0"} if status == 503 else None,
        )

    app = web.Application()
    app.router.add_post("/v1/traces", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    found.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/traces"  # type: ignore[union-attr]
    yield found
    found.answering.set()
    await runner.cleanup()


def exported(outcome: str) -> float:
    return REGISTRY.get_sample_value("modelgate_trace_spans_total", {"outcome": outcome}) or 0.0


async def test_a_traced_request_reaches_the_collector_as_one_trace(start_gateway, http, collector):
    gw = await start_gateway(
        f"observability: {{tracing: {{exporter: otlp, endpoint: '{collector.url}', "
        "headers: {x-collector-key: secret-1}, compression: gzip}}"
    )
    async with http.post(gw.url + "/v1/messages", json=BODY, headers=MSG) as answer:
        assert answer.status == 200
    await asyncio.wait_for(collector.arrived.wait(), 10)  # at most one export interval
    headers, _ = collector.posts[0]
    assert headers["Content-Type"] == "application/json" and headers["Content-Encoding"] == "gzip"
    assert headers["x-collector-key"] == "secret-1"
    spans = collector.spans()
    server = next(s for s in spans if s["kind"] == 2)
    assert server["name"] == "POST /v1/messages"
    assert {s["traceId"] for s in spans} == {server["traceId"]}
    assert {s["name"] for s in spans} >= {"auth on_request", "validation on_request", "POST upstream simulator"}
    upstream = gw.last_upstream_request().header("traceparent")
    assert upstream.split("-")[1] == server["traceId"]


async def test_a_collector_that_asks_to_wait_gets_the_same_batch_again(collector):
    collector.statuses = [503, 503]
    processor = LoopSpanProcessor(collector.url, interval_s=0.05)
    processor.start()
    before = exported("exported")
    for span in finished_spans():
        processor.on_end(span)
    await asyncio.wait_for(collector.arrived.wait(), 10)
    await processor.close()
    assert len(collector.posts) == 1 and len(collector.spans()) == 3
    assert exported("exported") - before == 3


async def test_a_refused_batch_is_counted_and_not_sent_again(collector):
    collector.statuses = [400]
    processor = LoopSpanProcessor(collector.url, interval_s=0.05)
    processor.start()
    before = exported("rejected")
    for span in finished_spans():
        processor.on_end(span)
    await processor.close()
    assert collector.posts == [] and exported("rejected") - before == 3


async def test_a_partial_success_counts_the_spans_the_collector_turned_away(collector):
    collector.reply = b'{"partialSuccess":{"rejectedSpans":"2","errorMessage":"too old"}}'
    processor = LoopSpanProcessor(collector.url, interval_s=60)
    processor.start()
    before = exported("exported"), exported("rejected")
    for span in finished_spans():
        processor.on_end(span)
    await processor.close()  # what is queued goes out on close
    assert (exported("exported") - before[0], exported("rejected") - before[1]) == (1, 2)


async def test_an_oversized_reply_still_counts_the_batch_as_exported(collector):
    collector.reply = b"{" + b" " * (2 * 1024 * 1024) + b"}"
    processor = LoopSpanProcessor(collector.url, interval_s=60)
    processor.start()
    before = exported("exported")
    for span in finished_spans():
        processor.on_end(span)
    await processor.close()
    assert exported("exported") - before == 3


async def test_with_the_collector_down_spans_wait_in_a_bounded_queue():
    processor = LoopSpanProcessor(
        f"http://127.0.0.1:{free_port()}/v1/traces", max_queue=4, batch_size=2, interval_s=60, timeout_s=0.5
    )
    processor.start()
    before = exported("dropped"), exported("failed")
    for _ in range(2):
        for span in finished_spans():
            processor.on_end(span)
    await processor.close(timeout_s=2)
    assert exported("dropped") - before[0] == 2  # 6 ended, 4 kept
    assert exported("failed") - before[1] == 4


async def test_closing_gives_a_stalled_collector_a_bounded_time_and_counts_what_it_lost(collector):
    collector.answering.clear()
    processor = LoopSpanProcessor(collector.url, interval_s=3600)
    processor.start()
    before = exported("failed")
    for span in finished_spans():
        processor.on_end(span)
    await asyncio.wait_for(processor.close(timeout_s=0.3), 5)
    assert exported("failed") - before == 3


async def test_a_full_batch_goes_out_without_waiting_for_the_interval(collector):
    processor = LoopSpanProcessor(collector.url, batch_size=3, interval_s=3600)
    processor.start()
    for span in finished_spans():
        processor.on_end(span)
    await asyncio.wait_for(collector.arrived.wait(), 10)
    assert len(collector.spans()) == 3
    await processor.close()


async def test_requests_are_answered_while_the_collector_is_down(start_gateway, http):
    gw = await start_gateway(
        f"observability: {{tracing: {{exporter: otlp, endpoint: 'http://127.0.0.1:{free_port()}/v1/traces'}}}}"
    )
    for _ in range(3):
        async with http.post(gw.url + "/v1/messages", json=BODY, headers=MSG) as answer:
            assert answer.status == 200
