"""OpenTelemetry traces: a server span per request, a child span per working plugin hook, per
upstream attempt (a client span whose W3C traceparent goes upstream) and per stream. An
incoming traceparent is honoured. With the exporter `none` nothing is made at all.

The gateway's own spans are records (proxy/observability/spans.py), not SDK spans: tracing
every request costs a few percent, not twice the request. What stays the SDK's is what is
configuration: the sampler decides each request at its head (`sample_ratio`, or the SDK's
`OTEL_TRACES_SAMPLER` environment), the resource names the service (`OTEL_RESOURCE_ATTRIBUTES`
and `OTEL_SERVICE_NAME` are read as the SDK reads them), an SDK exporter may take the spans
(`console`, or one a test passes in), and spans third-party plugins start through the
OpenTelemetry API are made by an SDK tracer provider and exported with the gateway's.

A request the sampler leaves out is still recorded when the config keeps its kind whatever
the decision (`keep_errors`: an answer 5xx; `keep_slower_than_ms`), and exported if it turns
out so; with neither, it records nothing below its server span. Its traceparent goes upstream
flagged unsampled either way, and its trace id into the access line.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
    _get_from_env_or_default,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy import __version__
from proxy.config.model import TracingConfig
from proxy.observability.export import OtlpHttp, SdkSink, SpanExport
from proxy.observability.spans import CLIENT, ERROR, KINDS, SERVER, OtelParent, RequestTrace, SpanRecord, new_trace_id

if TYPE_CHECKING:
    from proxy.core.exchange import Exchange

log = logging.getLogger("modelgate.tracing")

_PROPAGATOR = TraceContextTextMapPropagator()
_OPERATIONS = {
    "messages": "chat",
    "content": "generate_content",
    "responses": "chat",
    "chat": "chat",
    "images": "image_generation",
    "video": "video_generation",
    "account": "account",
}


# What the exporter, the resource and the provider are made of once, at start: a reload that
# changes them says they take effect at the next restart. The rest a reload retunes (`retune`).
RESTART_ONLY_TRACING = ("exporter", "endpoint", "protocol", "headers", "compression", "service_name", "resource")


class _EveryLine(Getter[Any]):
    """Header lines as W3C trace context reads them: a field sent on several lines is one list
    (`tracestate` may be split so), not its first line alone."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        lines = carrier.getall(key, None)
        return [",".join(lines)] if lines else None

    def keys(self, carrier: Any) -> list[str]:
        return list(carrier.keys())


_EVERY_LINE = _EveryLine()


