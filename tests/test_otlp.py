"""Span export over OTLP/HTTP in its JSON encoding: the same message the protocol-buffers encoder
builds, posted from the event loop, retried when the collector asks, bounded when it is down."""

from __future__ import annotations

import asyncio
import base64
import json

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

from proxy.observability.export import OtlpHttp, SpanExport
from proxy.observability.otlp import encode, readable, records_json
from proxy.observability.spans import CLIENT, SERVER, RequestTrace, SpanRecord
from tests.conftest import free_port
from tests.otlp_collector import collector  # noqa: F401 (a fixture)

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


def own_records() -> list[SpanRecord]:
    """A request's own spans, with what the gateway writes: a remote parent with trace state,
    every attribute type, an event, a failed step, a client span, a name that needs escaping."""
    request = RequestTrace(0x0AF7651916CD43DD8448EB211C80319C, True, 0xB7AD6B7169203331, "vendor=x1")
    server = SpanRecord(
        request,
        "POST /v1/messages",
        SERVER,
        request.server_id,
        request.parent_id,
        {"http.route": "/v1/messages", "http.response.status_code": 200, "modelgate.overhead_ms": 0.25},
    )
    with server.child("auth on_request") as auth:
        auth.set_attribute("modelgate.client_aborted", False)
        auth.set_attribute("tags", ("a", "b"))
    try:
        with server.child('a "quoted"\nstep \u202e') as failing:
            raise ValueError("refused")
    except ValueError:
        pass
    with server.child("POST upstream simulator", CLIENT, {"modelgate.attempt": 1, "big": 2**62}):
        pass
    server.set_status(StatusCode.ERROR, "upstream failed")
    server.end()
    assert failing.events and failing.status == 2
    return request.finished


def test_the_gateway_s_own_spans_encode_as_the_protobuf_encoder_builds_them():
    resource = Resource.create({"service.name": "modelgate"})
    records = own_records()
    decoded = json.loads(encode([], [records_json(records)], resource))
    _hex_ids_to_base64(decoded)
    ours = json_format.ParseDict(decoded, ExportTraceServiceRequest())
    assert ours == encode_spans([readable(record, resource) for record in records])
    again = json.loads(encode([], [records_json(records)], resource))  # attribute pairs reused from the first encoding
    _hex_ids_to_base64(again)
    assert json_format.ParseDict(again, ExportTraceServiceRequest()) == ours
    spans = ours.resource_spans[0].scope_spans[0].spans
    assert len(spans) == 4 and sum(span.flags & 0x200 != 0 for span in spans) == 1  # only the server's parent is remote


def test_ids_are_hex_and_64_bit_integers_strings_as_otlp_json_requires():
    scopes = json.loads(encode(finished_spans()))["resourceSpans"][0]["scopeSpans"]
    span = next(span for scope in scopes for span in scope["spans"] if span["kind"] == 2)
    assert span["traceId"] == "0af7651916cd43dd8448eb211c80319c"
    assert span["parentSpanId"] == "b7ad6b7169203331"
    assert isinstance(span["startTimeUnixNano"], str)
    big = next(a for a in span["attributes"] if a["key"] == "big")
    assert big["value"] == {"intValue": str(2**62)}


def export_to(url: str, timeout_s: float = 10.0, **queue: float) -> SpanExport:
    """An export's queue posting OTLP/JSON to `url`."""
    return SpanExport(OtlpHttp(url, Resource.create({}), timeout_s=timeout_s), **queue)  # type: ignore[arg-type]


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
    processor = export_to(collector.url, interval_s=0.05)
    processor.start()
    before = exported("exported")
    for span in finished_spans():
        processor.add_sdk(span)
    await asyncio.wait_for(collector.arrived.wait(), 10)
    await processor.close()
    assert len(collector.posts) == 1 and len(collector.spans()) == 3
    assert exported("exported") - before == 3


async def test_a_refused_batch_is_counted_and_not_sent_again(collector):
    collector.statuses = [400]
    processor = export_to(collector.url, interval_s=0.05)
    processor.start()
    before = exported("rejected")
    for span in finished_spans():
        processor.add_sdk(span)
    await processor.close()
    assert collector.posts == [] and exported("rejected") - before == 3


async def test_a_partial_success_counts_the_spans_the_collector_turned_away(collector):
    collector.reply = b'{"partialSuccess":{"rejectedSpans":"2","errorMessage":"too old"}}'
    processor = export_to(collector.url, interval_s=60)
    processor.start()
    before = exported("exported"), exported("rejected")
    for span in finished_spans():
        processor.add_sdk(span)
    await processor.close()  # what is queued goes out on close
    assert (exported("exported") - before[0], exported("rejected") - before[1]) == (1, 2)


async def test_an_oversized_reply_still_counts_the_batch_as_exported(collector):
    collector.reply = b"{" + b" " * (2 * 1024 * 1024) + b"}"
    processor = export_to(collector.url, interval_s=60)
    processor.start()
    before = exported("exported")
    for span in finished_spans():
        processor.add_sdk(span)
    await processor.close()
    assert exported("exported") - before == 3


async def test_with_the_collector_down_spans_wait_in_a_bounded_queue():
    processor = export_to(
        f"http://127.0.0.1:{free_port()}/v1/traces", max_queue=4, batch_size=2, interval_s=60, timeout_s=0.5
    )
    processor.start()
    before = exported("dropped"), exported("failed")
    for _ in range(2):
        for span in finished_spans():
            processor.add_sdk(span)
    await processor.close(timeout_s=2)
    assert exported("dropped") - before[0] == 2  # 6 ended, 4 kept
    assert exported("failed") - before[1] == 4


async def test_closing_gives_a_stalled_collector_a_bounded_time_and_counts_what_it_lost(collector):
    collector.answering.clear()
    processor = export_to(collector.url, interval_s=3600)
    processor.start()
    before = exported("failed")
    for span in finished_spans():
        processor.add_sdk(span)
    await asyncio.wait_for(processor.close(timeout_s=0.3), 5)
    assert exported("failed") - before == 3


async def test_a_full_batch_goes_out_without_waiting_for_the_interval(collector):
    processor = export_to(collector.url, batch_size=3, interval_s=3600)
    processor.start()
    for span in finished_spans():
        processor.add_sdk(span)
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
