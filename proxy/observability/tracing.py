"""OpenTelemetry traces: a server span per request, a child span per plugin hook and per
upstream attempt (a client span whose W3C traceparent goes upstream). An incoming
traceparent is honoured. With the exporter `none` nothing is created at all.

A request the sampler leaves out gets no spans below its server span: creating them, even
unrecorded, cost about half of what tracing costs. Its traceparent (flagged unsampled) still
goes upstream and its trace id into the access line, so the decision and the correlation hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy import __version__
from proxy.config.model import TracingConfig
from proxy.observability.otlp import LoopSpanProcessor

if TYPE_CHECKING:
    from proxy.core.exchange import Exchange

_PROPAGATOR = TraceContextTextMapPropagator()
_OPERATIONS = {
    "messages": "chat",
    "content": "generate_content",
    "responses": "chat",
    "images": "image_generation",
    "video": "video_generation",
    "account": "account",
}


class Tracing:
    """The process's tracer, or nothing when tracing is off."""

    def __init__(self, config: TracingConfig, exporter: SpanExporter | None = None) -> None:
        self.provider: TracerProvider | None = None
        self.tracer: trace.Tracer | None = None
        self.exporting: LoopSpanProcessor | None = None
        if exporter is None and config.exporter == "none":
            return
        provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name, "service.version": __version__}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        )
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        elif config.exporter == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            self.exporting = LoopSpanProcessor(config.endpoint, config.headers, gzip=config.compression == "gzip")
            provider.add_span_processor(self.exporting)
        self.provider = provider
        self.tracer = provider.get_tracer("modelgate", __version__)

    def start(self) -> None:
        """Start exporting from the running loop."""
        if self.exporting is not None:
            self.exporting.start()

    async def close(self) -> None:
        """Send the spans still waiting, then stop."""
        if self.exporting is not None:
            await self.exporting.close()
        if self.provider is not None:
            self.provider.shutdown()

    def start_request(self, ex: Exchange) -> None:
        if self.tracer is None:
            return
        request = ex.request
        parent = _PROPAGATOR.extract(request.headers)
        span = self.tracer.start_span(
            f"{request.method} {ex.route.path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": request.method,
                "http.route": ex.route.path,
                # the template, not the client's path, which may hold anything (a key, say)
                "url.path": ex.route.path,
                "url.scheme": request.scheme,
                "server.address": request.host,
                "client.address": ex.client_ip,
                "gen_ai.operation.name": _OPERATIONS[ex.format.name],
                "modelgate.route": ex.route.name,
                "modelgate.request_id": ex.request_id,
            },
        )
        if span.is_recording():
            ex.tracer, ex.span = self, span
        else:
            ex.unsampled_span = span

    def phase(
        self, ex: Exchange, name: str, kind: str, attributes: dict[str, Any] | None
    ) -> AbstractContextManager[trace.Span]:
        """A traced request's step (proxy/core/phase.py): a child span of its server span."""
        return child_span(ex, name, _KINDS[kind], attributes)


def end_request(ex: Exchange, overhead_s: float) -> None:
    span = ex.span
    if span is None:
        return
    attributes: dict[str, Any] = {
        "http.response.status_code": ex.outcome.status,
        "modelgate.overhead_ms": overhead_s * 1000,
        "modelgate.client_aborted": ex.outcome.client_aborted,
    }
    if ex.outcome.backoff_s:
        attributes["modelgate.backoff_ms"] = ex.outcome.backoff_s * 1000
    if ex.outcome.pool_wait_s:
        attributes["modelgate.pool_wait_ms"] = ex.outcome.pool_wait_s * 1000
    if ex.model is not None:
        attributes["gen_ai.request.model"] = ex.model
    if ex.channel is not None:
        attributes["modelgate.channel"] = ex.channel.name
    if ex.key_name is not None:
        attributes["modelgate.key_name"] = ex.key_name
    if ex.usage.input_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = ex.usage.input_tokens
    if ex.usage.output_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = ex.usage.output_tokens
    span.set_attributes(attributes)
    if ex.outcome.status >= 500 or ex.outcome.error and ex.outcome.status >= 400:
        span.set_status(Status(StatusCode.ERROR if ex.outcome.status >= 500 else StatusCode.UNSET, ex.outcome.error))
    span.end()


_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}


def attempt_traced(ex: Exchange, span: trace.Span | None, channel: str, host: str, path: str, attempt: int) -> None:
    """An upstream attempt's span described, and the W3C traceparent put in what goes upstream:
    the attempt's, or an unsampled request's own (its decision travels on)."""
    if span is None:
        if ex.unsampled_span is not None:
            inject(ex.unsampled_span, ex.headers)
        return
    span.set_attributes(
        {
            "http.request.method": ex.request.method,
            "server.address": host,
            "url.path": path,
            "modelgate.channel": channel,
            "gen_ai.request.model": ex.upstream_model or "",
            "modelgate.attempt": attempt,
        }
    )
    inject(span, ex.headers)


@contextmanager
def child_span(
    ex: Exchange, name: str, kind: SpanKind = SpanKind.INTERNAL, attributes: dict[str, Any] | None = None
) -> Iterator[trace.Span]:
    assert ex.tracer is not None and ex.span is not None
    parent = trace.set_span_in_context(ex.span)
    span = ex.tracer.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
    try:
        yield span
    except asyncio.CancelledError:
        # The client left, or a drain stopped the request: no fault of the step's (an upstream
        # span marked an error here would count every client that hung up against the channel).
        span.set_attribute("modelgate.cancelled", True)
        raise
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()


def inject(span: trace.Span, headers: Any) -> None:
    """Put `span`'s W3C traceparent into the upstream request's headers."""
    _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))


def ids(ex: Exchange) -> tuple[str, str] | None:
    span = ex.span if ex.span is not None else ex.unsampled_span
    if span is None:
        return None
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")