class Tracing:
    """The process's tracing, or nothing when tracing is off (`enabled` False)."""

    def __init__(self, config: TracingConfig, exporter: SpanExporter | None = None) -> None:
        self.enabled = exporter is not None or config.exporter != "none"
        self.export: SpanExport | None = None
        self.direct: SdkSink | None = None
        self.provider: _Provider | None = None
        self.global_provider = False  # whether the OpenTelemetry API's global provider is this one
        self.sampler: Sampler = ParentBased(TraceIdRatioBased(1.0))
        self._bound: int | None = None
        self.retune(config)
        if not self.enabled:
            return
        self.resource = Resource.create(
            {"service.name": config.service_name, "service.version": __version__, **config.resource}
        )
        # A test's or an embedder's exporter takes each request's spans as it ends; otherwise they
        # are batched from the loop.
        self.direct = SdkSink(exporter, self.resource) if exporter is not None else None
        if exporter is None:
            self.export = SpanExport(
                SdkSink(ConsoleSpanExporter(), self.resource)
                if config.exporter == "console"
                else OtlpHttp(
                    config.endpoint,
                    self.resource,
                    config.headers,
                    protocol=config.protocol,
                    gzip=config.compression == "gzip",
                )
            )
        # Spans third-party code starts through the OpenTelemetry API: the same sampler and
        # resource, exported with the gateway's own.
        self.provider = _Provider(resource=self.resource, sampler=self.sampler)
        self.provider.add_span_processor(_ToExport(self))
        self.global_provider = _offer_global(self.provider)

    def retune(self, config: TracingConfig) -> None:
        """What a reload may change while spans keep flowing: the sampling ratio, the keep rules,
        the viewer's link (the sampler of third-party spans keeps the ratio it started with)."""
        self.keep_errors = config.keep_errors
        self.viewer_url = config.viewer_url
        self.keep_slower_than_s = config.keep_slower_than_ms / 1000 if config.keep_slower_than_ms else None
        if os.environ.get("OTEL_TRACES_SAMPLER"):  # the SDK's own setting, read as the SDK reads it
            self.sampler, self._bound = _get_from_env_or_default(), None
        else:
            root = TraceIdRatioBased(config.sample_ratio)
            self.sampler, self._bound = ParentBased(root), root.bound

    def start(self) -> None:
        """Start exporting from the running loop."""
        if self.export is not None:
            self.export.start()

    async def close(self) -> None:
        """Send the spans still waiting, then stop."""
        if self.export is not None:
            await self.export.close()
        if self.provider is not None:
            self.provider.shutdown()

    def start_request(self, ex: Exchange) -> None:
        if not self.enabled:
            return
        request = ex.request
        parent_id, remote_flags, trace_state, trace_id = 0, None, "", 0
        if "traceparent" in request.headers:
            parent = trace.get_current_span(_PROPAGATOR.extract(request.headers, getter=_EVERY_LINE)).get_span_context()
            if parent.is_valid:
                trace_id, parent_id, remote_flags = parent.trace_id, parent.span_id, parent.trace_flags
                trace_state = parent.trace_state.to_header() if parent.trace_state else ""
        if remote_flags is None:
            trace_id = new_trace_id()
            sampled = self._root_sampled(trace_id)
        else:
            sampled = self._parent_sampled(trace_id, parent_id, remote_flags, trace_state)
        ex.trace = request_trace = RequestTrace(trace_id, sampled, parent_id, trace_state)
        if not (sampled or self.keep_errors or self.keep_slower_than_s is not None):
            # Nothing of it could be exported: nothing recorded. Third-party spans learn its decision.
            if self._bridged():
                request_trace.token = otel_context.attach(trace.set_span_in_context(_unrecorded(request_trace)))
            return
        ex.tracer = self
        ex.span = server = SpanRecord(
            request_trace,
            f"{request.method} {ex.route.path}",
            SERVER,
            request_trace.server_id,
            parent_id,
            attributes={
                "http.request.method": request.method,
                "http.route": ex.route.path,
                # the template, not the client's path, which may hold anything (a key, say)
                "url.path": ex.route.path,
                "url.scheme": request.scheme,
                "server.address": request.host,
                "client.address": ex.client_ip,
                "gen_ai.operation.name": _OPERATIONS.get(ex.format.name, ex.format.name),
                "modelgate.route": ex.route.name,
                "modelgate.request_id": ex.request_id,
            },
        )
        # Spans third-party code starts through the OpenTelemetry API while the request runs are
        # its server span's children (attached once: a context a step cost as much as its span).
        if self._bridged():
            request_trace.token = otel_context.attach(trace.set_span_in_context(OtelParent(server)))

    def _bridged(self) -> bool:
        """Whether a request's context is worth attaching: something may start spans through the
        OpenTelemetry API. Not while nothing has asked this process's provider for a tracer (a
        tracer taken before it was set asks it at its first span, whose parent is then lost); always
        when another provider is the global one."""
        assert self.provider is not None
        return self.provider.asked or not self.global_provider

    def _root_sampled(self, trace_id: int) -> bool:
        """The sampler's word on a trace that starts here. The configured ratio is decided as
        TraceIdRatioBased decides it (the id's low 64 bits under the ratio's bound), without its
        result objects; a sampler from the environment is asked."""
        if self._bound is not None:
            return trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < self._bound
        return self.sampler.should_sample(None, trace_id, "", SERVER).decision is Decision.RECORD_AND_SAMPLE

    def _parent_sampled(self, trace_id: int, parent_id: int, flags: int, state: str) -> bool:
        remote = SpanContext(
            trace_id, parent_id, True, TraceFlags(flags), TraceState.from_header([state]) if state else None
        )
        context = trace.set_span_in_context(NonRecordingSpan(remote))
        return self.sampler.should_sample(context, trace_id, "", SERVER).decision is Decision.RECORD_AND_SAMPLE

    def phase(self, ex: Exchange, name: str, kind: str, attributes: dict[str, Any] | None) -> SpanRecord:
        """A traced request's step (proxy/core/phase.py): a child span of its server span."""
        return ex.span.child(name, KINDS[kind], attributes)

    def end_request(self, ex: Exchange, overhead_s: float, duration_s: float) -> None:
        span: SpanRecord | None = ex.span
        if span is None:
            return
        outcome = ex.outcome
        attributes = span.attributes
        attributes["http.response.status_code"] = outcome.status
        attributes["modelgate.overhead_ms"] = overhead_s * 1000
        attributes["modelgate.client_aborted"] = outcome.client_aborted
        if outcome.backoff_s:
            attributes["modelgate.backoff_ms"] = outcome.backoff_s * 1000
        if outcome.pool_wait_s:
            attributes["modelgate.pool_wait_ms"] = outcome.pool_wait_s * 1000
        if ex.model is not None:
            attributes["gen_ai.request.model"] = ex.model
        if ex.upstream_model is not None and ex.upstream_model != ex.model:
            attributes["gen_ai.response.model"] = ex.upstream_model
        if ex.channel is not None:
            attributes["modelgate.channel"] = ex.channel.name
            attributes["modelgate.upstream_format"] = ex.upstream_format or ""
        if ex.key_name is not None:
            attributes["modelgate.key_name"] = ex.key_name
        usage = ex.usage
        if usage.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        if usage.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        if outcome.response_id:  # ("" when the answer named none)
            attributes["gen_ai.response.id"] = outcome.response_id
        if outcome.status >= 500:
            span.status, span.message = ERROR, (outcome.error or "")[:1000]
        elif outcome.error:  # a refusal: said, and no fault of the gateway's (its status stays unset)
            attributes["modelgate.error"] = outcome.error[:1000]
        span.end()
        request_trace = span.trace
        for record in request_trace.finished:  # an attempt the upstream answered 5xx failed, whatever came after
            if record.kind == CLIENT and record.attributes.get("http.response.status_code", 0) >= 500:
                record.status = ERROR
        # Taken from the trace: its records point at it, and a list of them kept there would make
        # every traced request a cycle left to the garbage collector.
        finished, request_trace.finished = request_trace.finished, []
        if self.kept(ex, duration_s):
            self.hand_over(finished, None)
            if self.viewer_url is not None:
                request_trace.link = self.viewer_url.replace("{trace_id}", f"{request_trace.trace_id:032x}")

    def kept(self, ex: Exchange, duration_s: float) -> bool:
        """Whether a recorded request's spans are exported: sampled at its head, or kept as a 5xx
        (`keep_errors`) or as slow (`keep_slower_than_ms`, `duration_s` its length)."""
        return (
            ex.trace.sampled
            or self.keep_errors
            and ex.outcome.status >= 500
            or self.keep_slower_than_s is not None
            and duration_s >= self.keep_slower_than_s
        )

    def hand_over(self, own: list[SpanRecord], sdk: ReadableSpan | None) -> None:
        """Finished spans to where they go: the export's queue, or a direct exporter now."""
        if self.direct is not None:
            self.direct.export_now(own, [sdk] if sdk is not None else [])
        elif self.export is not None:
            if own:
                self.export.add(own)
            if sdk is not None:
                self.export.add_sdk(sdk)


def end_request(ex: Exchange, overhead_s: float, duration_s: float) -> None:
    """The request's trace ended and handed over. Never raises: a trace that cannot be written
    costs its spans (logged), not the request's access line, which comes after."""
    request_trace = ex.trace
    if request_trace is None:
        return
    try:
        if request_trace.token is not None:
            otel_context.detach(request_trace.token)
        if ex.tracer is not None:
            ex.tracer.end_request(ex, overhead_s, duration_s)
    except Exception:
        log.exception("the request's trace could not be ended", extra={"request_id": ex.request_id})


def _unrecorded(request_trace: RequestTrace) -> trace.Span:
    return NonRecordingSpan(
        SpanContext(request_trace.trace_id, request_trace.server_id, False, TraceFlags(TraceFlags.DEFAULT))
    )


def attempt_traced(ex: Exchange, span: SpanRecord | None, channel: str, host: str, path: str, attempt: int) -> None:
    """An upstream attempt's span described, and the W3C traceparent (and the caller's
    tracestate) put in what goes upstream: the attempt's, or, for a request that records
    nothing, its own server span's ids (its decision travels on)."""
    request_trace = ex.trace
    if request_trace is None:
        return
    if span is None:
        ex.headers["traceparent"] = request_trace.traceparent(request_trace.server_id)
    else:
        attributes = span.attributes
        attributes["http.request.method"] = ex.request.method
        attributes["server.address"] = host
        attributes["url.path"] = path
        attributes["modelgate.channel"] = channel
        translation = ex.translation  # (this attempt's: it has not started yet)
        attributes["modelgate.upstream_format"] = translation.upstream_format if translation else ex.format.name
        attributes["gen_ai.request.model"] = ex.upstream_model or ""
        attributes["modelgate.attempt"] = attempt
        ex.headers["traceparent"] = request_trace.traceparent(span.span_id)
    if request_trace.trace_state:
        ex.headers["tracestate"] = request_trace.trace_state
    else:
        ex.headers.popall("tracestate", None)  # the caller's, when it sent no traceparent to go with


def exported_ids(ex: Exchange, duration_s: float) -> tuple[str, str] | None:
    """The request's ids when its spans will be exported (sampled, or kept as an error or as
    slow, `duration_s` counting as its length): what a record may link to."""
    tracer = ex.tracer  # set only on a request whose spans are recorded (its `trace` with it)
    return ids(ex) if tracer is not None and tracer.kept(ex, duration_s) else None


def ids(ex: Exchange) -> tuple[str, str] | None:
    """The request's trace id and its server span's id, in hex; None when tracing is off."""
    request_trace = ex.trace
    if request_trace is None:
        return None
    return f"{request_trace.trace_id:032x}", f"{request_trace.server_id:016x}"


class _ToExport(SpanProcessor):
    """What third-party code traced through the SDK, sampled, to the gateway's export."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def on_end(self, span: ReadableSpan) -> None:
        if span.context.trace_flags.sampled:
            self.tracing.hand_over([], span)


class _Provider(TracerProvider):
    """The SDK's provider, which notes whether anything has asked it for a tracer."""

    asked = False

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        self.asked = True
        return super().get_tracer(*args, **kwargs)


def _offer_global(provider: TracerProvider) -> bool:
    """The process's global tracer provider, unless someone already set one (the API takes it
    once): third-party plugins calling `trace.get_tracer(...)` get spans the gateway exports."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
        return True
    return trace.get_tracer_provider() is provider
